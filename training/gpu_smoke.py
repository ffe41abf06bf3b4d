"""GPU smoke run: the real entrypoint on one GPU, DDP and FSDP, compile on and off, save -> resume.

    python -m training.gpu_smoke [--steps 12] [--cases ddp-eager,ddp-resume] [--work DIR]

Each case is one `python -m training` run (Ray Train, one worker, gpt2-small, the default
settings but for a few steps per epoch), read from its event lines: tokens/s and
data_wait_fraction are the medians of its progress windows after the first (which holds
start-up and compilation), and MFU is tokens/s x FLOPs per token (submitter.contract.flops) over the
card's dense 16-bit peak (n/a for a card not in submitter.contract.flops.PEAK_RULES). The resume case runs
the ddp-eager job again with one more epoch: it must resume from that run's checkpoint. A
compact table at the end; exit 1 when a case failed.

Needs only what `pip install ".[train]"` (or the image) installs: no tests/, no pytest. With
`--cpu` it runs the same cases on CPU with the tiny model (how the test suite checks it here).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from submitter.contract import events as ev
from submitter.contract.flops import Peak, flops_per_token, mfu, peak_for

TOTAL_BUDGET_S = 8 * 60  # what one short call on a GPU machine allows


@dataclass(frozen=True)
class Case:
    name: str
    fsdp: bool
    compile: str           # "on" | "off" (the entrypoint's --compile)
    resumes: Optional[str] = None  # run the job of this case again, one epoch more

    @property
    def job_name(self) -> str:
        return "smoke-" + (self.resumes or self.name)


CASES = (
    Case("ddp-eager", fsdp=False, compile="off"),
    Case("ddp-compiled", fsdp=False, compile="on"),
    Case("fsdp-eager", fsdp=True, compile="off"),
    Case("fsdp-compiled", fsdp=True, compile="on"),
    Case("ddp-resume", fsdp=False, compile="off", resumes="ddp-eager"),
)


@dataclass
class Result:
    case: Case
    status: str = "not run"        # ok | FAIL | skipped
    reason: str = ""
    precision: Optional[str] = None
    tokens_per_sec: Optional[float] = None
    data_wait_fraction: Optional[float] = None
    mfu: Optional[float] = None
    steps: int = 0
    seconds: float = 0.0
    events: list = field(default_factory=list, repr=False)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m training.gpu_smoke",
                                description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12, help="optimizer steps per epoch [default: 12]")
    p.add_argument("--cases", default=",".join(c.name for c in CASES),
                   help="comma-separated cases [default: all: %(default)s]")
    p.add_argument("--work", default=os.path.expanduser("~/.cache/submitter-gpu-smoke"),
                   help="where the runs' checkpoints go (wiped per case) [default: %(default)s]")
    p.add_argument("--precision", default=None,
                   help="bf16 | fp16 | auto [default: bf16, fp16 on T4/V100]")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the GPU's dense 16-bit peak (default: from its name; unknown: MFU n/a)")
    p.add_argument("--case-timeout", type=float, default=150.0,
                   help="seconds one case may take [default: %(default)s]")
    p.add_argument("--cpu", action="store_true",
                   help="run the cases on CPU with the tiny model (a check of this script)")
    p.add_argument("--extra", action="append", default=[], metavar="ARG",
                   help="one more argument for every run (repeatable), e.g. --extra=--limit-rows=2000")
    a = p.parse_args(argv)
    names = [n for n in a.cases.split(",") if n]
    unknown = [n for n in names if n not in {c.name for c in CASES}]
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(c.name for c in CASES)}")
    if a.steps < 2:
        p.error("--steps must be at least 2 (the first progress window holds start-up)")
    a.cases = [c for c in CASES if c.name in names]
    return a


def plan(cases: Sequence[Case], has_compile: bool, cpu: bool) -> list[tuple[Case, Optional[str]]]:
    """The cases to run, each with the reason it is skipped (None: it runs). A resume case runs
    after the case it resumes, which must be selected too."""
    chosen = {c.name for c in cases}
    out = []
    for c in cases:
        reason = None
        if c.compile == "on" and not has_compile:
            reason = "this entrypoint has no --compile"
        elif c.fsdp and cpu:
            reason = "FSDP needs GPUs"
        elif c.resumes and c.resumes not in chosen:
            reason = f"needs case {c.resumes}"
        out.append((c, reason))
    return out


def case_argv(case: Case, a: argparse.Namespace, has_compile: bool, precision: str,
              storage: str) -> list[str]:
    """`python -m training` flags for a case: the default job but for its length."""
    argv = [sys.executable, "-m", "training", "--name", case.job_name, "--storage-path", storage,
            "--allow-ephemeral-storage", "--replicas", "1", "--dataset", "python-stdlib",
            "--epochs", "2" if case.resumes else "1", "--max-steps-per-epoch", str(a.steps),
            "--progress-every", str(max(1, a.steps // 4)), "--val-steps", "2",
            "--precision", precision]
    if a.cpu:
        argv += ["--model", "tiny", "--tokenizer", "byte", "--gpu-per-pod", "0"]
    else:
        argv += ["--gpu-per-pod", "1"]
    if case.fsdp:
        argv.append("--fsdp")
    if has_compile:
        argv += ["--compile", case.compile]
    return argv + list(a.extra)


def has_flag(help_text: str, flag: str) -> bool:
    """Whether `python -m training --help` lists `flag` (a build without it skips its cases)."""
    return any(word.strip("[],") == flag for word in help_text.split())


def summarize(case: Case, events: list[dict[str, Any]], peak: Optional[Peak],
              n_layer: int, n_embd: int) -> Result:
    """A case's figures from its events (pure: the CPU tests feed it recorded events)."""
    r = Result(case, events=events)
    types = [e["type"] for e in events]
    progress = [e for e in events if e["type"] == "progress"]
    started = next((e for e in events if e["type"] == "run_started"), {})
    r.precision = next((e.get("precision") for e in progress if e.get("precision")), None)
    r.steps = max((e.get("step", 0) for e in progress), default=0)
    steady = progress[1:] or progress
    if steady:
        r.tokens_per_sec = statistics.median(e["tokens_per_sec"] for e in steady)
        r.data_wait_fraction = statistics.median(e.get("data_wait_fraction", 0.0) for e in steady)
    if r.tokens_per_sec and started.get("params") and started.get("block_size"):
        per_token = flops_per_token(started["params"], n_layer, n_embd, started["block_size"])
        r.mfu = mfu(r.tokens_per_sec, per_token, peak.tflops if peak else None)
    failed = next((e for e in events if e["type"] == "run_failed"), None)
    if failed is not None:
        r.status, r.reason = "FAIL", str(failed.get("error", "run_failed"))[:200]
    elif "run_finished" not in types:
        r.status, r.reason = "FAIL", "no run_finished event"
    elif case.resumes and "run_resumed" not in types:
        r.status, r.reason = "FAIL", f"did not resume from {case.job_name}'s checkpoint"
    elif len(progress) < 2:
        r.status, r.reason = "FAIL", "fewer than 2 progress events"
    else:
        r.status = "ok"
    return r


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def format_report(device: str, peak: Optional[Peak], results: Sequence[Result]) -> str:
    """The compact table the script ends with."""
    head = (f"device: {device}; peak: {f'{peak.label} {peak.tflops:g} TFLOP/s dense {peak.dtype}' if peak else 'unknown GPU: MFU n/a'}")
    rows = [("case", "precision", "tokens/s", "MFU", "data wait", "steps", "s", "status")]
    for r in results:
        rows.append((r.case.name, r.precision or "-",
                     f"{r.tokens_per_sec:,.0f}" if r.tokens_per_sec else "-",
                     _pct(r.mfu) if r.tokens_per_sec else "-", _pct(r.data_wait_fraction),
                     str(r.steps), f"{r.seconds:.0f}",
                     r.status + (f": {r.reason}" if r.reason else "")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [head]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))) + "  " + row[-1])
    return "\n".join(lines)


