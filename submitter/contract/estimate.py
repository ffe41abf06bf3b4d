"""What a run will take before it starts: tokens, steps, hours, GPU-hours and cost (#38).

Pure arithmetic, stdlib only: the inputs that need I/O (a prepared corpus's manifest, this
user's finished runs, a price) are read at the edge (submitter.estimating) and passed in, so
the same figures come out of `submitter estimate`, `render`/`submit --dry-run` (stderr) and the
refusal of `--max-cost`/`--deadline`. Every uncertain input carries a range; the three cases
are `low` (fewest hours), `likely` and `high` (most hours).

How the figures are made (docs/estimating.md explains how far to trust each):
- tokens: a prepared corpus's manifest counts them exactly (whole sequences per shard, as the
  reader drops each shard's tail); files read on the fly are estimated from their size
  (BYTES_PER_TOKEN); a Hugging Face dataset is unknown unless --max-steps-per-epoch caps it.
- steps: whole global batches per epoch (capped by --max-steps-per-epoch) times --epochs.
- step time on GPUs: the scaling model (submitter.contract.scaling): FLOPs per token x the
  step's tokens at an MFU of the card's dense peak, on the GPUs asked for, with DDP's exposed
  all-reduce at BANDWIDTH_GBPS per GPU. The MFU comes, in order, from this user's newest
  finished run of the same model and card on the same storage kind (its MFU brought back to
  one GPU through the same model), else MEASURED_MFU, else step_time.ASSUMED_MFU.
- step time on CPU (no card): the measured tokens/s of this user's newest finished CPU run of
  the same model on the same storage, scaled by workers; without one there is no basis for
  hours (tokens and steps are still given).
- overhead: start-up (STARTUP_S), synchronous checkpoints (epoch ends and --checkpoint-every:
  one host copy of the state at step_time.SAVE_BYTES_PER_S; interval checkpoints are
  asynchronous and cost nothing here), and preemptions on a cluster: PREEMPTIONS_PER_POD_HOUR
  (spot capacity) x pods x hours restarts, each losing a start-up plus half the time between
  checkpoints.
- cost: GPU-hours x the price per GPU-hour; a CPU job's price is per hour of the machine
  (local) or of a worker pod (cluster).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from submitter.contract import batch, scaling
from submitter.contract.flops import Peak, peak_for
from submitter.contract.step_time import ASSUMED_MFU, SAVE_BYTES_PER_S

CASES = ("low", "likely", "high")
#: The keys `-o json` gives for each case (top level: likely; `low` and `high`: the others).
FIGURES = ("tokens", "steps", "hours", "gpu_hours", "cost")

#: Model FLOPs utilisation the project measured, per (model, card label of the peak table):
#: (MFU, where and when). The GPU smoke run's table, docs/gpus/smoke-run.md ("Measured").
MEASURED_MFU: dict[tuple[str, str], tuple[float, str]] = {
    ("gpt2-small", "H200 SXM"): (0.417, "the project's measured table: GPU smoke run, case "
                                        "ddp-compiled, one H200, 2026-11-27 "
                                        "(docs/gpus/smoke-run.md)"),
}
#: Relative uncertainty of the MFU by its source: low case MFU x (1 + r), high case x (1 - r).
MFU_RANGE = {"own": 0.10, "measured": 0.20, "assumed": 0.40}
#: Bandwidth per GPU between pods, Gb/s, per case (the pod network; NVLink inside a pod is faster).
BANDWIDTH_GBPS = {"low": 400.0, "likely": 100.0, "high": 25.0}
#: Seconds from submit to the first step: a cluster (scheduling, image pull, Ray start-up,
#: torch.compile) and a local run (FACTS: 25.8-33.9 s measured on 2 cores).
STARTUP_S = {"cluster": {"low": 120.0, "likely": 300.0, "high": 900.0},
             "local": {"low": 20.0, "likely": 30.0, "high": 60.0}}
#: Preemptions (or node losses) per worker pod per hour on spot capacity, per case: one in 50
#: pod-hours likely; none at best; one in 10 at worst. A local run has none.
PREEMPTIONS_PER_POD_HOUR = {"low": 0.0, "likely": 0.02, "high": 0.1}
#: Checkpoint save time factor per case (a faster or slower store than SAVE_BYTES_PER_S).
SAVE_FACTOR = {"low": 0.5, "likely": 1.0, "high": 2.0}
#: UTF-8 bytes per token of English text: GPT-2's BPE ~4 (3.5-4.8), a byte tokenizer 1.
BYTES_PER_TOKEN = {"gpt2": (4.8, 4.0, 3.5), "byte": (1.0, 1.0, 1.0)}
#: Relative uncertainty of a CPU run's pace taken from another run (other workers, other load).
CPU_PACE_RANGE = 0.3


@dataclass(frozen=True)
class Tokens:
    """The training tokens of one epoch and where the count came from. `sequences`: whole
    sequences of the block per epoch, per case (None: unknown)."""
    sequences: Optional[Mapping[str, int]]
    exact: bool
    source: str

    def per_epoch(self, case: str, block: int) -> Optional[int]:
        return None if self.sequences is None else self.sequences[case] * block


@dataclass(frozen=True)
class Pace:
    """How fast a step goes: an MFU for a card, or a measured CPU pace (tokens/s per worker)."""
    kind: str                # "mfu" | "cpu"
    value: float             # MFU at one GPU, or tokens/s per worker
    spread: float            # relative uncertainty
    source: str
    origin: str = "assumed"  # "own" | "measured" | "assumed" (for an MFU)


@dataclass(frozen=True)
class Price:
    per_hour: float
    source: str


@dataclass(frozen=True)
class Case:
    """One case's figures (None: no basis)."""
    tokens: Optional[int]
    steps: Optional[int]
    hours: Optional[float]
    gpu_hours: Optional[float]
    cost: Optional[float]
    step_s: Optional[float] = None
    efficiency: Optional[float] = None
    startup_s: float = 0.0
    checkpoint_s: float = 0.0
    preemption_s: float = 0.0
    restarts: float = 0.0

    def figures(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "steps": self.steps, "hours": _round(self.hours, 4),
                "gpu_hours": _round(self.gpu_hours, 4), "cost": _round(self.cost, 2)}


