"""training.gpt2.input_path: a step's micro-batches in the source's order, a partial accumulation
dropped before any copy, per-step wait accounting, CPU tensors unchanged; on CUDA, pinned
buffers and side-stream copies one micro-batch ahead (gpu-marked)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from training.gpt2.input_path import InputPath, Staged, WaitShare  # noqa: E402

CPU = torch.device("cpu")


def _batches(n: int, rows: int = 2, cols: int = 4):
    for i in range(n):
        yield {"input_ids": np.full((rows, cols), i, dtype=np.int64)}


def _values(feed: InputPath, step) -> list[int]:
    return [int(feed.to_device(b)[0, 0]) for b in step]


def test_steps_hand_out_the_sources_batches_in_order():
    feed, source = InputPath(CPU), _batches(6)
    assert [_values(feed, feed.take(source, 3)) for _ in range(2)] == [[0, 1, 2], [3, 4, 5]]


def test_an_exhausted_source_gives_an_empty_step():
    feed, source = InputPath(CPU), _batches(2)
    assert len(feed.take(source, 2)) == 2
    assert len(feed.take(source, 2)) == 0
    assert len(feed.take(source, 2)) == 0


def test_a_partial_last_accumulation_is_short_and_nothing_of_it_is_copied():
    feed, source = InputPath(CPU), _batches(5)
    steps = [feed.take(source, 2) for _ in range(3)]
    assert [len(s) for s in steps] == [2, 2, 1]  # the loop breaks on len < accumulation
    assert steps[2][0].tensor is None  # not staged: the loop drops it before training on it


def test_the_first_micro_batch_is_staged_at_take_and_the_next_when_the_current_is_used():
    feed = InputPath(CPU)
    step = feed.take(_batches(3), 3)
    assert [s.tensor is not None for s in step] == [True, False, False]
    feed.to_device(step[0])
    assert [s.tensor is not None for s in step] == [True, True, False]  # one ahead
    feed.to_device(step[1])
    feed.to_device(step[2])
    assert all(s.tensor is not None for s in step)


def test_on_cpu_the_tensors_are_the_batches_themselves():
    """No pinning or copy on CPU: what the loop used before (torch.from_numpy)."""
    feed = InputPath(CPU)
    batches = list(_batches(2))
    step = feed.take(iter(batches), 2)
    for staged, batch in zip(step, batches):
        x = feed.to_device(staged)
        assert torch.equal(x, torch.from_numpy(batch["input_ids"]))
        assert x.data_ptr() == batch["input_ids"].ctypes.data  # shares the NumPy memory
    # evaluation's plain batches take the same path
    plain = {"input_ids": np.arange(8).reshape(2, 4)}
    assert feed.to_device(plain).data_ptr() == plain["input_ids"].ctypes.data
    assert feed.copies == 0  # no side-stream copies on CPU


def test_a_staged_batch_of_another_step_is_still_returned():
    feed = InputPath(CPU)
    old = feed.take(_batches(2), 2)
    feed.take(_batches(2), 2)
    assert int(feed.to_device(old[1])[0, 0]) == 1
    assert isinstance(old[1], Staged)


class _Clock:
    """A fake clock: the slow source and the step's compute advance it by set amounts."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _slow_source(clock: _Clock, slow_every: int, slow_s: float):
    """Batches whose fetch costs `slow_s` on the first micro-batch of every `slow_every`-th step
    (a Ray Data block being read and tokenized) and nothing otherwise."""
    for i in itertools.count():
        if i % (2 * slow_every) == 0:
            clock.now += slow_s
        yield {"input_ids": np.zeros((1, 4), dtype=np.int64)}


def test_the_wait_is_accounted_per_step_against_that_steps_time():
    """The loop's accounting with an injected slow source: 4 steps of 2 micro-batches, 1 s of
    compute each; the source costs 3 s on every other step. Between steps, a 10 s pause
    (evaluation, a checkpoint) is not step time and does not dilute the figure."""
    clock, feed = _Clock(), InputPath(CPU)
    source = _slow_source(clock, slow_every=2, slow_s=3.0)
    window, per_step = WaitShare(), []
    for _ in range(4):
        t_wait = clock()
        micro = feed.take(source, 2)
        waited = clock() - t_wait
        for batch in micro:
            feed.to_device(batch)
            clock.now += 0.5  # the micro-batch's forward and backward
        one = WaitShare()
        one.add(waited, clock() - t_wait)
        per_step.append(one.fraction())
        window.add(waited, clock() - t_wait)
        clock.now += 10.0  # not a step
    assert per_step == [0.75, 0.0, 0.75, 0.0]
    assert window.fraction() == pytest.approx(6.0 / 10.0)  # 6 s waited of 10 s of steps
    assert window.steps == 4


def test_an_empty_window_waited_nothing():
    assert WaitShare().fraction() == 0.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (pinned memory, streams)")
def test_cuda_copies_are_pinned_on_a_side_stream_one_ahead_and_equal_to_the_source():
    device = torch.device("cuda")
    feed = InputPath(device)
    batches = [{"input_ids": np.random.default_rng(i).integers(0, 50257, (64, 256))}
               for i in range(4)]
    step = feed.take(iter(batches), 4)
    assert feed.copies == 1 and step[0].event is not None
    weight = torch.randn(50257, 256, device=device)
    outs = []
    for k, staged in enumerate(step):
        x = feed.to_device(staged)
        assert feed.copies == min(k + 2, 4)  # the next copy is issued before this one is used
        assert x.device.type == "cuda"
        outs.append((x, weight[x].sum()))  # use it on the compute stream
    torch.cuda.synchronize()
    for (x, _), batch in zip(outs, batches):
        assert torch.equal(x.cpu(), torch.from_numpy(batch["input_ids"]))
    assert all(slot[0].is_pinned() for slot in feed._pool)
    assert feed.stream != torch.cuda.current_stream()
    plain = feed.to_device(batches[0])  # evaluation's path: pinned, on the compute stream
    assert torch.equal(plain.cpu(), torch.from_numpy(batches[0]["input_ids"]))