def run_case(argv: list[str], cwd: str, timeout: float) -> tuple[list[dict[str, Any]], str]:
    """Run one entrypoint process; its events, and the tail of what else it printed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace",
                              timeout=timeout)
        out = proc.stdout
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        out += f"\n(timed out after {timeout:.0f} s)"
    events = [e for e in (ev.parse_line(line) for line in out.splitlines()
                          if ev.STDOUT_PREFIX in line) if e is not None]
    tail = "\n".join(line for line in out.splitlines()[-15:] if ev.STDOUT_PREFIX not in line)
    return events, tail


def main(argv: Optional[Sequence[str]] = None) -> int:
    import shutil

    a = parse_args(argv)
    from training.model import PRESETS

    preset = PRESETS["tiny" if a.cpu else "gpt2-small"]
    if a.cpu:
        device, peak = "cpu", None
    else:
        import torch

        if not torch.cuda.is_available():
            print("error: no CUDA GPU here (python -m training.gpu_smoke --cpu checks the script "
                  "itself on CPU)", file=sys.stderr)
            return 2
        device = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
        peak = peak_for(torch.cuda.get_device_name(0))
        if a.peak_tflops:
            peak = Peak("given", a.peak_tflops, peak.dtype if peak else "bf16")
    precision = a.precision or ("fp32" if a.cpu else "fp16" if peak and peak.dtype == "fp16" else "bf16")
    help_text = subprocess.run([sys.executable, "-m", "training", "--help"], capture_output=True,
                               text=True).stdout
    has_compile = has_flag(help_text, "--compile")
    os.makedirs(a.work, exist_ok=True)
    storage = os.path.join(os.path.abspath(a.work), "runs")
    print(f"gpu smoke: {device}; {len(a.cases)} case(s), {a.steps} steps each, precision "
          f"{precision}, --compile {'supported' if has_compile else 'not in this build'}", flush=True)
    results, start = [], time.monotonic()
    for case, skip in plan(a.cases, has_compile, a.cpu):
        if skip:
            results.append(Result(case, status="skipped", reason=skip))
            continue
        if not case.resumes:
            shutil.rmtree(os.path.join(storage, case.job_name), ignore_errors=True)
        left = TOTAL_BUDGET_S - (time.monotonic() - start)
        t0 = time.monotonic()
        events, tail = run_case(case_argv(case, a, has_compile, precision, storage), a.work,
                                min(a.case_timeout, max(left, 30.0)))
        r = summarize(case, events, peak, preset.n_layer, preset.n_embd)
        r.seconds = time.monotonic() - t0
        results.append(r)
        print(f"{r.status:4} {case.name}: {r.tokens_per_sec or 0:,.0f} tokens/s, MFU "
              f"{_pct(r.mfu)}, data wait {_pct(r.data_wait_fraction)}, {r.seconds:.0f} s"
              + (f" ({r.reason})" if r.reason else ""), flush=True)
        if r.status == "FAIL" and tail:
            print("  " + tail.replace("\n", "\n  "), flush=True)
    print(format_report(device, peak, results))
    return 1 if any(r.status == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
