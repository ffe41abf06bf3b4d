"""The GPU check (#18 item 7): the peak table's matcher, and `python -m training.gpu_smoke`'s
CPU path (arguments, case plan, flags, event summary, the report). The GPU run itself is the
`gpu`-marked test at the end; `slow` runs the script's real entrypoint runs on CPU."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from submitter.contract import events as ev
from training import gpu_smoke as smoke
from training.smoke import plan as smoke_plan
from submitter.contract.flops import PEAK_RULES, peak_for


@pytest.mark.parametrize("name, label, tflops", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.0),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", "H100 NVL", 835.0),
    ("NVIDIA H200", "H200 SXM", 989.0),
    ("NVIDIA A100-SXM4-40GB", "A100", 312.0),
    ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
    ("NVIDIA A100 80GB PCIe", "A100", 312.0),
    ("NVIDIA L40S", "L40S", 362.0),
    ("NVIDIA L4", "L4", 121.0),
    ("NVIDIA L40", "L40", 181.0),
    ("NVIDIA A10G", "A10G", 70.0),
    ("NVIDIA A10", "A10", 125.0),
    ("Tesla T4", "T4", 65.0),
    ("Tesla V100-SXM2-16GB", "V100 SXM2", 125.0),
    ("Tesla V100-PCIE-32GB", "V100 PCIe", 112.0),
])
def test_the_peak_table_is_keyed_exactly(name, label, tflops):
    peak = peak_for(name)
    assert peak is not None and (peak.label, peak.tflops) == (label, tflops)
    assert peak.dtype == ("fp16" if "T4" in name or "V100" in name else "bf16")


@pytest.mark.parametrize("name", ["NVIDIA L40", "NVIDIA L40S"])
def test_l4_never_matches_l40_or_l40s(name):
    assert peak_for(name).label != "L4"


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090", "AMD Instinct MI300X", "", "NVIDIA H1000",
                                  "NVIDIA A1000", "Quadro RTX 8000", "NVIDIA B200"])
def test_an_unknown_gpu_has_no_peak_and_its_mfu_is_na(name):
    assert peak_for(name) is None
    case = smoke.CASES[0]
    r = smoke.summarize(case, _events(), None, 12, 768)
    assert r.tokens_per_sec == 100_000 and r.mfu is None
    table = smoke.format_report(name or "?", None, [r])
    row = next(line for line in table.splitlines() if line.startswith(case.name))
    assert " n/a " in row and "unknown GPU: MFU n/a" in table


def test_every_rule_is_reachable():
    """A rule shadowed by a less specific one above it would never match."""
    for i, (words, peak) in enumerate(PEAK_RULES):
        assert peak_for(" ".join(words)) == peak, (words, PEAK_RULES[:i])


def _events(*, resumed: bool = False, failed: str | None = None, steps: int = 20) -> list[dict]:
    out = [ev.make_event("run_started", seq=1, run_name="smoke", num_workers=1, storage_path="/w",
                         params=124_000_000, block_size=256)]
    if resumed:
        out.append(ev.make_event("run_resumed", seq=2, resumed_from="/w/ck", epoch=1, step=steps))
    for i, (step, tok_s, wait) in enumerate([(1, 5_000, 0.5), (5, 90_000, 0.01),
                                             (10, 100_000, 0.02), (15, 110_000, 0.0)]):
        out.append(ev.make_event("progress", seq=3 + i, epoch=1, step=step, loss=5.0,
                                 tokens_per_sec=tok_s, data_wait_fraction=wait, lr=1e-4,
                                 **({"precision": "bf16", "micro_batch_size": 512,
                                    "accumulation_steps": 4} if i == 0 else {})))
    out.append(ev.make_event("run_failed", seq=9, error=failed) if failed else
               ev.make_event("run_finished", seq=9, epoch=1, step=steps))
    return out


def test_a_case_is_summarized_from_its_steady_progress_windows():
    peak = peak_for("NVIDIA H100 80GB HBM3")
    r = smoke.summarize(smoke.CASES[0], _events(), peak, 12, 768)
    assert r.status == "ok" and r.precision == "bf16" and r.steps == 15
    assert (r.micro, r.accumulation) == (512, 4)  # what the worker chose, not the job's estimate
    assert r.tokens_per_sec == 100_000  # the median after the first window (start-up)
    assert r.data_wait_fraction == 0.01
    per_token = 6 * 124_000_000 + 12 * 12 * 768 * 256
    assert r.mfu == pytest.approx(100_000 * per_token / 989e12)


def test_failures_are_named():
    resume = next(c for c in smoke.CASES if c.resumes)
    assert smoke.summarize(resume, _events(), None, 12, 768).reason.startswith("did not resume")
    assert smoke.summarize(resume, _events(resumed=True), None, 12, 768).status == "ok"
    r = smoke.summarize(smoke.CASES[0], _events(failed="CUDA out of memory"), None, 12, 768)
    assert (r.status, r.reason) == ("FAIL", "CUDA out of memory")
    r = smoke.summarize(smoke.CASES[0], _events()[:-1], None, 12, 768)
    assert r.reason == "no run_finished event"


def test_arguments_and_the_case_plan():
    a = smoke.parse_args([])
    assert [c.name for c in a.cases] == ["reference", "step", "ddp-compiled", "resume", "ddp2",
                                         "fsdp-compiled"]
    assert a.steps is None and a.bpe_file is None  # the card's plan; byte-level, no download
    assert smoke.skip_reasons(a.cases, has_compile=True, cpu=False) == {}
    without = smoke.skip_reasons(a.cases, has_compile=False, cpu=False)
    assert set(without) == {"ddp-compiled", "resume", "fsdp-compiled"}  # in-process cases run
    assert set(without.values()) == {"this entrypoint has no --compile"}
    assert smoke.skip_reasons(a.cases, True, cpu=True) == {"fsdp-compiled": "FSDP needs GPUs"}
    no_cc = smoke.skip_reasons(a.cases, True, False, toolchain="needs a C compiler: apt-get ...")
    assert set(no_cc) == {"reference", "step", "ddp-compiled", "resume", "fsdp-compiled"}  # not ddp2 (eager)
    alone = smoke.parse_args(["--cases", "resume"]).cases
    assert smoke.skip_reasons(alone, True, False) == {"resume": "needs case ddp-compiled"}
    for bad in (["--cases", "ddp,nope"], ["--steps", "1"], ["--bpe-file", "/no/such/ranks"]):
        with pytest.raises(SystemExit) as e:
            smoke.parse_args(bad)
        assert e.value.code == 2


def test_each_case_is_the_entrypoint_with_the_default_job_and_its_own_flags(tmp_path):
    ranks = tmp_path / "gpt2.tiktoken"
    ranks.write_text("")
    a = smoke.parse_args(["--work", "/w", "--bpe-file", str(ranks)])
    by_name = smoke.BY_NAME
    argv = smoke.case_argv(by_name["fsdp-compiled"], a, True, "bf16", "/w/runs", 8)
    assert argv[1:3] == ["-m", "training"]
    assert "--fsdp" in argv and argv[argv.index("--compile") + 1] == "on"
    assert argv[argv.index("--max-steps-per-epoch") + 1] == "8"
    assert argv[argv.index("--gpu-per-pod") + 1] == "1" and "--model" not in argv  # the default model
    assert argv[argv.index("--bpe-file") + 1] == str(ranks) and "--tokenizer" not in argv
    first = smoke.case_argv(by_name["ddp-compiled"], a, True, "bf16", "/w/runs", 4)
    again = smoke.case_argv(by_name["resume"], a, True, "bf16", "/w/runs", 4)
    assert first[first.index("--name") + 1] == again[again.index("--name") + 1] == "smoke-ddp-compiled"
    assert (first[first.index("--epochs") + 1], again[again.index("--epochs") + 1]) == ("1", "2")
    assert "--compile" not in smoke.case_argv(by_name["ddp-eager"], a, False, "bf16", "/w/runs", 4)
    assert "--global-batch-size" not in first  # the default run's step
    t4 = smoke_plan.plan_for_card("Tesla T4", 15.0, smoke.DEFAULT_CASES)
    short = smoke.case_argv(by_name["ddp-compiled"], a, True, "fp16", "/w/runs", 4, t4.micro * t4.accumulation)
    assert short[short.index("--global-batch-size") + 1] == str(t4.tokens_per_step // 256)
    byte = smoke.case_argv(by_name["ddp-eager"], smoke.parse_args([]), True, "bf16", "/w", 4)
    assert byte[byte.index("--tokenizer") + 1] == "byte" and "--bpe-file" not in byte  # never a download


def test_the_in_process_cases_take_the_plans_batch_and_the_shared_cache():
    a = smoke.parse_args(["--work", "/w"])
    plan = smoke_plan.plan_for_card("NVIDIA H100 80GB HBM3", 80.0, smoke.DEFAULT_CASES)
    for name in ("reference", "step", "ddp2"):
        argv = smoke.step_argv(smoke.BY_NAME[name], a, plan, 3, "bf16", "/w")
        assert argv[1:5] == ["-m", "training.smoke.step", "--case", name]
        assert argv[argv.index("--micro") + 1] == str(plan.micro)
        assert argv[argv.index("--accum") + 1] == str(plan.accumulation)
        assert argv[argv.index("--compile-cache") + 1] == "/w/shared"
    assert smoke.step_argv(smoke.BY_NAME["ddp2"], a, plan, 3, "bf16", "/w")[
        smoke.step_argv(smoke.BY_NAME["ddp2"], a, plan, 3, "bf16", "/w").index("--compile") + 1] == "off"


def test_an_entrypoint_case_links_the_shared_compile_cache_and_keeps_it(tmp_path):
    storage, work = tmp_path / "runs", tmp_path
    case = smoke.BY_NAME["ddp-compiled"]
    smoke.share_compile_cache(str(storage), case, str(work))
    link = storage / "smoke-ddp-compiled" / ".compile-cache"
    assert link.is_symlink() and link.resolve() == (work / "shared" / ".compile-cache").resolve()
    (link / "entry").write_text("compiled")  # written by inductor through the link
    (storage / "smoke-ddp-compiled" / "checkpoint_x").mkdir()
    smoke.share_compile_cache(str(storage), smoke.BY_NAME["resume"], str(work))  # resume keeps the run
    assert (storage / "smoke-ddp-compiled" / "checkpoint_x").exists()
    smoke.share_compile_cache(str(storage), case, str(work))  # a new run: its directory is wiped ...
    assert not (storage / "smoke-ddp-compiled" / "checkpoint_x").exists()
    assert (work / "shared" / ".compile-cache" / "entry").read_text() == "compiled"  # ... the cache is not


def test_a_case_that_times_out_takes_its_whole_process_group_with_it(tmp_path):
    """A Ray case's processes or ddp2's spawned ranks must not hold the GPU past their case."""
    pid_file = tmp_path / "grandchild"
    script = f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); " \
             f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)"
    out, timed_out = smoke.run_process([sys.executable, "-c", script], str(tmp_path), timeout=3)
    assert timed_out and "started" in out and "(timed out after 3 s)" in out
    grandchild = int(pid_file.read_text())
    import time

    for _ in range(50):  # reaped by init once killed
        if not os.path.exists(f"/proc/{grandchild}") or open(f"/proc/{grandchild}/stat").read().split()[2] == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the case's grandchild {grandchild} outlived its timeout")


def _line(case: str, tokens_per_s: float, peak: float, **kw) -> dict:
    base = {"case": case, "micro": 64, "accum": 32, "world": 1, "tokens_per_step": 524_288,
            "tokens_per_s": tokens_per_s, "params": 123_886_080, "n_layer": 12, "n_embd": 768,
            "block": 256, "precision": "bf16", "compile": True, "peak_mem_gib": peak,
            "parallel": "single"}
    return {**base, **kw}


def test_the_in_process_cases_report_ratios_memory_and_what_ran():
    peak = peak_for("NVIDIA H200")
    ref = smoke.summarize_step(smoke.BY_NAME["reference"], _line("reference", 550_000, 55.7), peak)
    step = smoke.summarize_step(smoke.BY_NAME["step"], _line("step", 462_000, 68.5), peak)
    ddp2 = smoke.summarize_step(smoke.BY_NAME["ddp2"], _line(
        "ddp2", 200_000, 20.0, world=2, parallel="ddp", backend="gloo",
        grad_compression="bf16_compress_hook", compile=False, weights_agree=True), peak)
    assert ref.mfu == pytest.approx(550_000 * (6 * 123_886_080 + 12 * 12 * 768 * 256) / 989e12)
    assert ddp2.parallel == "ddp x2 on one device (gloo, bf16_compress_hook, no_sync)"
    assert step.parallel == "single (compiled)" and (step.micro, step.accumulation) == (64, 32)
    ratios = smoke.ratio_to([ref, step, ddp2], "reference")
    assert ratios == {"reference": 1.0, "step": pytest.approx(0.84, abs=0.001),
                      "ddp2": pytest.approx(0.364, abs=0.001)}
    table = smoke.format_report("NVIDIA H200", peak, [ref, step, ddp2])
    row = next(x for x in table.splitlines() if x.startswith("step "))
    assert "0.84x" in row and "68.5 GiB" in row and "64x32" in row and "462,000" in row
    verdicts = dict((t, v) for t, _, v in smoke.targets([ref, step, ddp2]))
    assert verdicts == {"ddp-compiled >= 0.95x step": "n/a", "step >= 1.0x reference": "below",
                        "step's peak memory <= the reference's": "below"}
    assert "  step >= 1.0x reference: 0.84x  below" in table.splitlines()
    bad = smoke.summarize_step(smoke.BY_NAME["ddp2"], _line("ddp2", 1.0, 1.0, world=2, parallel="ddp",
                                                            weights_agree=False), peak)
    assert (bad.status, bad.reason) == ("FAIL", "the ranks' weights differ after the steps")
    assert smoke.summarize_step(smoke.BY_NAME["step"], None, peak).reason == "no result line"


def test_the_targets_say_ok_when_met():
    fast = smoke.summarize_step(smoke.BY_NAME["step"], _line("step", 600_000, 50.0), None)
    ref = smoke.summarize_step(smoke.BY_NAME["reference"], _line("reference", 550_000, 55.7), None)
    ddp = smoke.summarize(smoke.BY_NAME["ddp-compiled"], _events(), None, 12, 768)
    ddp.tokens_per_sec = 580_000
    assert [v for _, _, v in smoke.targets([ref, fast, ddp])] == ["ok", "ok", "ok"]
    assert smoke.targets([ref, fast, ddp])[0][1] == "0.97x"


def test_every_flag_the_script_passes_exists_in_the_entrypoint():
    from training.args import build_parser

    known = {o for action in build_parser()._actions for o in action.option_strings}
    a = smoke.parse_args(["--cpu"])
    for case in smoke.CASES:
        for cpu in (False, True):
            a.cpu = cpu
            flags = [x for x in smoke.case_argv(case, a, True, "bf16", "/w", 4)[3:] if x.startswith("--")]
            assert set(flags) <= known, set(flags) - known
    assert smoke.has_flag("  [--compile STR] [--fsdp | --no-fsdp]", "--compile")
    assert not smoke.has_flag("  [--compile-cache STR]", "--compile")
    from training.smoke.step import parse_args as step_args

    plan = smoke_plan.cpu_plan(smoke.DEFAULT_CASES)
    for name in ("reference", "step", "ddp2"):
        a.cpu = True
        step_args(smoke.step_argv(smoke.BY_NAME[name], a, plan, 3, "fp32", "/w")[3:])  # parses


def test_the_script_needs_neither_tests_nor_pytest():
    """`pip install ".[train]"` has no tests/ and no pytest: the script imports neither."""
    for module in ("training/gpu_smoke.py", "training/smoke/step.py", "training/smoke/plan.py",
                   "training/smoke/toolchain.py", "training/smoke/reference_gpt.py", "submitter/contract/flops.py"):
        tree = ast.parse(open(os.path.join(os.path.dirname(smoke.__file__), "..", module)).read())
        names = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {n for n in names if n.split(".")[0] in ("tests", "pytest")}, names
    code = ("import sys; sys.modules['pytest'] = None; sys.modules['tests'] = None; "
            "import training.gpu_smoke as s, training.smoke.step as t; s.parse_args([]); "
            "t.parse_args(['--case', 'step', '--micro', '1', '--accum', '1'])")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.slow
def test_the_smoke_script_runs_its_cases_on_cpu(storage):
    """The script end to end on CPU: the reference and the project's step (compiled, tiny
    shapes), a real compiled entrypoint run, then its resume; one compile cache."""
    proc = subprocess.run([sys.executable, "-m", "training.gpu_smoke", "--cpu", "--steps", "3",
                           "--cases", "reference,step,ddp-compiled,resume", "--work", str(storage),
                           "--extra=--limit-rows=3000"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout[proc.stdout.index("device: cpu"):].splitlines()
    rows = {line.split()[0]: line for line in table[3:7]}
    assert list(rows) == ["reference", "step", "ddp-compiled", "resume"]
    assert all(row.rstrip().endswith("ok") for row in rows.values()), table
    assert " 1.00x " in rows["reference"] and " 2x4 " in rows["step"]  # the plan's batch
    assert "single (compiled)" in rows["step"] and "single (compiled)" in rows["ddp-compiled"]
    assert any(line.startswith("  step >= 1.0x reference: ") for line in table)
    assert (storage / "shared" / ".compile-cache").is_dir()
    assert (storage / "runs" / "smoke-ddp-compiled" / ".compile-cache").is_symlink()


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_the_gpu_smoke_run(storage):
    """The card's whole plan (--work off /tmp: the entrypoint refuses ephemeral storage)."""
    proc = subprocess.run([sys.executable, "-m", "training.gpu_smoke", "--work", str(storage)],
                          capture_output=True, text=True, timeout=600)
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_the_shell_wrapper_finds_the_stack_and_hands_its_arguments_over():
    """scripts/gpu-smoke.sh on a machine that has everything: nothing installed, the smoke
    run gets the arguments (here --help)."""
    from tests.conftest import ROOT

    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-smoke.sh"), "--help"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--bpe-file FILE" in proc.stdout and "installing" not in proc.stdout
