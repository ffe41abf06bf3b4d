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
                                 **({"precision": "bf16"} if i == 0 else {})))
    out.append(ev.make_event("run_failed", seq=9, error=failed) if failed else
               ev.make_event("run_finished", seq=9, epoch=1, step=steps))
    return out


def test_a_case_is_summarized_from_its_steady_progress_windows():
    peak = peak_for("NVIDIA H100 80GB HBM3")
    r = smoke.summarize(smoke.CASES[0], _events(), peak, 12, 768)
    assert r.status == "ok" and r.precision == "bf16" and r.steps == 15
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
    assert [c.name for c in a.cases] == ["ddp-eager", "ddp-compiled", "fsdp-eager", "fsdp-compiled",
                                         "ddp-resume"]
    assert a.steps == 12
    planned = dict((c.name, why) for c, why in smoke.plan(a.cases, has_compile=True, cpu=False))
    assert set(planned.values()) == {None}
    without = dict((c.name, why) for c, why in smoke.plan(a.cases, has_compile=False, cpu=False))
    assert without["ddp-compiled"] == without["fsdp-compiled"] == "this entrypoint has no --compile"
    assert without["ddp-eager"] is None and without["ddp-resume"] is None
    cpu = dict((c.name, why) for c, why in smoke.plan(a.cases, has_compile=True, cpu=True))
    assert cpu["fsdp-eager"] == "FSDP needs GPUs"
    alone = smoke.parse_args(["--cases", "ddp-resume"]).cases
    assert smoke.plan(alone, True, False)[0][1] == "needs case ddp-eager"
    for bad in (["--cases", "ddp,nope"], ["--steps", "1"]):
        with pytest.raises(SystemExit) as e:
            smoke.parse_args(bad)
        assert e.value.code == 2


def test_each_case_is_the_entrypoint_with_the_default_job_and_its_own_flags():
    a = smoke.parse_args(["--steps", "8", "--work", "/w"])
    by_name = {c.name: c for c in smoke.CASES}
    argv = smoke.case_argv(by_name["fsdp-compiled"], a, True, "bf16", "/w/runs")
    assert argv[1:3] == ["-m", "training"]
    assert "--fsdp" in argv and argv[argv.index("--compile") + 1] == "on"
    assert argv[argv.index("--max-steps-per-epoch") + 1] == "8"
    assert argv[argv.index("--gpu-per-pod") + 1] == "1" and "--model" not in argv  # the default model
    assert "--compile" not in smoke.case_argv(by_name["ddp-eager"], a, False, "bf16", "/w/runs")
    first = smoke.case_argv(by_name["ddp-eager"], a, True, "bf16", "/w/runs")
    again = smoke.case_argv(by_name["ddp-resume"], a, True, "bf16", "/w/runs")
    assert first[first.index("--name") + 1] == again[again.index("--name") + 1] == "smoke-ddp-eager"
    assert (first[first.index("--epochs") + 1], again[again.index("--epochs") + 1]) == ("1", "2")


def test_every_flag_the_script_passes_exists_in_the_entrypoint():
    from training.args import build_parser

    known = {o for action in build_parser()._actions for o in action.option_strings}
    a = smoke.parse_args(["--cpu"])
    for case in smoke.CASES:
        for cpu in (False, True):
            a.cpu = cpu
            flags = [x for x in smoke.case_argv(case, a, False, "bf16", "/w")[3:] if x.startswith("--")]
            assert set(flags) <= known, set(flags) - known
    assert smoke.has_flag("  [--compile STR] [--fsdp | --no-fsdp]", "--compile")
    assert not smoke.has_flag("  [--compile-cache STR]", "--compile")


def test_the_script_needs_neither_tests_nor_pytest():
    """`pip install ".[train]"` has no tests/ and no pytest: the script imports neither."""
    for module in ("training/gpu_smoke.py", "submitter/contract/flops.py"):
        tree = ast.parse(open(os.path.join(os.path.dirname(smoke.__file__), "..", module)).read())
        names = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {n for n in names if n.split(".")[0] in ("tests", "pytest")}, names
    code = ("import sys; sys.modules['pytest'] = None; sys.modules['tests'] = None; "
            "import training.gpu_smoke as s; s.parse_args([])")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.slow
def test_the_smoke_script_runs_its_cases_on_cpu(storage):
    """The script end to end on CPU: a real entrypoint run, then its resume."""
    proc = subprocess.run([sys.executable, "-m", "training.gpu_smoke", "--cpu", "--steps", "6",
                           "--cases", "ddp-eager,ddp-resume", "--work", str(storage),
                           "--case-timeout", "400", "--extra=--limit-rows=3000"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[-3:]}
    assert rows["ddp-eager"].rstrip().endswith("ok") and rows["ddp-resume"].rstrip().endswith("ok")


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_the_gpu_smoke_run(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "training.gpu_smoke", "--work", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
