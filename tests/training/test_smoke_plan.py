"""The smoke run's plan by card (#24 item 6): every card's plan fits one call's time budget,
the default run's step unless a step would be too slow, what each card drops and why; and the
C-compiler check's message (training.smoke.toolchain)."""

from __future__ import annotations

import pytest

from submitter.contract.flops import PEAK_RULES
from training.smoke import plan as sp
from training.smoke import toolchain

ALL = ("reference", "step", "ddp-compiled", "resume", "ddp2", "fsdp-compiled")
#: (device name as torch says it, memory GiB)
CARDS = [(" ".join(words), 80.0) for words, _ in PEAK_RULES] + [
    ("NVIDIA H100 80GB HBM3", 79.1), ("NVIDIA H200", 139.8), ("Tesla T4", 14.6),
    ("NVIDIA A10G", 22.0), ("NVIDIA L4", 22.0), ("NVIDIA GeForce RTX 4090", 23.6),
    ("NVIDIA B200", 180.0)]


@pytest.mark.parametrize("name, memory", CARDS)
def test_every_cards_plan_fits_one_call(name, memory):
    plan = sp.plan_for_card(name, memory, ALL)
    assert plan.estimate_s <= sp.TOTAL_BUDGET_S
    names = [c.name for c in plan.cases]
    assert names[:2] == ["reference", "step"]  # every ratio is to them: never dropped
    assert names == [n for n in sp.DROP_ORDER if n in names]  # run order
    assert set(names) | {n for n, _ in plan.dropped} == set(ALL)
    assert "resume" not in names or "ddp-compiled" in names
    for c in plan.cases:
        assert c.budget_s >= c.estimate_s and c.budget_s >= sp.MIN_CASE_S
        assert c.steps >= (2 if c.name in sp.IN_PROCESS else sp.MIN_STEPS)
    # one step of the plan's batch stays short on this card
    assert sp.step_seconds("ddp-compiled", plan.tokens_per_step,
                           plan_tflops(name)) <= sp.MAX_STEP_S or plan.accumulation == 2


def plan_tflops(name: str) -> float:
    from submitter.contract.flops import peak_for

    peak = peak_for(name)
    return peak.tflops if peak else sp.UNKNOWN_PEAK_TFLOPS


@pytest.mark.parametrize("name, memory", [("NVIDIA H100 80GB HBM3", 79.1), ("NVIDIA H200", 139.8)])
def test_an_h100_or_h200_runs_every_case_at_the_default_runs_step(name, memory):
    plan = sp.plan_for_card(name, memory, ALL)
    assert [c.name for c in plan.cases] == ["reference", "step", "ddp-compiled", "resume", "ddp2",
                                            "fsdp-compiled"]
    assert plan.dropped == () and plan.notes == ()
    assert (plan.micro, plan.accumulation) == sp.default_batch(memory)
    assert plan.tokens_per_step == 524_288


def test_a_t4_plan_takes_fewer_micro_batches_a_step_and_no_second_process():
    plan = sp.plan_for_card("Tesla T4", 14.6, ALL)
    micro, default_accum = sp.default_batch(14.6)
    assert plan.micro == micro and plan.accumulation < default_accum
    assert plan.tokens_per_step == micro * 256 * plan.accumulation
    assert any("micro-batches a step, not the default run's" in n for n in plan.notes)
    why = dict(plan.dropped)
    assert why["ddp2"].startswith("2 processes need 24 GiB")
    assert plan.estimate_s <= sp.TOTAL_BUDGET_S
    # a larger budget keeps more of the plan
    roomy = sp.plan_for_card("Tesla T4", 14.6, ALL, total_budget_s=30 * 60)
    assert len(roomy.cases) > len(plan.cases) and "ddp2" not in [c.name for c in roomy.cases]


