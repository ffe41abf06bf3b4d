"""Measured against estimated: what `watch`, `status`, `submit --local` and `report` show beside
the estimate recorded with the job (`submitter estimate -o json`'s dict: the RayJob's annotation,
a local run's run.json `estimate`).

Pure functions: the callers gather what they measured (`Measured`) from the events or the
progress ConfigMap; nothing here reads a clock or a file. The estimate's likely step time gives
the expected pace (tokens per step / step_s), its price (or cost / GPU-hours) the money.
A pace off by more than `OFF_BY` is worth one warning, with the cause where the events show one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from submitter.contract.events import duration

#: How far the measured pace may be from the estimate's before `watch` warns (once).
OFF_BY = 1 / 3
#: A data wait above this share of step time is named as the cause of a slow pace.
DATA_WAIT_CAUSE = 0.10


@dataclass(frozen=True)
class Measured:
    """What a run measured so far (None: not known yet)."""

    tokens_per_s: Optional[float]
    elapsed_s: Optional[float] = None   # wall-clock of the run so far
    eta_s: Optional[float] = None       # left, at the run's own cadence
    restarts: int = 0
    data_wait: Optional[float] = None   # share of step time waiting for data (progress events)
    workers: Optional[int] = None       # the group training now


def _num(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def expected_pace(estimate: Mapping[str, Any]) -> Optional[float]:
    """The estimate's likely tokens per second while training (start-up and checkpoints
    excluded): tokens per optimizer step over the likely step time."""
    batch = estimate.get("global_batch")
    tokens = _num(batch.get("tokens")) if isinstance(batch, Mapping) else None
    step_s = estimate.get("step_s")
    likely = _num(step_s.get("likely")) if isinstance(step_s, Mapping) else _num(step_s)
    if not tokens or not likely:
        hours, total = _num(estimate.get("hours")), _num(estimate.get("tokens"))
        return total / (hours * 3600) if hours and total else None
    return tokens / likely


def price_of(estimate: Mapping[str, Any]) -> Optional[float]:
    """Per GPU-hour: the estimate's price, else its cost over its GPU-hours (None: no price)."""
    price = _num(estimate.get("gpu_hour_price"))
    if price:
        return price
    cost, hours = _num(estimate.get("cost")), _num(estimate.get("gpu_hours"))
    return cost / hours if cost is not None and hours else None


def gpus_of(estimate: Mapping[str, Any]) -> Optional[float]:
    gpus = _num(estimate.get("gpus"))
    if gpus is not None:
        return gpus
    gpu_hours, hours = _num(estimate.get("gpu_hours")), _num(estimate.get("hours"))
    return gpu_hours / hours if gpu_hours is not None and hours else None


def ratio(estimate: Mapping[str, Any], measured: Measured) -> Optional[float]:
    """Measured pace over the estimate's (1.0: as estimated)."""
    expected = expected_pace(estimate)
    if not expected or not measured.tokens_per_s:
        return None
    return measured.tokens_per_s / expected


def _pct(r: float) -> str:
    return f"{(r - 1) * 100:+.0f}%"


def _money(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:,.2f}"


def comparison(estimate: Mapping[str, Any], measured: Measured) -> list[str]:
    """Lines: tokens/s, MFU, ETA and cost, measured against the estimate."""
    lines = []
    r = ratio(estimate, measured)
    expected = expected_pace(estimate)
    if measured.tokens_per_s is not None and expected:
        lines.append(f"tokens/s: {measured.tokens_per_s:,.0f} measured vs {expected:,.0f} "
                     f"estimated ({_pct(r or 1)})")
    mfu, eff = _num(estimate.get("mfu")), _num(estimate.get("efficiency")) or 1.0
    if mfu is not None and r is not None:
        lines.append(f"MFU: ~{mfu * eff * r:.1%} measured (from the pace) vs {mfu * eff:.1%} "
                     "estimated")
    hours = _num(estimate.get("hours"))
    total_s = (measured.elapsed_s + measured.eta_s
               if measured.elapsed_s is not None and measured.eta_s is not None else None)
    if measured.eta_s is not None:
        est = f" vs {duration(hours * 3600)} estimated" if hours else ""
        whole = f", {duration(total_s)} in all{est}" if total_s is not None else est
        lines.append(f"ETA: {duration(measured.eta_s)} left{whole}")
    price, gpus = price_of(estimate), gpus_of(estimate)
    if price and measured.elapsed_s is not None:
        units = gpus or 1  # GPUs held, or the one machine of a local run (as estimated)
        so_far = measured.elapsed_s / 3600 * units * price
        end = total_s / 3600 * units * price if total_s is not None else None
        est_cost = _num(estimate.get("cost"))
        lines.append(f"cost: {_money(so_far)} so far, {_money(end)} at the end vs "
                     f"{_money(est_cost)} estimated")
    return lines


