"""GPU smoke run: a nanoGPT-style reference step, the project's own step, then the real
entrypoint on one GPU (DDP, FSDP2, 2-process DDP, save -> resume), in one call of <= 8 minutes.

    python -m training.gpu_smoke [--bpe-file FILE] [--work DIR] [--cases reference,step,...]

The cases, in run order (training.smoke.plan sizes them by the card and drops from the end
what does not fit; `--cases` picks):
- `reference`: the nanoGPT-style GPT-2 step (training.smoke.reference_gpt: whole-model compile,
  plain cross-entropy, fused AdamW), no Ray (training.smoke.step);
- `step`: the project's model, loss, optimizer, precision and compile, no Ray, no data;
- `ddp-compiled`: `python -m training` with the defaults, one worker, `--compile on`;
- `resume`: the ddp-compiled job again with one more epoch: it must resume from its checkpoint;
- `ddp2`: the `step` as 2 DDP processes on the one device (gloo carries the gradients; the
  run's bf16 compression hook and no-sync accumulation run on the GPU);
- `fsdp-compiled`: the entrypoint with `--fsdp --compile on`;
- `ddp-eager`, `fsdp-eager` (not by default): the entrypoint with `--compile off`.
`reference` and `step` take the micro-batch and micro-batches a step that the default run
resolves on this card (training.smoke.plan.default_batch); the entrypoint's cases resolve
their own (the table says what each took). The entrypoint's cases read their figures from
their event lines: tokens/s and data wait are the medians of the progress windows after the
first (which holds start-up and compilation). MFU: tokens/s x FLOPs per token over the card's
dense 16-bit peak (`case_mfu`; n/a for a card not in submitter.contract.flops.PEAK_RULES).

Offline: the entrypoint's cases tokenize with `--bpe-file` (GPT-2's BPE from a tiktoken
ranks file), else byte-level; nothing is downloaded. Compiled cases share one inductor cache
under `--work` (`.compile-cache`, kept between cases and calls); before the first of them the
script checks for a C compiler and Python's headers (training.smoke.toolchain) and names the package
when they are missing. A compact table at the end, then the targets (ok/below); exit 1 when a
case failed.

Needs only what `pip install ".[train]"` (or the image) installs: no tests/, no pytest. With
`--cpu` it runs the same plan on CPU with the tiny model (how the test suite checks it here).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from submitter.contract import events as ev
from submitter.contract.flops import Peak, flops_per_token, mfu, peak_for
from training.smoke import plan as smoke_plan
from training.smoke.step import RESULT_PREFIX

TOTAL_BUDGET_S = smoke_plan.TOTAL_BUDGET_S  # what one short call on a GPU machine allows
#: The shared compile cache: `<work>/<SHARED>/.compile-cache` (training.gpt2.compiling's layout).
SHARED = "shared"


@dataclass(frozen=True)
class Case:
    name: str
    in_process: bool = False       # training.smoke.step, no Ray; else `python -m training`
    fsdp: bool = False
    compile: str = "on"            # "on" | "off"
    resumes: Optional[str] = None  # run the job of this case again, one epoch more

    @property
    def job_name(self) -> str:
        return "smoke-" + (self.resumes or self.name)


CASES = (
    Case("reference", in_process=True),
    Case("step", in_process=True),
    Case("ddp-compiled"),
    Case("resume", resumes="ddp-compiled"),
    Case("ddp2", in_process=True, compile="off"),
    Case("fsdp-compiled", fsdp=True),
    Case("ddp-eager", compile="off"),
    Case("fsdp-eager", fsdp=True, compile="off"),
)
DEFAULT_CASES = ("reference", "step", "ddp-compiled", "resume", "ddp2", "fsdp-compiled")
BY_NAME = {c.name: c for c in CASES}


@dataclass
class Result:
    case: Case
    status: str = "not run"        # ok | FAIL | skipped
    reason: str = ""
    precision: Optional[str] = None
    parallel: Optional[str] = None
    micro: Optional[int] = None
    accumulation: Optional[int] = None
    tokens_per_sec: Optional[float] = None
    data_wait_fraction: Optional[float] = None
    mfu: Optional[float] = None
    peak_mem_gib: Optional[float] = None
    steps: int = 0
    seconds: float = 0.0
    events: list = field(default_factory=list, repr=False)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m training.gpu_smoke",
                                description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(DEFAULT_CASES),
                   help=f"comma-separated cases, run in the plan's order [default: %(default)s; "
                        f"also: {', '.join(c.name for c in CASES if c.name not in DEFAULT_CASES)}]")
    p.add_argument("--steps", type=int, default=None,
                   help="steps per case (default: the card's plan, training.smoke.plan)")
    p.add_argument("--bpe-file", default=None, metavar="FILE",
                   help="GPT-2 BPE ranks (tiktoken format) for the entrypoint's cases: no "
                        "download (default: byte-level tokens)")
    p.add_argument("--work", default=os.path.expanduser("~/.cache/submitter-gpu-smoke"),
                   help="runs (wiped per case) and the shared compile cache (kept) [default: %(default)s]")
    p.add_argument("--precision", default=None,
                   help="bf16 | fp16 | auto [default: bf16, fp16 on T4/V100]")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the GPU's dense 16-bit peak (default: from its name; unknown: MFU n/a)")
    p.add_argument("--budget", type=float, default=None,
                   help=f"seconds the whole plan may take [default: {TOTAL_BUDGET_S}; --cpu: "
                        f"{smoke_plan.CPU_TOTAL_BUDGET_S}]")
    p.add_argument("--cpu", action="store_true",
                   help="run the plan on CPU with the tiny model (a check of this script)")
    p.add_argument("--extra", action="append", default=[], metavar="ARG",
                   help="one more argument for every entrypoint run (repeatable), e.g. --extra=--limit-rows=2000")
    a = p.parse_args(argv)
    names = [n for n in a.cases.split(",") if n]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(BY_NAME)}")
    if a.steps is not None and a.steps < 2:
        p.error("--steps must be at least 2 (the first progress window holds start-up)")
    if a.bpe_file and not os.path.isfile(a.bpe_file):
        p.error(f"--bpe-file {a.bpe_file}: no such file (GPT-2's ranks in tiktoken format, "
                "e.g. gpt2.tiktoken)")
    a.bpe_file = os.path.abspath(a.bpe_file) if a.bpe_file else None
    a.cases = [c for c in CASES if c.name in names]
    return a


def skip_reasons(cases: Sequence[Case], has_compile: bool, cpu: bool,
                 toolchain: Optional[str] = None) -> dict[str, str]:
    """Why a case is not run (absent: it runs). A resume case needs the case it resumes;
    a compiled case needs the compiler's toolchain (`toolchain`: what is missing)."""
    chosen = {c.name for c in cases}
    out = {}
    for c in cases:
        if c.compile == "on" and toolchain:
            out[c.name] = toolchain
        elif c.compile == "on" and not c.in_process and not has_compile:
            out[c.name] = "this entrypoint has no --compile"
        elif c.fsdp and cpu:
            out[c.name] = "FSDP needs GPUs"
        elif c.resumes and c.resumes not in chosen:
            out[c.name] = f"needs case {c.resumes}"
    return out


