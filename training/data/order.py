"""The order an epoch trains a prepared corpus's sequences in, computed, never replayed (pure).

A prepared corpus's training sequences are fixed windows of `block` tokens inside each shard
(a shard's tail shorter than a block is dropped), numbered 0..N-1 across the shards in order.
An epoch's order is a permutation of them that depends on (seed, epoch) alone, never on how
many workers read it, so a group that resizes continues the same global sequence (MosaicML
Streaming's "elastic determinism"). It keeps locality the way Streaming's `py1s` shuffle does:

1. the ids are cut into spans of `span` consecutive sequences (a few MB: one ranged read);
2. the spans are permuted (seed, epoch);
3. the stream of permuted spans is shuffled within windows of `window` spans (seed, epoch,
   window index): a reader needs at most `window` spans at a time, each fetched whole once.

Memory: O(N / span) for the span permutation plus O(window x span) for one window's shuffle.

A position is (epoch, sequences consumed in the epoch). Global step s of an epoch covers
positions [s*G, (s+1)*G) for a global batch of G sequences; rank r's slice is
[s*G + offset_r, s*G + offset_r + share_r), the offsets from submitter.contract.batch.shares.
A resume at a position computes the ids from it: nothing before it is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterator, Sequence

import numpy as np

#: Bytes one span should hold (one ranged read on a bucket).
SPAN_BYTES = 4 * 1024 * 1024
#: Spans shuffled together (what a reader holds at a time, at most).
WINDOW_SPANS = 8


def span_for(block: int, itemsize: int, target_bytes: int = SPAN_BYTES) -> int:
    """Sequences per span: about `target_bytes` of tokens, at least 1."""
    return max(1, target_bytes // (block * itemsize))


def sequences_in(tokens: int, block: int) -> int:
    """Whole sequences of `block` tokens in a shard of `tokens` (the tail is dropped)."""
    return tokens // block


@dataclass(frozen=True)
class EpochOrder:
    """Position -> sequence id for one epoch of `n` sequences (see the module's docstring)."""

    n: int
    seed: int
    epoch: int
    span: int = 1024
    window: int = WINDOW_SPANS
    _spans: np.ndarray = field(init=False, repr=False, compare=False)
    _starts: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.n < 0 or self.span < 1 or self.window < 1:
            raise ValueError("n >= 0, span >= 1 and window >= 1")
        count = -(-self.n // self.span)
        spans = np.random.default_rng([self.seed, self.epoch, 0]).permutation(count)
        # where each permuted span starts in the stream (the last span may be short)
        lengths = np.minimum(self.span, self.n - spans * self.span)
        starts = np.concatenate([[0], np.cumsum(lengths)])
        object.__setattr__(self, "_spans", spans)
        object.__setattr__(self, "_starts", starts)

    @property
    def window_size(self) -> int:
        """Positions per shuffle window (the last window may be shorter)."""
        return self.span * self.window

    def _window(self, j: int) -> np.ndarray:
        return _window_permutation(self.seed, self.epoch, j,
                                   min(self.window_size, self.n - j * self.window_size))

    def ids(self, start: int, stop: int) -> np.ndarray:
        """The sequence ids at positions [start, stop) (int64)."""
        if not 0 <= start <= stop <= self.n:
            raise IndexError(f"positions [{start}, {stop}) outside the epoch's {self.n}")
        out = np.empty(stop - start, dtype=np.int64)
        w = self.window_size
        p = start
        while p < stop:
            j, inside = divmod(p, w)
            take = min(stop - p, w - inside)
            stream = j * w + self._window(j)[inside:inside + take]  # stream positions
            k = np.searchsorted(self._starts, stream, side="right") - 1  # which permuted span
            out[p - start:p - start + take] = self._spans[k] * self.span + (stream - self._starts[k])
            p += take
        return out

    def __len__(self) -> int:
        return self.n


@lru_cache(maxsize=4)
def _window_permutation(seed: int, epoch: int, j: int, size: int) -> np.ndarray:
    """The shuffle of window j (cached: consecutive micro-batches share a window)."""
    perm = np.random.default_rng([seed, epoch, j + 1]).permutation(size)
    perm.setflags(write=False)
    return perm


def offsets(shares: Sequence[int]) -> list[int]:
    """Where each rank's slice of a step starts: the shares before it."""
    out, total = [], 0
    for s in shares:
        out.append(total)
        total += s
    return out


def steps_in_epoch(n: int, global_batch: int) -> int:
    """Whole optimizer steps an epoch of `n` sequences holds (a partial last step is dropped)."""
    return n // global_batch


def rank_positions(position: int, n: int, global_batch: int, offset: int, share: int
                   ) -> Iterator[tuple[int, int]]:
    """Rank's slice [start, stop) of each step from `position` (sequences consumed in the
    epoch) to the epoch's last whole step."""
    for base in range(position, n - global_batch + 1, global_batch):
        yield base + offset, base + offset + share