def test_a_tight_budget_shortens_the_steps_before_dropping_cases():
    full = sp.plan_for_card("NVIDIA H100 80GB HBM3", 80.0, ALL, total_budget_s=15 * 60)
    assert full.case("ddp-compiled").steps == sp.DEFAULT_STEPS
    tight = sp.plan_for_card("NVIDIA H100 80GB HBM3", 80.0, ALL, total_budget_s=full.estimate_s - 5)
    assert [c.name for c in tight.cases] == [c.name for c in full.cases]
    assert tight.case("ddp-compiled").steps < full.case("ddp-compiled").steps
    tighter = sp.plan_for_card("NVIDIA H100 80GB HBM3", 80.0, ALL, total_budget_s=240)
    assert [c.name for c in tighter.cases][:2] == ["reference", "step"]
    assert [n for n, _ in tighter.dropped][:1] == ["fsdp-compiled"]  # the end of the order first
    assert tighter.estimate_s <= 240
    # a case dropped on the way that fits after all is taken back (ddp2 after resume went)
    back = sp.plan_for_card("NVIDIA H100 80GB HBM3", 80.0, ALL, total_budget_s=300)
    assert [c.name for c in back.cases] == ["reference", "step", "ddp-compiled", "ddp2"]
    assert [n for n, _ in back.dropped] == ["fsdp-compiled", "resume"] and back.estimate_s <= 300


def test_the_default_batch_is_what_the_default_gpu_run_resolves():
    from submitter.contract.spec import JobSpec

    resolved = JobSpec.build(name="smoke", gpu_per_pod=1, replicas=1)
    micro, accum = sp.default_batch()
    assert micro == resolved.micro_batch_size
    assert micro * accum == resolved.resolved_global_batch_size


def test_the_cpu_plan_gives_every_case_a_share_of_its_budget():
    plan = sp.cpu_plan(["resume", "reference", "ddp-compiled"], total_budget_s=600)
    assert [c.name for c in plan.cases] == ["reference", "ddp-compiled", "resume"]
    assert all(c.budget_s == 200 for c in plan.cases)
    assert plan.tokens_per_step == 2 * 128 * 4


def test_gpt2_small_in_the_plan_is_the_models_size():
    from training.gpt2.model import PRESETS, expected_parameters

    p = PRESETS["gpt2-small"]
    assert sp.GPT2_SMALL == {"params": expected_parameters("gpt2-small", 50257), "n_layer": p.n_layer,
                             "n_embd": p.n_embd, "block": p.block_size}


UBUNTU = {"ID": "ubuntu", "ID_LIKE": "debian"}


@pytest.mark.parametrize("os_release, expected", [
    (UBUNTU, "apt-get install -y gcc python3.12-dev"),
    ({"ID": "debian"}, "apt-get install -y gcc python3.12-dev"),
    ({"ID": "rocky", "ID_LIKE": "rhel centos fedora"}, "dnf install -y gcc python3-devel"),
    ({"ID": "amzn", "ID_LIKE": "centos rhel fedora"}, "dnf install -y gcc python3-devel"),
    ({"ID": "alpine"}, "apk add gcc musl-dev python3-dev"),
    ({"ID": "opensuse-leap", "ID_LIKE": "suse opensuse"}, "zypper install -y gcc python3-devel"),
])
def test_the_missing_compiler_is_named_with_the_package_to_install(os_release, expected):
    line = toolchain.toolchain_problem(None, False, os_release, "3.12")
    assert line.startswith("torch.compile (Triton) needs a C compiler and Python's headers (Python.h)")
    assert line.endswith(expected)


def test_headers_alone_or_nothing_missing():
    assert toolchain.toolchain_problem("/usr/bin/gcc", True, UBUNTU, "3.12") is None
    line = toolchain.toolchain_problem("/usr/bin/gcc", False, UBUNTU, "3.11")
    assert "needs Python's headers (Python.h)," in line and "python3.11-dev" in line
    unknown = toolchain.toolchain_problem(None, True, {}, "3.12")
    assert "needs a C compiler," in unknown and "package manager" in unknown


def test_cc_names_the_compiler(monkeypatch, tmp_path):
    assert toolchain.find_compiler({"CC": "/definitely/not/a/compiler"}) is None
    monkeypatch.setenv("PATH", str(tmp_path))
    assert toolchain.find_compiler({}) is None
    for name in ("cc", "clang"):  # Triton never looks for `cc`
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    assert toolchain.find_compiler({}) == str(tmp_path / "clang")


def test_the_headers_are_looked_for_where_triton_looks():
    import sysconfig

    assert sysconfig.get_paths(scheme="posix_prefix")["include"] in toolchain.include_dirs()