def case_argv(case: Case, a: argparse.Namespace, has_compile: bool, precision: str,
              storage: str, steps: int, global_batch: Optional[int] = None) -> list[str]:
    """`python -m training` flags for a case: the default job but for its length (and its
    step's size where the card's plan takes fewer micro-batches a step: `global_batch`)."""
    argv = [sys.executable, "-m", "training", "--name", case.job_name, "--storage-path", storage,
            "--allow-ephemeral-storage", "--replicas", "1", "--dataset", "python-stdlib",
            "--epochs", "2" if case.resumes else "1", "--max-steps-per-epoch", str(steps),
            "--progress-every", str(max(1, steps // 4)), "--val-steps", "2",
            "--precision", precision]
    argv += ["--bpe-file", a.bpe_file] if a.bpe_file else ["--tokenizer", "byte"]
    if a.cpu:
        argv += ["--model", "tiny", "--gpu-per-pod", "0"]
    else:
        argv += ["--gpu-per-pod", "1"]
    if global_batch:
        argv += ["--global-batch-size", str(global_batch)]
    if case.fsdp:
        argv.append("--fsdp")
    if has_compile:
        argv += ["--compile", case.compile]
    return argv + list(a.extra)


def step_argv(case: Case, a: argparse.Namespace, plan: smoke_plan.SmokePlan, steps: int,
              precision: str, work: str) -> list[str]:
    """`python -m training.smoke.step` for an in-process case, at the plan's batch."""
    argv = [sys.executable, "-m", "training.smoke.step", "--case", case.name,
            "--micro", str(plan.micro), "--accum", str(plan.accumulation), "--steps", str(steps),
            "--warmup", "1", "--compile", case.compile, "--precision", precision,
            "--compile-cache", os.path.join(work, SHARED)]
    return argv + (["--cpu"] if a.cpu else [])


def has_flag(help_text: str, flag: str) -> bool:
    """Whether `python -m training --help` lists `flag` (a build without it skips its cases)."""
    return any(word.strip("[],") == flag for word in help_text.split())


def case_mfu(tokens_per_sec: float, params: int, n_layer: int, n_embd: int, block: int,
             peak: Optional[Peak]) -> Optional[float]:
    """The one place the smoke run computes MFU (submitter.contract.flops' count)."""
    return mfu(tokens_per_sec, flops_per_token(params, n_layer, n_embd, block),
               peak.tflops if peak else None)


def summarize(case: Case, events: list[dict[str, Any]], peak: Optional[Peak],
              n_layer: int, n_embd: int) -> Result:
    """An entrypoint case's figures from its events (pure: the CPU tests feed it recorded events)."""
    r = Result(case, events=events)
    types = [e["type"] for e in events]
    progress = [e for e in events if e["type"] == "progress"]
    started = next((e for e in events if e["type"] == "run_started"), {})
    first = next((e for e in progress if e.get("precision")), {})
    r.precision = first.get("precision")
    r.parallel = _parallel_words(first)
    # the micro-batch the worker chose on its device (run_started has the job's estimate)
    r.micro = first.get("micro_batch_size") or started.get("batch_size_per_worker")
    r.accumulation = first.get("accumulation_steps") or started.get("accumulation_steps")
    r.steps = max((e.get("step", 0) for e in progress), default=0)
    steady = progress[1:] or progress
    if steady:
        r.tokens_per_sec = statistics.median(e["tokens_per_sec"] for e in steady)
        r.data_wait_fraction = statistics.median(e.get("data_wait_fraction", 0.0) for e in steady)
    if r.tokens_per_sec and started.get("params") and started.get("block_size"):
        r.mfu = case_mfu(r.tokens_per_sec, started["params"], n_layer, n_embd,
                         started["block_size"], peak)
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


def _parallel_words(facts: dict[str, Any]) -> Optional[str]:
    """What the workers really ran (training.gpt2.parallel's facts on the first progress event)."""
    mode = facts.get("parallel")
    if not mode:
        return None
    extras = [w for w in (facts.get("grad_compression"), "compiled" if facts.get("compile") else None) if w]
    return mode + (f" ({', '.join(extras)})" if extras else "")


def summarize_step(case: Case, line: Optional[dict[str, Any]], peak: Optional[Peak]) -> Result:
    """An in-process case's figures from its SMOKE_RESULT line (pure)."""
    r = Result(case)
    if line is None:
        r.status, r.reason = "FAIL", "no result line"
        return r
    r.precision, r.micro, r.accumulation = line["precision"], line["micro"], line["accum"]
    r.tokens_per_sec, r.peak_mem_gib = line["tokens_per_s"], line["peak_mem_gib"]
    r.parallel = in_process_words(line)
    r.steps = line.get("steps", 0)
    r.mfu = case_mfu(r.tokens_per_sec, line["params"], line["n_layer"], line["n_embd"],
                     line["block"], peak)
    if line.get("weights_agree") is False:
        r.status, r.reason = "FAIL", "the ranks' weights differ after the steps"
    else:
        r.status = "ok"
    return r


def in_process_words(line: dict[str, Any]) -> str:
    """What an in-process case ran, e.g. "ddp x2 on one device (gloo, bf16_compress_hook,
    no_sync)" or "single (compiled)"."""
    extras = [line.get("backend"), line.get("grad_compression"),
              "no_sync" if line["parallel"] == "ddp" and line["accum"] > line["world"] else None,
              "compiled" if line.get("compile") else None]
    words = [w for w in extras if w]
    head = f"ddp x{line['world']} on one device" if line["parallel"] == "ddp" else line["parallel"]
    return head + (f" ({', '.join(words)})" if words else "")


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def ratio_to(results: Sequence[Result], base: str) -> dict[str, Optional[float]]:
    """Each case's tokens/s over `base`'s (None where either is missing)."""
    ref = next((r.tokens_per_sec for r in results if r.case.name == base and r.status == "ok"), None)
    return {r.case.name: (r.tokens_per_sec / ref if ref and r.tokens_per_sec else None) for r in results}


#: The targets (issue 28): (label, case, compared with, what, at least).
TARGETS = (("ddp-compiled >= 0.95x step", "ddp-compiled", "step", "speed", 0.95),
           ("step >= 1.0x reference", "step", "reference", "speed", 1.0),
           ("step's peak memory <= the reference's", "step", "reference", "memory", 1.0))


def targets(results: Sequence[Result]) -> list[tuple[str, str, str]]:
    """(target, measured, ok | below | n/a) for each of TARGETS."""
    by = {r.case.name: r for r in results if r.status == "ok"}
    out = []
    for label, case, other, what, bound in TARGETS:
        a, b = by.get(case), by.get(other)
        if what == "speed":
            x = a.tokens_per_sec / b.tokens_per_sec if a and b and a.tokens_per_sec and b.tokens_per_sec else None
            measured = "-" if x is None else f"{x:.2f}x"
            verdict = "n/a" if x is None else "ok" if x >= bound else "below"
        else:
            m, n = (a.peak_mem_gib if a else None), (b.peak_mem_gib if b else None)
            measured = "-" if m is None or n is None else f"{m:.1f} vs {n:.1f} GiB"
            verdict = "n/a" if m is None or n is None else "ok" if m <= n * bound else "below"
        out.append((label, measured, verdict))
    return out


def format_report(device: str, peak: Optional[Peak], results: Sequence[Result],
                  plan: Optional[smoke_plan.SmokePlan] = None) -> str:
    """The compact table the script ends with, then the targets."""
    head = (f"device: {device}; peak: {f'{peak.label} {peak.tflops:g} TFLOP/s dense {peak.dtype}' if peak else 'unknown GPU: MFU n/a'}")
    lines = [head + ("; peak mem: the process's peak RSS" if device == "cpu" else "")]
    if plan is not None:
        lines.append(f"plan: {plan.micro} x {plan.accumulation} micro-batches a step "
                     f"({plan.tokens_per_step:,} tokens) for reference/step/ddp2; estimate "
                     f"{plan.estimate_s:.0f} s of {plan.total_budget_s:.0f} s"
                     + "".join(f"; {n}" for n in plan.notes))
    ratios = ratio_to(results, "reference")
    rows = [("case", "parallel", "precision", "batch", "tokens/s", "vs ref", "MFU", "peak mem",
             "data wait", "steps", "s", "status")]
    for r in results:
        ran = r.status == "ok" or r.tokens_per_sec
        rows.append((r.case.name, r.parallel or "-", r.precision or "-",
                     f"{r.micro}x{r.accumulation}" if r.micro and r.accumulation else "-",
                     f"{r.tokens_per_sec:,.0f}" if r.tokens_per_sec else "-",
                     f"{ratios[r.case.name]:.2f}x" if ratios.get(r.case.name) else "-",
                     _pct(r.mfu) if ran and r.tokens_per_sec else "-",
                     f"{r.peak_mem_gib:.1f} GiB" if r.peak_mem_gib is not None else "-",
                     _pct(r.data_wait_fraction) if r.data_wait_fraction is not None else "-",
                     str(r.steps), f"{r.seconds:.0f}",
                     r.status + (f": {r.reason}" if r.reason else "")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))) + "  " + row[-1])
    lines.append("targets:")
    for label, measured, verdict in targets(results):
        lines.append(f"  {label}: {measured}  {verdict}")
    return "\n".join(lines)


