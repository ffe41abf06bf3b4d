"""The order an epoch trains a prepared corpus's sequences in, computed, never replayed (pure).

A prepared corpus's training sequences are fixed windows of `block` tokens inside each shard
(a shard's tail shorter than a block is dropped), numbered 0..N-1 across the shards in order.
An epoch's order is a permutation of them that depends on (seed, epoch) alone, never on how
many workers read it, so a group that resizes continues the same global sequence (MosaicML
Streaming's "elastic determinism"). Two shuffles (`EpochOrder.shuffle`):

- `full` (a corpus on a volume, memory-mapped: a read anywhere costs nothing extra): a full
  permutation of the N sequences, a keyed Feistel cipher over [0, 2^2h) >= N with
  cycle-walking: O(1) time and memory per position, nothing of size N is ever built;
- `window` (a corpus in a bucket, read in whole spans of `span` consecutive sequences, one
  ranged read each): the spans are permuted (seed, epoch), the permuted spans are cut into
  windows of `window` spans, and each window's sequences are dealt round-robin over its spans
  (each round in van der Corput order of the span ids), each span's sequences in a random
  order (seed, epoch, window). Every
  run of `window` positions draws once from every span of its window, so a step of G
  sequences draws from min(G, window) spans (WINDOW_SPANS = 128 at SPAN_BYTES = 1 MiB: 128
  spans in 128 MiB, half the reader's cache), and each span gives every step of its window the
  same count: see `rank_ids`.

A position is (epoch, sequences consumed in the epoch). Global step s of an epoch holds the
sequences at positions [s*G, (s+1)*G) for a global batch of G; `rank_ids` sorts them (by id,
hence by span) and deals rank r the contiguous run [offset_r, offset_r + share_r), the offsets
from submitter.contract.batch.shares. The step's set never depends on the group's size; a rank's
run draws on few spans, and in `window` order on the same spans for a whole window, so the
ranks of a group fetch about one epoch from a bucket between them, not one each.
A resume at a position computes the ids from it: nothing before it is read.

`ORDER_VERSION` names this computation; a checkpoint records it with what the order depends on
(`order_pin`), and a resume mid-epoch refuses a change (`resume_order`; --restart-epoch
starts the epoch afresh instead). `MixtureOrder` mixes several corpora by weight (`--data
NAME:WEIGHT,...`), each in its own `EpochOrder`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np

from submitter.contract.data_path import MIX_ROUND  # a round's positions (mixtures)
from submitter.contract.errors import UsageError

#: The order's computation; bump it whenever a change reorders any epoch (checkpoints pin it).
ORDER_VERSION = 2
#: Bytes one span should hold (one ranged read on a bucket).
SPAN_BYTES = 1024 * 1024
#: Spans a `window` order deals together (a reader holds at most one window's, 128 MiB).
WINDOW_SPANS = 128
#: The shuffles: a full permutation (volume), or windows of whole spans (bucket).
FULL, WINDOW = "full", "window"
#: Feistel rounds of the full permutation.
ROUNDS = 6


def span_for(block: int, itemsize: int, target_bytes: int = SPAN_BYTES) -> int:
    """Sequences per span: about `target_bytes` of tokens, at least 1."""
    return max(1, target_bytes // (block * itemsize))


def sequences_in(tokens: int, block: int) -> int:
    """Whole sequences of `block` tokens in a shard of `tokens` (the tail is dropped)."""
    return tokens // block


_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """A keyed 64-bit hash of each element (splitmix64's finalizer); uint64 wraps."""
    with np.errstate(over="ignore"):
        z = (x ^ key) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _feistel(x: np.ndarray, half: int, keys: np.ndarray) -> np.ndarray:
    """A bijection of [0, 2^(2*half)) (balanced Feistel network)."""
    mask = np.uint64((1 << half) - 1)
    h = np.uint64(half)
    left, right = x >> h, x & mask
    for k in keys:
        left, right = right, left ^ (_mix(right, k) & mask)
    return (left << h) | right


def feistel_permute(positions: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """Position -> its image under a keyed permutation of [0, n): the Feistel bijection of the
    smallest even-bit domain holding n (at most 4n), cycle-walked back into [0, n). O(1) per
    position (a few walks expected), no table."""
    x = np.asarray(positions, dtype=np.uint64)
    if n <= 1:
        return x.astype(np.int64)
    half = max(1, -(-int(n - 1).bit_length() // 2))
    y = _feistel(x, half, keys)
    out = y >= np.uint64(n)
    while out.any():  # cycle-walking: the orbit of a point < n returns below n
        y[out] = _feistel(y[out], half, keys)
        out = y >= np.uint64(n)
    return y.astype(np.int64)


@dataclass(frozen=True)
class EpochOrder:
    """Position -> sequence id for one epoch of `n` sequences (see the module's docstring)."""

    n: int
    seed: int
    epoch: int
    span: int = 1024
    window: int = WINDOW_SPANS
    shuffle: str = WINDOW
    _spans: np.ndarray = field(init=False, repr=False, compare=False)
    _starts: np.ndarray = field(init=False, repr=False, compare=False)
    _keys: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.n < 0 or self.span < 1 or self.window < 1 or self.shuffle not in (FULL, WINDOW):
            raise ValueError("n >= 0, span >= 1, window >= 1, shuffle full|window")
        keys = np.random.default_rng([self.seed, self.epoch, ORDER_VERSION]).integers(
            0, 2**63, ROUNDS, dtype=np.uint64)
        object.__setattr__(self, "_keys", keys)
        count = -(-self.n // self.span)
        spans = np.random.default_rng([self.seed, self.epoch, 0]).permutation(count)
        # where each permuted span starts in the stream (the last span may be short)
        lengths = np.minimum(self.span, self.n - spans * self.span)
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        object.__setattr__(self, "_spans", spans)
        object.__setattr__(self, "_starts", starts)

    @property
    def window_size(self) -> int:
        """Positions per window of full spans (a window holding the short span is shorter)."""
        return self.span * self.window

    def _window(self, j: int) -> np.ndarray:
        spans = self._spans[j * self.window:(j + 1) * self.window]
        return _window_ids(self.seed, self.epoch, j, tuple(int(k) for k in spans),
                           self.span, self.n)

    def ids(self, start: int, stop: int) -> np.ndarray:
        """The sequence ids at positions [start, stop) (int64)."""
        if not 0 <= start <= stop <= self.n:
            raise IndexError(f"positions [{start}, {stop}) outside the epoch's {self.n}")
        if self.shuffle == FULL:
            return feistel_permute(np.arange(start, stop, dtype=np.uint64), self.n, self._keys)
        out = np.empty(stop - start, dtype=np.int64)
        first = self._starts[::self.window]  # where each window starts
        p = start
        while p < stop:
            j = int(np.searchsorted(first, p, side="right")) - 1
            w0 = int(first[j])
            local = self._window(j)
            take = min(stop - p, w0 + len(local) - p)
            out[p - start:p - start + take] = local[p - w0:p - w0 + take]
            p += take
        return out

    def __len__(self) -> int:
        return self.n


@lru_cache(maxsize=4)
def _window_ids(seed: int, epoch: int, j: int, spans: tuple[int, ...], span: int,
                n: int) -> np.ndarray:
    """Window j's sequence ids in stream order (cached: a window serves many steps)."""
    k = np.sort(np.asarray(spans, dtype=np.int64))             # the window's spans, by id
    c = np.minimum(span, n - k * span)                          # their sizes (one may be short)
    owner = np.repeat(np.arange(len(k)), c)                     # span of each element
    first = np.concatenate([[0], np.cumsum(c)[:-1]])
    e = np.arange(len(owner)) - first[owner]                    # element index in its span
    # round-robin over the spans, each round in van der Corput order: any run of a round
    # spreads over the span ids evenly, so a step's runs by id start at stable spans
    slot = np.argsort(_radical_inverse(len(k)), kind="stable")  # span i's turn in a round
    stream = np.lexsort((slot[owner], (e + 0.5) / c[owner]))
    noise = np.random.default_rng([seed, epoch, j + 1]).random(len(owner))
    inner = np.lexsort((noise, owner))                          # each span's sequences shuffled
    ids = (k[owner] * span - first[owner] + inner)[stream]
    ids.setflags(write=False)
    return ids


def _radical_inverse(m: int) -> np.ndarray:
    """Base-2 van der Corput values of 0..m-1 (bits of i mirrored after the binary point)."""
    i = np.arange(m, dtype=np.int64)
    out = np.zeros(m)
    scale = 0.5
    while i.any():
        out += (i & 1) * scale
        i >>= 1
        scale /= 2
    return out


def rank_ids(order: EpochOrder, base: int, global_batch: int, offset: int,
             share: int) -> np.ndarray:
    """A rank's sequences of the step at `base`: the step's ids sorted, positions
    [offset, offset + share) of them (a contiguous run: as few spans as the step allows)."""
    step = np.sort(order.ids(base, min(base + global_batch, order.n)))
    return step[offset:offset + share]


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


def step_bases(position: int, n: int, global_batch: int) -> range:
    """The first position of each step from `position` to the epoch's last whole step."""
    return range(position, n - global_batch + 1, global_batch)


def rank_positions(position: int, n: int, global_batch: int, offset: int, share: int
                   ) -> Iterator[tuple[int, int]]:
    """Rank's slice [start, stop) of each step from `position` (sequences consumed in the
    epoch) to the epoch's last whole step, as positions (before `rank_ids` deals by id)."""
    for base in step_bases(position, n, global_batch):
        yield base + offset, base + offset + share


# --- what a checkpoint pins ---------------------------------------------------------------------

def corpus_fingerprint(source_fingerprint: Any, shards: Sequence[tuple[str, int]]) -> str:
    """One string for what a corpus holds: its source's fingerprint and its training shards
    (names and token counts); a re-prepared or altered corpus gives another."""
    doc = json.dumps([source_fingerprint, [list(s) for s in shards]], sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def order_pin(order: EpochOrder, block: int, corpus: str) -> dict[str, Any]:
    """What an epoch's order depends on besides (seed, epoch): a checkpoint saves it."""
    return {"order_version": ORDER_VERSION, "corpus": corpus, "sequences": order.n,
            "block": block, "shuffle": order.shuffle, "span": order.span,
            "window": order.window}


#: How the refusal names each pinned field.
_PIN_WORDS = {"order_version": "the order's version (a new image)", "corpus": "the corpus",
              "sequences": "the sequence count", "block": "the block size",
              "shuffle": "the shuffle (volume vs bucket)", "span": "the span",
              "window": "the window"}


def pin_changes(saved: Optional[Mapping[str, Any]], now: Mapping[str, Any]) -> list[str]:
    """The pinned fields that differ, as words ([] when the order is the same). A checkpoint
    without a pin (before ORDER_VERSION 2) differs in the order's version."""
    if not saved:
        return [f"{_PIN_WORDS['order_version']}: 1 -> {now['order_version']}"]
    return [f"{_PIN_WORDS.get(k, k)}: {saved.get(k)} -> {v}"
            for k, v in now.items() if saved.get(k) != v]


#: The flag that starts a resumed epoch afresh when its order no longer holds.
RESTART_FLAG = "--restart-epoch"


class OrderChanged(UsageError):
    """A checkpoint's epoch cannot continue: what its order depended on has changed."""


def resume_order(saved: Optional[Mapping[str, Any]], now: Mapping[str, Any], position: int,
                 epoch: int, restart: bool = False) -> int:
    """Where the resumed epoch continues: `position` when the checkpoint's pin (`saved`) is
    today's (`now`) or nothing of the epoch was trained yet; 0 (the epoch afresh) when it
    changed and `restart` says so; else OrderChanged (one line, exit 2): continuing would
    train some sequences twice and skip others."""
    if position == 0:
        return 0
    changes = pin_changes(saved, now)
    if not changes:
        return position
    if restart:
        return 0
    raise OrderChanged(
        f"the checkpoint is {position:,} sequences into epoch {epoch + 1}, in an order that no "
        f"longer holds ({'; '.join(changes)}): continuing would repeat some sequences and skip "
        f"others. Train with the corpus and settings it was made with, or start epoch "
        f"{epoch + 1} afresh on purpose with {RESTART_FLAG} (the model keeps its training; the "
        f"epoch's sequences so far are seen again)")


# --- mixtures ---------------------------------------------------------------------------------



def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """`total` split in proportion to `weights` (largest remainders; ties to the first)."""
    whole = sum(weights)
    quotas = [total * w / whole for w in weights]
    counts = [int(q) for q in quotas]
    by_rest = sorted(range(len(weights)), key=lambda c: (-(quotas[c] - counts[c]), c))
    for c in by_rest[:total - sum(counts)]:
        counts[c] += 1
    return counts


@lru_cache(maxsize=8)
def _round_table(counts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A round's positions -> (corpus, its element in the round): each corpus's elements
    spread evenly over the round (time (j + 0.5) / count), so any run of a round follows the
    proportions within a sequence or two per corpus."""
    owner = np.repeat(np.arange(len(counts)), counts)
    j = np.concatenate([np.arange(k) for k in counts]) if counts else np.zeros(0, np.int64)
    times = (j + 0.5) / np.asarray(counts, dtype=np.float64)[owner]
    pick = np.lexsort((owner, times))
    return owner[pick], j[pick]


@lru_cache(maxsize=16)
def _corpus_order(n: int, seed: int, turn: int, span: int, window: int,
                  shuffle: str) -> EpochOrder:
    return EpochOrder(n, seed, turn, span, window, shuffle)


def corpus_seed(seed: int, c: int) -> int:
    """Corpus c's own seed in a mixture (its order is independent of the others')."""
    return int(np.random.default_rng([seed, c, ORDER_VERSION]).integers(0, 2**62))


@dataclass(frozen=True)
class MixtureOrder:
    """Position -> sequence id for one epoch of several corpora mixed by weight.

    Ids are global: corpus c's sequence j is `bases[c] + j` (the corpora one after the other).
    The stream is cut into rounds of MIX_ROUND positions, each holding every corpus's share
    of it (`apportion`) interleaved evenly, so every step follows the proportions. Corpus c's
    k-th sequence of the whole run (over epochs) is position k % n_c of its own order
    `EpochOrder(n_c, corpus_seed(seed, c), k // n_c)`: a corpus drawn faster than the others
    starts its next pass, one drawn slower continues where the last epoch left it. An epoch is
    sum(n_c) positions. Pure, and free of the group's size: a resize continues the mixture.
    """

    sizes: tuple[int, ...]
    weights: tuple[float, ...]
    seed: int
    epoch: int
    span: int = 1024
    window: int = WINDOW_SPANS
    shuffle: str = WINDOW

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.weights) or min(self.sizes) < 1:
            raise ValueError("one size (>= 1) per weight")
        if min(self.counts) < 1:
            raise ValueError(f"a weight under 1/{MIX_ROUND} of the total")

    @property
    def counts(self) -> list[int]:
        return apportion(MIX_ROUND, self.weights)

    @property
    def n(self) -> int:
        return sum(self.sizes)

    @property
    def bases(self) -> list[int]:
        return [sum(self.sizes[:c]) for c in range(len(self.sizes))]

    def ids(self, start: int, stop: int) -> np.ndarray:
        """The global sequence ids at positions [start, stop) (int64)."""
        if not 0 <= start <= stop <= self.n:
            raise IndexError(f"positions [{start}, {stop}) outside the epoch's {self.n}")
        counts = self.counts
        owner, j = _round_table(tuple(counts))
        t = self.epoch * self.n + np.arange(start, stop, dtype=np.int64)
        r, i = np.divmod(t, MIX_ROUND)
        c_of = owner[i]
        k = r * np.asarray(counts, dtype=np.int64)[c_of] + j[i]  # the corpus's k-th draw
        out = np.empty(stop - start, dtype=np.int64)
        for c, (size, base) in enumerate(zip(self.sizes, self.bases)):
            mine = np.flatnonzero(c_of == c)
            if not len(mine):
                continue
            draws = k[mine]  # consecutive: one contiguous run of this corpus's stream
            got, d = [], int(draws[0])
            while d <= int(draws[-1]):
                turn, at = divmod(d, size)
                take = min(size - at, int(draws[-1]) - d + 1)
                order = _corpus_order(size, corpus_seed(self.seed, c), turn, self.span,
                                      self.window, self.shuffle)
                got.append(order.ids(at, at + take))
                d += take
            out[mine] = base + np.concatenate(got)
        return out

    def __len__(self) -> int:
        return self.n
