"""One human line per training event: the same wording in `submit --local` and `watch`.

Pure formatting of the events defined in `submitter.contract.events`; no I/O, no heavy imports.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from submitter.contract.events import duration


def fmt(value: Any, spec: str = ".4f") -> str:
    return "n/a" if value is None else format(value, spec)


def describe(event: Mapping[str, Any]) -> Optional[str]:
    """One human line per event (None: not worth a line)."""
    t = event.get("type")
    if t == "run_started" and "corpus" in event:
        return f"prepare {event['run_name']} started: {event['num_workers']} CPU(s), corpus {event['corpus']}"
    if t == "prepare_progress":
        return (f"shard {event['shards_done']}/{event['shards']} written  "
                f"{event['tokens']:,} tokens  {fmt(event['tokens_per_sec'], ',.0f')} tok/s")
    if t == "run_finished" and "corpus" in event:
        already = " (prepared before: nothing written)" if event.get("already") else ""
        return (f"corpus ready{already}: {event.get('shards')} training shard(s), "
                f"{fmt(event.get('tokens'), ',')} training and {fmt(event.get('val_tokens'), ',')} "
                f"validation tokens{f' ({hold})' if (hold := event.get('hold_out')) else ''} "
                f"in {event['corpus']}")
    if t == "run_started":
        return (f"run {event['run_name']} started: {event['num_workers']} worker(s), "
                f"{event.get('epochs', '?')} epoch(s) x {event.get('steps_per_epoch', '?')} steps, "
                f"storage {event['storage_path']}")
    if t == "progress" and "metrics" in event:  # a --script run: its own metric names
        return script_progress(event)
    if t == "progress":
        return (f"epoch {event['epoch']} step {event['step']:>5}  loss {fmt(event['loss'])}  "
                f"lr {fmt(event['lr'], '.2e')}  {fmt(event['tokens_per_sec'], ',.0f')} tok/s")
    if t == "epoch_finished":
        return (f"epoch {event['epoch']} done: train_loss {fmt(event['train_loss'])}  "
                f"{val_loss_text(event.get('val_loss'))}  "
                f"{fmt(event['tokens_per_sec'], ',.0f')} tok/s")
    if t == "checkpoint_saved":
        why = (f" ({event['reason'].replace('_', ' ')})"
               if event.get("reason") in ("preemption", "deadline", "max_cost") else "")
        return f"checkpoint saved{why}: {event['path']}"
    if t == "worker_group_restarted":
        return (f"worker group restarted (attempt {event['attempt']}), resumed from "
                f"{event['resumed_from'] or 'scratch (no checkpoint yet)'}")
    if t == "worker_group_resized":
        batch = event.get("global_batch_size")
        same = f", {batch} sequences per step" if batch is not None else ""
        return (f"worker group resized: {event['from']} -> {event['to']} worker(s){same}, "
                f"resumed from {event.get('resumed_from') or 'scratch (no checkpoint yet)'}")
    if t == "run_resumed":
        return f"resuming from {event['resumed_from']} (epoch {event['epoch']}, step {event['step']})"
    if t == "run_failed":
        return f"FAILED: {event['error']}"
    if t == "run_stopped":
        return f"STOPPED ({event['reason']}): {event['message']}"
    if t == "run_finished":
        return "training finished"
    if t == "tracker_failed":
        return (f"tracker {event['tracker']} failed ({event['error']}); training goes on, "
                "retrying with backoff")
    if t == "tracker_recovered":
        return f"tracker {event['tracker']} is back (down {fmt(event.get('down_s'), '.0f')} s), catching up"
    return None




#: What a run without validation says instead of a val_loss (and of a best checkpoint).
NO_VALIDATION = "no validation split"
NO_VALIDATION_CHECKPOINTS = f"{NO_VALIDATION}: checkpoints kept by recency"


def val_loss_text(val_loss: Any) -> str:
    """`val_loss 2.1234`, or plainly that nothing was validated (not `val_loss n/a`): the
    corpus has no validation split, or one smaller than a micro-batch per worker."""
    return NO_VALIDATION if val_loss is None else f"val_loss {fmt(val_loss)}"


#: The most metrics of a script's report one line shows.
SCRIPT_METRICS_SHOWN = 6


def script_progress(event: Mapping[str, Any]) -> str:
    """A --script run's report: its epoch and step, then its own metrics; once, when the run
    had a checkpoint but the report starts from scratch, a line saying so."""
    shown = [(k, v) for k, v in sorted(event["metrics"].items()) if k not in ("epoch", "step")]
    line = f"epoch {event['epoch']} step {event['step']:>5}  " + "  ".join(
        f"{k} {fmt(v, '.4g')}" for k, v in shown[:SCRIPT_METRICS_SHOWN])
    if event.get("from_scratch"):
        line += (f"\nwarning: the run had a checkpoint ({event['from_scratch']}) but the script's "
                 "first report starts from scratch: call ray.train.get_checkpoint() at the start "
                 "of the training function (docs/own-script.md)")
    return line


def eta_text(progress: Any, now: Any = None) -> Optional[str]:
    """`ETA 12m30s (step 120/1000 at 0.85 s/step)` from a ProgressState, None when unknown."""
    from submitter.contract.events import eta_seconds

    left = eta_seconds(progress, now)
    if left is None:
        return None
    return (f"ETA {duration(left)} (step {progress.step}/{progress.total_steps} at "
            f"{progress.seconds_per_step:.2f} s/step)")
