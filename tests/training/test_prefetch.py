"""training.gpt2.loop.Prefetched: the first batch is fetched in the background while the model is
built; what the loop sees is the source's items, in order, with errors raised in its thread."""

from __future__ import annotations

import threading

import pytest

from training.gpt2.loop import Prefetched


def test_items_arrive_in_order_and_the_first_one_was_fetched_in_another_thread():
    fetched_in: list[str] = []

    def source():
        for i in range(5):
            fetched_in.append(threading.current_thread().name)
            yield i

    it = Prefetched(source())
    assert list(it) == [0, 1, 2, 3, 4]
    assert fetched_in[0] == "prefetch-first"
    assert set(fetched_in[1:]) == {threading.current_thread().name}


def test_the_first_fetch_starts_before_anyone_asks():
    started = threading.Event()

    def source():
        started.set()
        yield "batch"

    it = Prefetched(source())
    assert started.wait(5)  # the pipeline warms up while the caller builds the model
    assert next(it) == "batch"
    assert next(it, None) is None


def test_an_empty_source_ends_at_once():
    assert list(Prefetched(iter(()))) == []


def test_a_failing_source_raises_in_the_callers_thread_once():
    def source():
        raise RuntimeError("object store lost")
        yield  # pragma: no cover

    it = Prefetched(source())
    with pytest.raises(RuntimeError, match="object store lost"):
        next(it)
    assert next(it, None) is None
