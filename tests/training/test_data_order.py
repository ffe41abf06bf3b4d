"""An epoch's order of a prepared corpus's sequences: a permutation computed from (seed,
epoch) alone, the same for every group size, local enough to read spans whole."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from submitter.contract.batch import shares
from training.data.order import (FULL, MIX_ROUND, ORDER_VERSION, SPAN_BYTES, WINDOW,
                                 WINDOW_SPANS, EpochOrder, MixtureOrder, OrderChanged,
                                 apportion, offsets, order_pin, rank_ids, rank_positions,
                                 resume_order, span_for, step_bases, steps_in_epoch)
from training.data.reader import CACHE_BYTES

orders = st.builds(EpochOrder, n=st.integers(0, 3000), seed=st.integers(0, 2**32 - 1),
                   epoch=st.integers(0, 50), span=st.integers(1, 64), window=st.integers(1, 8),
                   shuffle=st.sampled_from([FULL, WINDOW]))


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


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2000), seed=st.integers(0, 1000), global_batch=st.integers(1, 64),
       world=st.integers(1, 9), shuffle=st.sampled_from([FULL, WINDOW]))
def test_ranks_deal_each_step_s_sequences_once(n, seed, global_batch, world, shuffle):
    """rank_ids: the ranks' runs of a step are disjoint and together the step, whatever the
    group's size (so exactly-once and a resize hold as before the dealing)."""
    if world > global_batch:
        return
    order = EpochOrder(n, seed, 0, span=8, window=4, shuffle=shuffle)
    split = shares(global_batch, world)
    for base in step_bases(0, n, global_batch):
        got = [rank_ids(order, base, global_batch, off, share).tolist()
               for off, share in zip(offsets(split), split)]
        assert [len(g) for g in got] == split
        assert sum(got, []) == sorted(order.ids(base, base + global_batch).tolist())


