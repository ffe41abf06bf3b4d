"""An epoch's order of a prepared corpus's sequences: a permutation computed from (seed,
epoch) alone, the same for every group size, local enough to read spans whole."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from submitter.contract.batch import shares
from training.data.order import EpochOrder, offsets, rank_positions, steps_in_epoch

orders = st.builds(EpochOrder, n=st.integers(0, 3000), seed=st.integers(0, 2**32 - 1),
                   epoch=st.integers(0, 50), span=st.integers(1, 64), window=st.integers(1, 8))


@settings(max_examples=60, deadline=None)
@given(orders)
def test_an_epoch_is_a_permutation_of_its_sequences(order):
    ids = order.ids(0, order.n)
    assert sorted(ids.tolist()) == list(range(order.n))


@settings(max_examples=60, deadline=None)
@given(orders, st.data())
def test_any_slice_is_the_whole_order_s_slice(order, data):
    """Position -> id needs nothing before the position: a slice computed alone is the
    same as that part of the whole epoch (a resume reads from its position)."""
    start = data.draw(st.integers(0, order.n))
    stop = data.draw(st.integers(start, order.n))
    assert order.ids(start, stop).tolist() == order.ids(0, order.n)[start:stop].tolist()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2000), seed=st.integers(0, 1000), epoch=st.integers(0, 5),
       global_batch=st.integers(1, 64), worlds=st.lists(st.integers(1, 9), min_size=2,
                                                         max_size=4))
def test_every_group_size_trains_the_same_sequences_in_the_same_steps(
        n, seed, epoch, global_batch, worlds):
    """Each step's sequences are the same set whatever the group's size, and its ranks'
    slices are disjoint: the order never depends on the worker count."""
    order = EpochOrder(n, seed, epoch, span=16)
    seen = []
    for world in worlds:
        if world > global_batch:
            continue
        split = shares(global_batch, world)
        steps: list[list[int]] = [[] for _ in range(steps_in_epoch(n, global_batch))]
        for rank, (off, share) in enumerate(zip(offsets(split), split)):
            for s, (a, b) in enumerate(rank_positions(0, n, global_batch, off, share)):
                steps[s].extend(order.ids(a, b).tolist())
        for step in steps:
            assert len(step) == len(set(step)) == global_batch
        seen.append([sorted(step) for step in steps])
    assert all(s == seen[0] for s in seen)


def test_epochs_and_seeds_differ_and_a_restart_repeats():
    a, b = EpochOrder(5000, 1, 0, span=32), EpochOrder(5000, 1, 1, span=32)
    assert a.ids(0, 5000).tolist() != b.ids(0, 5000).tolist()
    assert a.ids(0, 5000).tolist() != EpochOrder(5000, 2, 0, span=32).ids(0, 5000).tolist()
    assert a.ids(0, 5000).tolist() == EpochOrder(5000, 1, 0, span=32).ids(0, 5000).tolist()


def test_a_window_of_positions_draws_on_a_few_whole_spans():
    """Locality: positions of one shuffle window fall in at most `window` spans (a reader
    fetches those whole), and the spans of the epoch come in a shuffled order."""
    order = EpochOrder(100_000, 7, 0, span=100, window=4)
    for w in range(0, 100_000, order.window_size):
        spans = set((order.ids(w, min(w + order.window_size, 100_000)) // 100).tolist())
        assert len(spans) <= 4
    first_spans = (order.ids(0, 100_000) // 100)[::400]
    assert first_spans.tolist() != sorted(first_spans.tolist())
    assert order._spans.nbytes <= 8 * 1000  # O(sequences / span)
