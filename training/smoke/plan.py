"""The smoke run's plan, sized by the card: which cases, how many steps, how long each may take.

Pure (stdlib only; the tests check every card's plan on CPU). One GPU call has about 8 minutes
(`TOTAL_BUDGET_S`), so the plan estimates each case from the card's dense peak
(submitter.contract.flops) and what a case costs besides its steps (process or Ray start-up, a
cold compile or one from the shared cache: figures from the H200 run, FACTS' fifth round), then:
1. keeps the default run's step (micro-batch x accumulation, `default_batch`) unless one step
   would take more than `MAX_STEP_S` on this card (a T4's 0.5 M-token step takes ~25 s): then
   fewer micro-batches a step, said in the report;
2. gives the entrypoint's cases `DEFAULT_STEPS` steps (fewer, down to `MIN_STEPS`, when the sum
   of the estimates does not fit) and the in-process cases `TIMED_STEPS` timed steps;
3. drops cases from the end of the run order (`DROP_ORDER`: the least telling first) while it
   still does not fit, takes back any dropped case that fits the time left after all, and says
   in the report what it dropped.
A case's budget (its timeout) is its estimate times `SAFETY`, at least `MIN_CASE_S`; the smoke
run also cuts it to the time the whole plan has left, and skips a case whose estimate no
longer fits rather than start it to be killed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import dataclasses

from submitter.contract.batch import param_count, resolve, sequences_that_fit
from submitter.contract.flops import flops_per_token, peak_for

#: What one short call on a GPU machine allows the whole plan.
TOTAL_BUDGET_S = 8 * 60
#: The --cpu plan (tiny shapes, a check of the script on a shared 2-core machine).
CPU_TOTAL_BUDGET_S = 20 * 60
#: What a --cpu case is assumed to take (2 loaded cores; Ray start-up dominates).
CPU_CASE_ESTIMATE_S = 120.0
#: A step slower than this on the card: fewer micro-batches a step.
MAX_STEP_S = 5.0
#: Optimizer steps of an entrypoint case (its epoch), and the fewest a tight plan gives it.
DEFAULT_STEPS, MIN_STEPS = 4, 3
#: Timed steps of an in-process case (after one untimed step that compiles).
TIMED_STEPS = 3
SAFETY, MIN_CASE_S = 1.5, 45.0
#: The cases in run order, most telling first: a plan that does not fit drops from the end.
#: `reference` and `step` are never dropped (every ratio is to them).
DROP_ORDER = ("reference", "step", "ddp-compiled", "resume", "ddp2", "fsdp-compiled",
              "ddp-eager", "fsdp-eager")
IN_PROCESS = ("reference", "step", "ddp2")
#: MFU each kind of case is assumed to reach (for its time estimate only).
ASSUMED_MFU = {"reference": 0.40, "step": 0.33, "ddp2": 0.12, "ddp-compiled": 0.28,
               "fsdp-compiled": 0.18, "resume": 0.28, "ddp-eager": 0.19, "fsdp-eager": 0.15}
#: Seconds a case costs besides its steps, GPU: start-up (Ray + data for the entrypoint's cases)
#: and compile (cold, or from the shared cache), from the H200 run (FACTS, fifth round).
START_S = {"reference": 15.0, "step": 20.0, "ddp2": 30.0}
RAY_START_S = 75.0
COMPILE_S = {"reference": 35.0, "step": 40.0, "ddp-compiled": 15.0, "fsdp-compiled": 45.0,
             "resume": 10.0}
#: Cards without a known peak: assumed this (a conservative mid-range card).
UNKNOWN_PEAK_TFLOPS = 100.0
#: Slower cards compile slower too (CPU-bound, but such hosts are smaller): factor on COMPILE_S.
SLOW_CARD_TFLOPS, SLOW_COMPILE_FACTOR = 150.0, 2.0
#: Memory two processes of the ddp2 case need at least (GiB): two copies of the model's state
#: and activations; below it the case is skipped ("where the card allows it").
DDP2_MIN_GIB = 24.0
#: gpt2-small's shapes (training.gpt2.model.PRESETS holds the same figures; a test holds them together),
#: its vocabulary padded to 50,304 as the model pads it.
GPT2_SMALL = {"params": param_count(12, 768, 50_304, 256), "n_layer": 12, "n_embd": 768, "block": 256}


@dataclass(frozen=True)
class CasePlan:
    name: str
    steps: int
    estimate_s: float
    budget_s: float


@dataclass(frozen=True)
class SmokePlan:
    card: str
    micro: int
    accumulation: int              # micro-batches a step (all ranks)
    default_accumulation: int      # what the default run takes
    tokens_per_step: int
    cases: tuple[CasePlan, ...]
    dropped: tuple[tuple[str, str], ...] = ()  # (case, why)
    total_budget_s: float = TOTAL_BUDGET_S
    notes: tuple[str, ...] = field(default=())

    @property
    def estimate_s(self) -> float:
        return _estimate(self.cases)

    def case(self, name: str) -> Optional[CasePlan]:
        return next((c for c in self.cases if c.name == name), None)


def _estimate(cases: Sequence[CasePlan]) -> float:
    return sum(c.estimate_s for c in cases)


def default_batch(memory_gib: Optional[float] = None) -> tuple[int, int]:
    """(micro-batch, micro-batches a step) of the default GPU run (`--gpu-per-pod 1`, one
    worker, gpt2-small): the job's global batch (submitter.contract.batch), in the largest
    micro-batch that fits `memory_gib` and divides it, as the worker chooses on the device
    (training.gpt2.microbatch). Without `memory_gib`: render's estimate for a 16 GiB card."""
    block = GPT2_SMALL["block"]
    r = resolve(gpu=True, model="gpt2-small", block=block, micro=None, global_batch=None,
                min_workers=1, max_workers=1)
    if memory_gib is not None:  # the worker's rule: what this card has free (training.gpt2.microbatch)
        r = dataclasses.replace(r, fits=sequences_that_fit("gpt2-small", block, memory_gib * 2**30))
    p = r.plan(1, block)
    return p.micro_batch, p.accumulation