def test_a_full_permutation_is_computed_per_position_without_a_table():
    """On a volume: any sequence can follow any other (a step spans the corpus), and a
    position of a 10^7-sequence epoch costs no array of the epoch's size."""
    import tracemalloc

    n = 10_000_000
    order = EpochOrder(n, 5, 0, span=512, shuffle=FULL)
    tracemalloc.start()
    step = order.ids(7_000_000, 7_000_512)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000  # bytes: not O(n) (an int64 table of n would be 80 MB)
    assert len(set(step.tolist())) == 512 and step.min() >= 0 and step.max() < n
    assert len(set((step // 512).tolist())) > 490  # ~512 random spans of 19,532
    assert step.max() - step.min() > n // 2


def test_a_bucket_step_draws_from_at_least_64_spans_within_the_cache():
    """On a bucket: a step of gpt2-small (512 x 1024 tokens, 1 MiB spans) draws from at
    least 64 distinct spans, and one window's spans fit in half the reader's cache."""
    span = span_for(1024, 2)
    assert WINDOW_SPANS * SPAN_BYTES <= CACHE_BYTES // 2
    order = EpochOrder(span * 1000 + 17, 3, 1, span=span, shuffle=WINDOW)
    for base in range(0, order.n - 512, 512 * 37):
        assert len(np.unique(order.ids(base, base + 512) // span)) >= 64


def _spans_fetched(order, global_batch, world):
    """Spans each rank touches over the epoch, summed over the ranks (what a bucket serves
    when a rank fetches a span whole once per window), and the epoch's spans."""
    split = shares(global_batch, world)
    touched = [set() for _ in range(world)]
    for base in step_bases(0, order.n, global_batch):
        for r, (off, share) in enumerate(zip(offsets(split), split)):
            touched[r] |= set((rank_ids(order, base, global_batch, off, share)
                               // order.span).tolist())
    return sum(len(t) for t in touched), -(-order.n // order.span)


@pytest.mark.parametrize("global_batch, world", [(512, 8), (500, 8), (480, 6), (64, 8)])
def test_ranks_of_a_bucket_group_fetch_about_one_epoch_between_them(global_batch, world):
    """Bucket reads by share: each rank's run of a step keeps to the same few spans for a
    whole window, so all ranks together fetch at most 1.5x the epoch's spans (each rank
    reading every span of its steps: world x)."""
    order = EpochOrder(WINDOW_SPANS * 16 * 3 + 5, 9, 2, span=16, shuffle=WINDOW)
    fetched, spans = _spans_fetched(order, global_batch, world)
    assert fetched <= 1.5 * spans


def test_a_resume_continues_only_the_order_its_checkpoint_pinned():
    """The checkpoint pins what the order depends on: the same pin continues at the position,
    any change refuses in one line (exit 2) naming the flag that restarts the epoch, which
    then starts it at 0; a checkpoint at an epoch's start, or at its end, has nothing to
    continue."""
    order = EpochOrder(1000, 1, 0, span=10, shuffle=FULL)
    pin = order_pin(order, 64, "corpus-a")
    assert pin["order_version"] == ORDER_VERSION >= 2
    assert resume_order(pin, dict(pin), 96, 2) == 96
    assert resume_order({**pin, "corpus": "b"}, pin, 0, 2) == 0
    changed = [{**pin, "corpus": "corpus-b"}, {**pin, "sequences": 999}, {**pin, "block": 32},
               {**pin, "shuffle": WINDOW}, {**pin, "span": 11}, {**pin, "window": 64},
               {**pin, "order_version": 1}, None]  # None: a checkpoint from before the pin
    for saved in changed:
        with pytest.raises(OrderChanged, match="--restart-epoch") as e:
            resume_order(saved, pin, 96, 2)
        assert "\n" not in str(e.value) and e.value.exit_code == 2
        assert "epoch 3" in str(e.value)
        assert resume_order(saved, pin, 96, 2, restart=True) == 0
    # the pin follows the order's parameters
    assert order_pin(EpochOrder(1000, 1, 0, span=10, shuffle=WINDOW), 64, "corpus-a") != pin


def test_a_mixture_follows_its_weights_every_step_and_continues_across_epochs():
    """--data a:0.7,b:0.3: every step holds each corpus's share (within two sequences), a
    slice is the whole order's slice (a resume), the order is free of the group's size (a
    resize deals the same steps), and each corpus is drawn in passes over all its sequences,
    continued from one epoch to the next."""
    sizes, g = (3000, 500), 64
    mix = [MixtureOrder(sizes, (0.7, 0.3), 4, e, span=16, window=8) for e in range(3)]
    m = mix[0]
    assert m.n == 3500 and m.counts == apportion(MIX_ROUND, (0.7, 0.3)) == [717, 307]
    for base in step_bases(0, m.n, g):
        step = m.ids(base, base + g)
        assert abs(int(np.sum(step >= 3000)) - 0.3 * g) <= 2
    assert m.ids(777, 1900).tolist() == m.ids(0, m.n)[777:1900].tolist()
    for world in (2, 3):
        split = shares(g, world)
        for base in step_bases(0, m.n, g)[:5]:
            dealt = sum((rank_ids(m, base, g, o, s).tolist()
                         for o, s in zip(offsets(split), split)), [])
            assert dealt == sorted(m.ids(base, base + g).tolist())
    # corpus b (500 sequences, 30% of 3,500 an epoch: 1,050 draws) in passes of 500
    b_draws = [i - 3000 for e in mix for i in e.ids(0, e.n).tolist() if i >= 3000]
    for p in range(len(b_draws) // 500):
        assert sorted(b_draws[p * 500:(p + 1) * 500]) == list(range(500))
    a_draws = [i for e in mix for i in e.ids(0, e.n).tolist() if i < 3000]
    assert sorted(a_draws[:3000]) == list(range(3000))  # a's first pass spans epochs 0-1
    assert MixtureOrder(sizes, (0.7, 0.3), 5, 0, span=16, window=8).ids(0, 64).tolist() != \
        m.ids(0, 64).tolist()


def test_the_mixture_syntax_and_its_refusals():
    from submitter.contract.data_path import data_path, mixture, mixture_problem

    assert mixture("fineweb-edu:0.7,stack:0.3") == (("fineweb-edu", 0.7), ("stack", 0.3))
    assert mixture("a:2,b:1,c:1") == (("a", 2.0), ("b", 1.0), ("c", 1.0))  # need not sum to 1
    chosen = data_path("fineweb-edu:0.7,stack:0.3", "x")
    assert chosen.kind == "prepared" and chosen.mixture
    assert "fineweb-edu 70%, stack 30%" in chosen.why
    for single in ("fineweb-edu", "s3://b/corpora/c", "/mnt/c/manifest.json", "x.txt"):
        assert mixture(single) == () and mixture_problem(single) is None
    assert "positive number" in mixture_problem("a:0,b:1")
    assert "positive number" in mixture_problem("a:x,b:1")
    assert "twice" in mixture_problem("a:1,a:2")
    assert "1/1024" in mixture_problem("a:10000,b:1")