@dataclass(frozen=True)
class Estimate:
    cases: Mapping[str, Case]
    tokens_per_epoch: Optional[int]
    tokens_exact: bool
    steps_per_epoch: Optional[int]
    epochs: int
    global_batch: int          # sequences per optimizer step
    tokens_per_step: int
    block: int
    gpus: int                  # 0 on CPU
    card: Optional[str]        # the peak table's label
    mfu: Optional[float]       # likely, at one GPU
    price: Optional[Price]
    local: bool
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def likely(self) -> Case:
        return self.cases["likely"]

    def to_dict(self) -> dict[str, Any]:
        """`-o json`, the RayJob annotation and run.json's `estimate`: the likely figures at the
        top, `low` and `high` with the same keys, then the inputs and `sources`."""
        out: dict[str, Any] = dict(self.likely.figures())
        out["low"] = self.cases["low"].figures()
        out["high"] = self.cases["high"].figures()
        out.update({
            "tokens_per_epoch": self.tokens_per_epoch, "tokens_exact": self.tokens_exact,
            "steps_per_epoch": self.steps_per_epoch, "epochs": self.epochs,
            "global_batch": {"sequences": self.global_batch, "tokens": self.tokens_per_step,
                             "block": self.block},
            "step_s": {c: _round(self.cases[c].step_s, 4) for c in CASES},
            "gpus": self.gpus, "gpu_type": self.card, "mfu": _round(self.mfu, 4),
            "efficiency": _round(self.likely.efficiency, 4),
            "overhead_s": {"startup": _round(self.likely.startup_s, 1),
                           "checkpoints": _round(self.likely.checkpoint_s, 1),
                           "preemptions": _round(self.likely.preemption_s, 1)},
            "restarts": _round(self.likely.restarts, 3),
            "gpu_hour_price": None if self.price is None else self.price.per_hour,
            "sources": dict(self.sources),
        })
        return out