def step_seconds(case: str, tokens: int, peak_tflops: float) -> float:
    """Estimated seconds of one optimizer step of `tokens` for a case on a card."""
    g = GPT2_SMALL
    per_token = flops_per_token(g["params"], g["n_layer"], g["n_embd"], g["block"])
    return tokens * per_token / (peak_tflops * 1e12 * ASSUMED_MFU[case])


def case_seconds(case: str, steps: int, tokens: int, peak_tflops: float) -> float:
    """Estimated wall time of a case: start-up, compile, and its steps plus one (the in-process
    cases' untimed first step; the entrypoint's validation, checkpoint and shutdown)."""
    slow = SLOW_COMPILE_FACTOR if peak_tflops < SLOW_CARD_TFLOPS else 1.0
    start = START_S.get(case, RAY_START_S)
    compile_s = COMPILE_S.get(case, 0.0) * slow
    return start + compile_s + (steps + 1) * step_seconds(case, tokens, peak_tflops)


def budget_for(estimate: float) -> float:
    """A case's timeout from its estimate."""
    return max(MIN_CASE_S, round(estimate * SAFETY))


def order_cases(cases: Sequence[str]) -> list[str]:
    """The cases in run order (DROP_ORDER), whatever order they were asked in."""
    return sorted(cases, key=lambda c: DROP_ORDER.index(c) if c in DROP_ORDER else len(DROP_ORDER))


def plan_for_card(device_name: str, memory_gib: float, cases: Sequence[str],
                  steps: Optional[int] = None, total_budget_s: float = TOTAL_BUDGET_S) -> SmokePlan:
    """The plan for one card (see the module docstring). `cases`: in run order."""
    peak = peak_for(device_name)
    tflops = peak.tflops if peak else UNKNOWN_PEAK_TFLOPS
    micro, default_accum = default_batch(memory_gib)
    block = GPT2_SMALL["block"]
    accum, notes = default_accum, []
    while accum > 2 and step_seconds("ddp-compiled", micro * block * accum, tflops) > MAX_STEP_S:
        accum //= 2
    if accum != default_accum:
        notes.append(f"{accum} micro-batches a step, not the default run's {default_accum}: "
                     f"its step would take over {MAX_STEP_S:g} s on this card")
    if not peak:
        notes.append(f"unknown card: planned as {UNKNOWN_PEAK_TFLOPS:g} TFLOP/s")
    tokens = micro * block * accum
    chosen, dropped = order_cases(cases), []
    if "ddp2" in chosen and memory_gib < DDP2_MIN_GIB:
        chosen.remove("ddp2")
        dropped.append(("ddp2", f"2 processes need {DDP2_MIN_GIB:g} GiB; this card has {memory_gib:.0f}"))
    n = steps or DEFAULT_STEPS

    def build(n_steps: int, names: list[str]) -> list[CasePlan]:
        out = []
        for name in names:
            k = (steps or TIMED_STEPS) if name in IN_PROCESS else n_steps
            est = case_seconds(name, k, tokens, tflops)
            out.append(CasePlan(name, k, round(est, 1), budget_for(est)))
        return out

    planned = build(n, chosen)
    while _estimate(planned) > total_budget_s and n > MIN_STEPS and steps is None:
        n -= 1
        planned = build(n, chosen)
    for victim in reversed(DROP_ORDER):
        if _estimate(planned) <= total_budget_s:
            break
        if victim in chosen and victim not in ("reference", "step"):
            chosen.remove(victim)
            dropped.append((victim, f"the {total_budget_s / 60:g}-minute plan leaves no time on this card"))
            planned = build(n, chosen)
    for name, _ in list(reversed(dropped)):  # a smaller case dropped on the way may fit again
        if name == "ddp2" and memory_gib < DDP2_MIN_GIB or name == "resume" and "ddp-compiled" not in chosen:
            continue
        again = build(n, order_cases(chosen + [name]))
        if _estimate(again) <= total_budget_s:
            chosen, planned = order_cases(chosen + [name]), again
            dropped = [d for d in dropped if d[0] != name]
    return SmokePlan(peak.label if peak else device_name, micro, accum, default_accum, tokens,
                     tuple(planned), tuple(dropped), total_budget_s, tuple(notes))


def cpu_plan(cases: Sequence[str], steps: Optional[int] = None, micro: int = 2, accum: int = 4,
             total_budget_s: float = CPU_TOTAL_BUDGET_S) -> SmokePlan:
    """The --cpu plan: tiny shapes (block 128), every case an equal share of the budget."""
    per_case = total_budget_s / max(1, len(cases))
    planned = tuple(CasePlan(c, steps or (TIMED_STEPS if c in IN_PROCESS else DEFAULT_STEPS),
                             min(per_case, CPU_CASE_ESTIMATE_S), per_case) for c in order_cases(cases))
    return SmokePlan("cpu", micro, accum, accum, micro * 128 * accum, planned, (), total_budget_s)