def likely_cause(estimate: Mapping[str, Any], measured: Measured, slower: bool) -> str:
    """What the events show that explains a pace off the estimate."""
    if not slower:
        return "the estimate's MFU is low for this run (its figures are conservative)"
    causes = []
    if measured.data_wait is not None and measured.data_wait > DATA_WAIT_CAUSE:
        causes.append(f"data waits ({measured.data_wait:.0%} of step time waiting for data: "
                      "prepare the corpus, or more CPUs for Ray Data)")
    if measured.restarts:
        causes.append(f"restarts ({measured.restarts}: each redoes the steps since the last "
                      "checkpoint and pays start-up again)")
    gpus = gpus_of(estimate)
    if measured.workers and gpus and measured.workers < gpus:
        causes.append(f"fewer workers than estimated ({measured.workers} of {gpus:g})")
    if not causes:
        return ("none the events show (no data waits, no restarts): a slow rank, or a slower "
                "card or interconnect than the estimate assumed")
    return "; ".join(causes)


def off_pace(estimate: Mapping[str, Any], measured: Measured) -> Optional[str]:
    """A warning when the measured pace is off the estimate by more than OFF_BY, else None."""
    r = ratio(estimate, measured)
    if r is None or abs(r - 1) <= OFF_BY:
        return None
    slower = r < 1
    return (f"warning: the measured pace is {abs(r - 1):.0%} {'below' if slower else 'above'} "
            f"the estimate ({measured.tokens_per_s:,.0f} vs {expected_pace(estimate):,.0f} "
            f"tokens/s); likely cause: {likely_cause(estimate, measured, slower)}")


class PaceWarning:
    """`off_pace` once per watch: the first time the pace is off, not at every event."""

    def __init__(self) -> None:
        self.warned = False

    def check(self, estimate: Optional[Mapping[str, Any]], measured: Measured) -> Optional[str]:
        if self.warned or not estimate:
            return None
        text = off_pace(estimate, measured)
        self.warned = text is not None
        return text


def took_lines(usage: Any, estimate: Optional[Mapping[str, Any]]) -> list[str]:
    """`report`: what the run took (usage.json), beside the estimate when one was recorded."""
    card = f" ({usage.gpu_type})" if usage.gpu_type else ""
    mfu = f", MFU {usage.mfu:.1%}{card}" if usage.mfu is not None else ""
    end = ("finished" if usage.finished else
           f"stopped ({usage.stopped_by})" if usage.stopped_by else "not finished")
    cost = f", cost {_money(usage.cost)}" if usage.cost is not None else ""
    lines = [f"took: {duration(usage.wall_s)} wall-clock, {usage.gpu_hours:.2f} GPU-hours"
             f"{cost}, {usage.tokens:,} tokens at {usage.tokens_per_s:,.0f} tokens/s{mfu}, "
             f"{usage.restarts} restart(s), {end}"]
    if estimate:
        hours = _num(estimate.get("hours"))
        expected = expected_pace(estimate)
        parts = [f"{duration(hours * 3600)} wall-clock" if hours else None,
                 f"{_num(estimate.get('gpu_hours')):.2f} GPU-hours"
                 if _num(estimate.get("gpu_hours")) is not None else None,
                 f"cost {_money(_num(estimate.get('cost')))}"
                 if _num(estimate.get("cost")) is not None else None,
                 f"{expected:,.0f} tokens/s" if expected else None]
        lines.append("estimated: " + ", ".join(p for p in parts if p))
    return lines


def measured_from_events(events: list[Mapping[str, Any]], state: Any,
                         now: Optional[Any] = None) -> Measured:
    """`Measured` from a run's events (a local run's, or report's): the steady pace, the
    wall-clock of every segment (to `now`, a datetime, while it runs), the ETA at its cadence,
    the last data wait, restarts and resumes, the group's size."""
    from submitter.contract.events import eta_seconds
    from submitter.contract.usage import segments, steady_pace

    segs = segments(events)
    elapsed = sum(s.end - s.start for s in segs) if segs else None
    if segs and now is not None and state.status == "running":
        elapsed = (elapsed or 0.0) + max(0.0, now.timestamp() - segs[-1].end)
    wait = next((e.get("data_wait_fraction") for e in reversed(events)
                 if e.get("type") == "progress" and e.get("data_wait_fraction") is not None), None)
    resumes = sum(1 for e in events if e.get("type") == "run_resumed")
    return Measured(tokens_per_s=steady_pace(events), elapsed_s=elapsed,
                    eta_s=eta_seconds(state, now), restarts=state.restarts + resumes,
                    data_wait=_num(wait), workers=state.world_size or state.num_workers)


def measured_from_state(state: Any, elapsed_s: Optional[float], now: Optional[Any] = None,
                        data_wait: Optional[float] = None) -> Measured:
    """`Measured` from a folded ProgressState (a cluster job's ConfigMap): its latest pace and
    the job's wall-clock since it was created."""
    from submitter.contract.events import eta_seconds

    return Measured(tokens_per_s=state.tokens_per_sec, elapsed_s=elapsed_s,
                    eta_s=eta_seconds(state, now), restarts=state.restarts,
                    data_wait=data_wait, workers=state.world_size or state.num_workers)
