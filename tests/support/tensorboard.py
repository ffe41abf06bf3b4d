"""Read a run's TensorBoard event files back with TensorBoard's own loader (what a user's
`tensorboard --logdir` shows)."""

from __future__ import annotations


def scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)], over every run (event file directory) under logdir, by step."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    out: dict[str, list[tuple[int, float]]] = {}
    for run in mux.Runs():
        acc = mux.GetAccumulator(run)
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return {k: sorted(v) for k, v in out.items()}


def steps(logdir: str, tag: str = "train/loss") -> list[int]:
    return [s for s, _ in scalars(logdir).get(tag, [])]