def run_process(argv: list[str], cwd: str, timeout: float,
                env: Optional[dict[str, str]] = None) -> tuple[str, bool]:
    """Run one process in a session of its own; what it printed, and whether it timed out.
    On a timeout the whole session goes (SIGTERM, then SIGKILL): a case's Ray processes or
    spawned ranks must not keep the GPU's memory from the next case."""
    import signal

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return out, False
    except subprocess.TimeoutExpired:
        out = ""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                out, _ = proc.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        return (out or "") + f"\n(timed out after {timeout:.0f} s)", True


def run_case(argv: list[str], cwd: str, timeout: float) -> tuple[list[dict[str, Any]], str]:
    """Run one entrypoint process; its events, and the tail of what else it printed."""
    out, _ = run_process(argv, cwd, timeout)
    events = [e for e in (ev.parse_line(line) for line in out.splitlines()
                          if ev.STDOUT_PREFIX in line) if e is not None]
    return events, _tail(out, ev.STDOUT_PREFIX)


def run_step_case(argv: list[str], cwd: str, timeout: float) -> tuple[Optional[dict[str, Any]], str, bool]:
    """Run one in-process case; its result line (None if none), the tail of its output, and
    whether it timed out."""
    out, timed_out = run_process(argv, cwd, timeout)
    line = next((json.loads(x.split(RESULT_PREFIX, 1)[1]) for x in out.splitlines()
                 if x.startswith(RESULT_PREFIX)), None)
    return line, _tail(out, RESULT_PREFIX), timed_out