def _round(x: Optional[float], digits: int) -> Optional[float]:
    return None if x is None else round(x, digits)


# --- inputs (pure choices) ---------------------------------------------------------------------

def known_cards() -> list[str]:
    """The card names the estimate knows (the peak table's labels)."""
    from submitter.contract.flops import PEAK_RULES

    return [peak.label for _, peak in PEAK_RULES]


def card_problem(gpu_type: Optional[str], gpu_per_pod: int) -> Optional[str]:
    """What keeps a GPU job's estimate from a card's peak, or None."""
    if not gpu_per_pod:
        return None
    known = ", ".join(known_cards())
    if not gpu_type:
        return (f"a GPU job's step time needs the card: add --gpu-type NAME (the node label's "
                f"value, e.g. NVIDIA-H100-80GB-HBM3); known cards: {known}")
    if peak_for(gpu_type) is None:
        return f"--gpu-type {gpu_type}: not a card the estimate knows; known cards: {known}"
    return None


def file_tokens(total_bytes: int, tokenizer: str, val_percent: float, block: int,
                what: str) -> Tokens:
    """Files read on the fly: their size over BYTES_PER_TOKEN, less the validation hold-out."""
    per = BYTES_PER_TOKEN["byte" if tokenizer == "byte" else "gpt2"]
    keep = 1 - val_percent / 100
    seqs = {c: int(total_bytes / b * keep) // block for c, b in zip(CASES, per)}
    return Tokens(seqs, False, f"estimated from {total_bytes:,} bytes of {what} at "
                               f"{per[1]:g} bytes a token ({per[2]:g}-{per[0]:g}), "
                               f"less the {val_percent:g}% validation hold-out")


def corpus_tokens(shard_tokens: Iterable[int], block: int, where: str) -> Tokens:
    """A prepared corpus: its manifest's training shards, whole sequences per shard (the reader
    drops each shard's tail under a block)."""
    counts = list(shard_tokens)
    seqs = sum(t // block for t in counts)
    return Tokens({c: seqs for c in CASES}, True,
                  f"exact: {sum(counts):,} training tokens in {len(counts)} shard(s), from the "
                  f"manifest of {where}")


def _get(run: Any, name: str, default: Any = None) -> Any:
    return getattr(run, name, default) if not isinstance(run, Mapping) else run.get(name, default)


def _run_label(run: Any) -> str:
    return f"{_get(run, 'name') or _get(run, 'run') or 'a run'}, finished {_get(run, 'finished_at', '?')}"


def choose_mfu(model: str, card: str, storage_kind: str, runs: Sequence[Any],
               per_token: float, peak_tflops: float,
               normalize: Optional[Any] = None) -> Pace:
    """The MFU, in order: this user's newest finished run of the same model and card on the same
    storage kind (`runs` newest first; its MFU, else its tokens/s over the peak, brought back to
    one GPU by `normalize(mfu, gpus)`), else MEASURED_MFU, else ASSUMED_MFU."""
    for run in runs:
        if not (_get(run, "finished") and _get(run, "model") == model
                and _get(run, "storage_kind") == storage_kind):
            continue
        label = _get(run, "gpu_type")
        if label is None or (label != card and getattr(peak_for(str(label)), "label", None) != card):
            continue
        gpus = max(1, int(_get(run, "gpus") or 1))
        mfu = _get(run, "mfu")
        if mfu is None and _get(run, "tokens_per_s"):
            mfu = float(_get(run, "tokens_per_s")) * per_token / (gpus * peak_tflops * 1e12)
        if not mfu:
            continue
        one = normalize(float(mfu), gpus) if normalize else float(mfu)
        return Pace("mfu", one, MFU_RANGE["own"],
                    f"your run {_run_label(run)}: {float(mfu):.1%} MFU on {gpus} {card} GPU(s) "
                    f"({one:.1%} at one GPU through the scaling model)", "own")
    if (model, card) in MEASURED_MFU:
        value, where = MEASURED_MFU[(model, card)]
        return Pace("mfu", value, MFU_RANGE["measured"], f"{value:.1%} MFU: {where}", "measured")
    return Pace("mfu", ASSUMED_MFU, MFU_RANGE["assumed"],
                f"{ASSUMED_MFU:.0%} MFU assumed (submitter.contract.step_time.ASSUMED_MFU): no "
                f"finished run of {model} on {card} on this storage, and none measured by the project",
                "assumed")


def choose_cpu_pace(model: str, storage_kind: str, runs: Sequence[Any]) -> Optional[Pace]:
    """A CPU run's pace: the newest finished CPU run (no card) of the same model on the same
    storage kind, as tokens/s per worker; None without one (no basis for hours)."""
    for run in runs:
        if (_get(run, "finished") and _get(run, "model") == model and _get(run, "gpu_type") is None
                and _get(run, "storage_kind") == storage_kind and _get(run, "tokens_per_s")):
            workers = max(1, int(_get(run, "workers") or 1))
            per = float(_get(run, "tokens_per_s")) / workers
            return Pace("cpu", per, CPU_PACE_RANGE,
                        f"your run {_run_label(run)}: {float(_get(run, 'tokens_per_s')):,.0f} "
                        f"tokens/s on {workers} CPU worker(s), scaled by workers", "own")
    return None


# --- the estimate ------------------------------------------------------------------------------

def _padded(vocab: int) -> int:
    return (vocab + 63) // 64 * 64


def scaling_settings(model: str, block: int, tokens_per_step: int, micro_tokens: int,
                     peak: Peak, mfu: float, gpu_type: Optional[str]) -> scaling.Settings:
    n_layer, n_embd, vocab = batch.MODEL_SHAPES[model]
    return scaling.Settings(vocab=_padded(vocab), n_layer=n_layer, n_embd=n_embd, block=block,
                            global_batch_tokens=tokens_per_step, gpu_type=gpu_type or "",
                            micro_batch_tokens=max(1, micro_tokens), peak_tflops=peak.tflops,
                            mfu=min(mfu, 0.95))


def one_gpu_mfu(model: str, block: int, tokens_per_step: int, micro_tokens: int, peak: Peak,
                mfu: float, gpus: int) -> float:
    """A whole job's measured MFU on `gpus` GPUs brought back to one GPU: over the scaling
    model's efficiency at the likely bandwidth."""
    if gpus <= 1:
        return mfu
    s = scaling_settings(model, block, tokens_per_step, micro_tokens, peak, mfu, None)
    return mfu / scaling.efficiency(s, gpus, BANDWIDTH_GBPS["likely"])


@dataclass(frozen=True)
class Job:
    """What the estimate needs of a JobSpec (so it is testable without one)."""
    model: str
    block: int
    epochs: int
    max_steps_per_epoch: Optional[int]
    global_batch: int          # sequences per step (largest group)
    micro_batch: int           # sequences per micro-batch
    workers: int               # train workers (one per GPU on GPUs)
    pods: int
    gpus: int                  # 0 on CPU
    gpu_type: Optional[str]
    checkpoint_every: int
    checkpoint_minutes: float
    local: bool


def job_of(spec: Any, local: bool) -> Job:
    plan = spec.batch_plan()
    return Job(spec.model, spec.block, spec.epochs, spec.max_steps_per_epoch, plan.global_batch,
               plan.micro_batch, spec.num_train_workers, spec.max_replicas,
               spec.num_train_workers if spec.gpu_per_pod else 0, spec.gpu_type,
               spec.checkpoint_every, spec.checkpoint_minutes, local)


def price_key(local: bool) -> str:
    """The price table's key a run's price is read from: the card's name, `local` on this
    machine (submitter.prices)."""
    return "local" if local else "CARD"


def estimate(job: Job, tokens: Tokens, pace: Optional[Pace], price: Optional[Price],
             sources: Optional[Mapping[str, str]] = None) -> Estimate:
    """The three cases (see the module docstring)."""
    tokens_per_step = job.global_batch * job.block
    peak = peak_for(job.gpu_type) if job.gpus and job.gpu_type else None
    cases: dict[str, Case] = {}
    steps_per_epoch: Optional[int] = None
    for case in CASES:
        seqs = None if tokens.sequences is None else tokens.sequences[case]
        per_epoch_steps = None if seqs is None else seqs // job.global_batch
        if job.max_steps_per_epoch is not None:
            per_epoch_steps = (job.max_steps_per_epoch if per_epoch_steps is None
                               else min(per_epoch_steps, job.max_steps_per_epoch))
        if case == "likely":
            steps_per_epoch = per_epoch_steps
        steps = None if per_epoch_steps is None else per_epoch_steps * job.epochs
        cases[case] = _case(job, case, steps, tokens_per_step, peak, pace, price)
    likely_seqs = None if tokens.sequences is None else tokens.sequences["likely"]
    src = {"tokens": tokens.source if tokens.sequences is not None or job.max_steps_per_epoch is None
           else f"{tokens.source}; steps capped by --max-steps-per-epoch {job.max_steps_per_epoch}"}
    if pace is not None:
        src["pace"] = pace.source
    else:
        src["pace"] = ("none: no finished CPU run of this model on this storage to measure from; "
                       "tokens and steps are still given, hours are not estimated (run it once, then "
                       "estimate again)" if not job.gpus else "none")
    if job.gpus and peak is not None:
        src["peak"] = f"{peak.label} {peak.tflops:g} TFLOP/s dense {peak.dtype} (submitter.contract.flops)"
        src["scaling"] = (f"DDP on {job.gpus} GPU(s), all-reduce at {BANDWIDTH_GBPS['likely']:g} "
                          f"Gb/s per GPU ({BANDWIDTH_GBPS['low']:g}-{BANDWIDTH_GBPS['high']:g}) "
                          "(submitter.contract.scaling)")
    where = "local" if job.local else "cluster"
    src["startup"] = (f"{STARTUP_S[where]['likely']:g} s ({STARTUP_S[where]['low']:g}-"
                      f"{STARTUP_S[where]['high']:g}) stated for a {where} run")
    src["checkpoints"] = (f"synchronous saves (epoch ends, --checkpoint-every) of one host copy of "
                          f"the state at {SAVE_BYTES_PER_S / 1e6:g} MB/s; interval checkpoints "
                          "are asynchronous")
    src["preemptions"] = ("none on a local run" if job.local else
                          f"{PREEMPTIONS_PER_POD_HOUR['likely']:g} per pod-hour stated for spot "
                          f"capacity ({PREEMPTIONS_PER_POD_HOUR['low']:g}-"
                          f"{PREEMPTIONS_PER_POD_HOUR['high']:g}); each restart loses a start-up "
                          "and half the time between checkpoints")
    src["price"] = price.source if price is not None else (
        "none: add --gpu-hour-price PRICE (flag, job file gpu_hour_price, chart gpuHourPrice) or a "
        f"line `{price_key(job.local)}: PRICE` in submitter-prices.yaml beside your kubeconfig "
        "(~/.kube/)")
    src.update(sources or {})
    return Estimate(cases, None if likely_seqs is None else likely_seqs * job.block,
                    tokens.exact, steps_per_epoch, job.epochs, job.global_batch, tokens_per_step,
                    job.block, job.gpus, peak.label if peak else None,
                    pace.value if pace is not None and pace.kind == "mfu" else None, price, job.local,
                    src)


def _case(job: Job, case: str, steps: Optional[int], tokens_per_step: int, peak: Optional[Peak],
          pace: Optional[Pace], price: Optional[Price]) -> Case:
    tokens = None if steps is None else steps * tokens_per_step
    step_s, eff = _step_s(job, case, tokens_per_step, peak, pace)
    if steps is None or step_s is None:
        return Case(tokens, steps, None, None, None, step_s, eff)
    where = "local" if job.local else "cluster"
    startup = STARTUP_S[where][case]
    save_s = batch.host_state_bytes(job.model, job.block) / SAVE_BYTES_PER_S * SAVE_FACTOR[case]
    saves = job.epochs + (steps // job.checkpoint_every if job.checkpoint_every else 0)
    checkpoint_s = saves * save_s
    train_s = steps * step_s
    restarts, lost = 0.0, 0.0
    if not job.local:
        period = train_s / max(1, job.epochs)
        if job.checkpoint_every:
            period = min(period, job.checkpoint_every * step_s)
        if job.checkpoint_minutes:
            period = min(period, job.checkpoint_minutes * 60)
        lost = startup + period / 2
        restarts = PREEMPTIONS_PER_POD_HOUR[case] * job.pods * (train_s + checkpoint_s) / 3600
    preemption_s = restarts * lost
    total = startup + train_s + checkpoint_s + preemption_s
    hours = total / 3600
    gpu_hours = hours * job.gpus
    cost = None
    if price is not None:
        # a CPU job: the price is per hour of this machine (local) or of a worker pod
        cost = price.per_hour * (gpu_hours if job.gpus else hours * (1 if job.local else job.pods))
    return Case(tokens, steps, hours, gpu_hours, cost, step_s, eff, startup, checkpoint_s,
                preemption_s, restarts)


def _step_s(job: Job, case: str, tokens_per_step: int, peak: Optional[Peak],
            pace: Optional[Pace]) -> tuple[Optional[float], Optional[float]]:
    if pace is None:
        return None, None
    factor = {"low": 1 + pace.spread, "likely": 1.0, "high": 1 - pace.spread}[case]
    if pace.kind == "cpu":
        return tokens_per_step / (pace.value * factor * max(1, job.workers)), None
    if peak is None:
        return None, None
    s = scaling_settings(job.model, job.block, tokens_per_step, job.micro_batch * job.block, peak,
                         pace.value * factor, job.gpu_type)
    x = scaling.step(s, job.gpus, BANDWIDTH_GBPS[case])
    return x.total_s, scaling.efficiency(s, job.gpus, BANDWIDTH_GBPS[case])


# --- guards ------------------------------------------------------------------------------------

def guard_problem(max_cost: Optional[float], deadline: Optional[str],
                  est: Estimate) -> Optional[str]:
    """One line when the likely figure passes --max-cost or --deadline (refused before anything
    is applied), or --max-cost has no price to compare with; None otherwise (a limit with no
    basis for hours is left to the run, which stops itself when it passes it)."""
    from submitter.contract.spec import duration_seconds

    likely = est.likely
    deadline_s = None if deadline is None else duration_seconds(deadline)
    if max_cost is not None:
        if est.price is None:
            return (f"--max-cost {max_cost:g}: no price to compare with; add --gpu-hour-price "
                    "PRICE, or a line `CARD: PRICE` in submitter-prices.yaml beside your "
                    "kubeconfig (~/.kube/)")
        if likely.cost is not None and likely.cost > max_cost:
            low, high = est.cases["low"].cost, est.cases["high"].cost
            return (f"the likely cost of this run is {likely.cost:,.2f} ({low:,.2f}-{high:,.2f}, "
                    f"{likely.gpu_hours or likely.hours:,.1f} "
                    f"{'GPU-hours' if est.gpus else 'hours'} at {est.price.per_hour:g}), more than "
                    f"--max-cost {max_cost:g}; nothing was applied: raise --max-cost, or train "
                    "less (--epochs, --max-steps-per-epoch); see submitter estimate")
    if deadline_s is not None and likely.hours is not None and likely.hours * 3600 > deadline_s:
        return (f"the likely wall-clock of this run is {_duration(likely.hours * 3600)} "
                f"({_duration(est.cases['low'].hours * 3600)}-"
                f"{_duration(est.cases['high'].hours * 3600)}), longer than --deadline "
                f"{deadline}; nothing was applied: raise --deadline, add GPUs "
                "(--replicas), or train less (--epochs, --max-steps-per-epoch); see submitter "
                "estimate")
    return None


def unchecked_guards(max_cost: Optional[float], deadline_s: Optional[float],
                     est: Estimate) -> Optional[str]:
    """A note when a limit cannot be checked before the run (no basis for hours)."""
    names = [flag for flag, value, figure in (("--max-cost", max_cost, est.likely.cost),
                                              ("--deadline", deadline_s, est.likely.hours))
             if value is not None and figure is None]
    if not names:
        return None
    return (f"note: {' and '.join(names)} cannot be checked before the run (no basis for its "
            f"hours: {est.sources.get('pace', 'none')}); the run stops itself when it passes it")


# --- text --------------------------------------------------------------------------------------

def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:,.1f} h"


def _num(x: Optional[float], fmt: str = ",.1f") -> str:
    return "?" if x is None else format(x, fmt)


def text_block(est: Estimate) -> str:
    """The estimate as one block for a terminal (`submitter estimate`, render's stderr)."""
    c = est.cases
    lk = est.likely
    lines = ["estimate (likely, then low-high):"]
    if est.tokens_per_epoch is not None:
        kind = "exact" if est.tokens_exact else "estimated"
        lines.append(f"  tokens      {est.tokens_per_epoch:,} per epoch ({kind}); "
                     f"{_num(lk.tokens, ',')} trained in {est.epochs} epoch(s)"
                     + ("" if est.tokens_exact else
                        f" ({_num(c['low'].tokens, ',')}-{_num(c['high'].tokens, ',')})"))
    elif lk.tokens is not None:
        lines.append(f"  tokens      {lk.tokens:,} trained (the corpus size is unknown: steps "
                     "capped by --max-steps-per-epoch)")
    else:
        lines.append("  tokens      unknown (sources says why): cap the steps with "
                     "--max-steps-per-epoch, or prepare the corpus (submitter data prepare)")
    lines.append(f"  batch       {est.tokens_per_step:,} tokens per step ({est.global_batch:,} "
                 f"sequences x {est.block})")
    if lk.steps is not None:
        lines.append(f"  steps       {lk.steps:,} ({est.steps_per_epoch:,} per epoch)")
    if lk.step_s is not None:
        where = (f"on {est.gpus} {est.card} GPU(s) at {est.mfu:.1%} MFU, data-parallel efficiency "
                 f"{lk.efficiency:.0%}" if est.gpus else "on CPU, from a measured pace")
        lines.append(f"  step time   {lk.step_s:.3g} s ({c['low'].step_s:.3g}-{c['high'].step_s:.3g}) "
                     f"{where}")
    if lk.hours is not None:
        lines.append(f"  wall-clock  {_duration(lk.hours * 3600)} ({_duration(c['low'].hours * 3600)}-"
                     f"{_duration(c['high'].hours * 3600)}); of it start-up "
                     f"{_duration(lk.startup_s)}, checkpoints {_duration(lk.checkpoint_s)}, "
                     f"preemptions {_duration(lk.preemption_s)} ({lk.restarts:.2g} restarts)")
        if est.gpus:
            lines.append(f"  GPU-hours   {lk.gpu_hours:,.1f} ({c['low'].gpu_hours:,.1f}-"
                         f"{c['high'].gpu_hours:,.1f})")
        if lk.cost is not None and est.price is not None:
            lines.append(f"  cost        {lk.cost:,.2f} ({c['low'].cost:,.2f}-{c['high'].cost:,.2f}) "
                         f"at {est.price.per_hour:g} per {'GPU-' if est.gpus else ''}hour")
        else:
            how = est.sources.get("price", "")
            lines.append(f"  cost        no price: {how[len('none: '):] if how.startswith('none: ') else how}")
    else:
        why = ("the token count is unknown" if lk.steps is None
               else est.sources.get("pace", "no basis"))
        lines.append(f"  wall-clock  not estimated: {why}")
    lines.append("  sources:")
    lines += [f"    {k}: {v}" for k, v in est.sources.items()]
    return "\n".join(lines)