def _tail(out: str, skip: str) -> str:
    return "\n".join(line for line in out.splitlines()[-15:] if skip not in line)


def share_compile_cache(storage: str, case: Case, work: str) -> None:
    """A new run directory for an entrypoint case whose compile cache is the shared one
    (training.gpt2.compiling puts it at `<run dir>/.compile-cache`: a link to `<work>/shared/...`)."""
    import shutil

    from training.gpt2.compiling import CACHE_DIR

    run_dir = os.path.join(storage, case.job_name)
    if not case.resumes:
        shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir, exist_ok=True)
    shared = os.path.join(work, SHARED, CACHE_DIR)
    os.makedirs(shared, exist_ok=True)
    link = os.path.join(run_dir, CACHE_DIR)
    if not os.path.lexists(link):
        os.symlink(shared, link)


def the_device(a: argparse.Namespace) -> tuple[str, Optional[Peak], float, str]:
    """(description, peak, memory GiB, torch's device name); raises SystemExit(2) without a GPU."""
    if a.cpu:
        return "cpu", None, 0.0, "cpu"
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU here (python -m training.gpu_smoke --cpu checks the script "
              "itself on CPU)", file=sys.stderr)
        raise SystemExit(2)
    name = torch.cuda.get_device_name(0)
    peak = peak_for(name)
    if a.peak_tflops:
        peak = Peak("given", a.peak_tflops, peak.dtype if peak else "bf16")
    memory = torch.cuda.get_device_properties(0).total_memory / 2**30
    return f"{name}, {memory:.0f} GiB, torch {torch.__version__}", peak, memory, name


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    from training.smoke import toolchain
    from training.gpt2.model import PRESETS

    preset = PRESETS["tiny" if a.cpu else "gpt2-small"]
    try:
        device, peak, memory, name = the_device(a)
    except SystemExit as e:
        return int(e.code or 2)
    names = [c.name for c in a.cases]
    budget = a.budget or (smoke_plan.CPU_TOTAL_BUDGET_S if a.cpu else TOTAL_BUDGET_S)
    plan = (smoke_plan.cpu_plan(names, a.steps, total_budget_s=budget) if a.cpu else
            smoke_plan.plan_for_card(name, memory, names, a.steps, budget))
    precision = a.precision or ("fp32" if a.cpu else "fp16" if peak and peak.dtype == "fp16" else "bf16")
    help_text = subprocess.run([sys.executable, "-m", "training", "--help"], capture_output=True,
                               text=True).stdout
    has_compile = has_flag(help_text, "--compile")
    missing_tools = toolchain.problem_here() if any(c.compile == "on" for c in a.cases) else None
    if missing_tools:
        print(f"error: {missing_tools}", flush=True)
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    storage = os.path.join(work, "runs")
    print(f"gpu smoke: {device}; cases {', '.join(c.name for c in plan.cases)} (estimate "
          f"{plan.estimate_s:.0f} s of {budget:.0f}); precision {precision}; tokenizer "
          f"{a.bpe_file or 'byte-level'}; compile cache {os.path.join(work, SHARED)}", flush=True)
    skip = skip_reasons(a.cases, has_compile, a.cpu, missing_tools)
    skip.update({n: f"not in the plan: {why}" for n, why in plan.dropped})
    planned = {c.name: c for c in plan.cases}
    results, start = [], time.monotonic()
    for case in sorted(a.cases, key=lambda c: smoke_plan.order_cases(names).index(c.name)):
        cp = planned.get(case.name)
        if case.name in skip or cp is None:
            # a compiled case that cannot compile here is a failure; the rest are choices
            failed = bool(missing_tools) and case.compile == "on"
            results.append(Result(case, status="FAIL" if failed else "skipped",
                                  reason=skip.get(case.name, "not in the plan")))
            continue
        left = budget - (time.monotonic() - start)
        if cp.estimate_s > left:
            results.append(Result(case, status="skipped",
                                  reason=f"out of time ({left:.0f} s left, needs ~{cp.estimate_s:.0f})"))
            continue
        timeout = min(cp.budget_s, left)
        t0 = time.monotonic()
        if case.in_process:
            line, tail, timed_out = run_step_case(step_argv(case, a, plan, cp.steps, precision, work),
                                                  work, timeout)
            r = summarize_step(case, line, peak)
            if line is not None:
                r.steps = cp.steps
            elif timed_out:
                r.reason = f"timed out after {timeout:.0f} s"
        else:
            share_compile_cache(storage, case, work)
            smaller = plan.accumulation != plan.default_accumulation
            argv = case_argv(case, a, has_compile, precision, storage, cp.steps,
                             plan.micro * plan.accumulation if smaller else None)
            events, tail = run_case(argv, work, timeout)
            r = summarize(case, events, peak, preset.n_layer, preset.n_embd)
        r.seconds = time.monotonic() - t0
        results.append(r)
        print(f"{r.status:4} {case.name}: {r.tokens_per_sec or 0:,.0f} tokens/s, MFU "
              f"{_pct(r.mfu)}, {r.parallel or '-'}, {r.seconds:.0f} s"
              + (f" ({r.reason})" if r.reason else ""), flush=True)
        if r.status == "FAIL" and tail:
            print("  " + tail.replace("\n", "\n  "), flush=True)
    print(format_report(device, peak, results, plan))
    return 1 if any(r.status == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
