"""The prepared corpus's shuffle, before and after issue #37 (not a test; prints two tables).

- **mix**: a corpus of two sources concatenated, a minority (10%) then a majority (90%), as a
  directory sorted by name gives; gpt2-small's step (512 sequences of 1,024 uint16 tokens).
  For each order: the distinct spans a step draws from (in that order's own spans), and the
  spread of the minority's share across steps (mean, std, min-max). `before` is the order of
  main before #37, reimplemented here (4 MiB spans permuted, shuffled in windows of 8);
  `bucket` and `volume` are training.data.order's `window` and `full` shuffles.
- **bytes**: bytes all ranks of an 8-rank group fetch from a bucket (moto's S3 server on
  127.0.0.1) over one epoch, against the epoch's bytes. Each rank is a reader of its own (a
  fresh cache, as in its own process). `before`: each rank reads its positions' sequences of
  the old order (the old reader's deal); `after`: CorpusReader.batches (training.data.order's
  `rank_ids`). Spans are scaled by --span-kib (the ratio does not depend on it; 1024 is the
  real size, 128 MiB a window).

    python benchmarks/bench_shuffle.py                      # ~1 minute
    python benchmarks/bench_shuffle.py --span-kib 1024      # real spans: a 200 MB corpus

The bucket needs moto's server: $SUBMITTER_MOTO_PYTHON or this interpreter with moto[server].
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BLOCK, GLOBAL, WORLD, MICRO, ITEM = 1024, 512, 8, 16, 2
OLD_SPAN_BYTES, OLD_WINDOW = 4 * 1024 * 1024, 8


class BeforeOrder:
    """The order before #37 (training/data/order.py at main 434a767): spans permuted, then
    shuffled within windows of `window` spans; ranks took their positions unsorted."""

    def __init__(self, n: int, seed: int, epoch: int, span: int, window: int = OLD_WINDOW):
        self.n, self.seed, self.epoch, self.span, self.window = n, seed, epoch, span, window
        count = -(-n // span)
        self.spans = np.random.default_rng([seed, epoch, 0]).permutation(count)
        lengths = np.minimum(span, n - self.spans * span)
        self.starts = np.concatenate([[0], np.cumsum(lengths)])
        self._cache: dict[int, np.ndarray] = {}

    def _window(self, j: int) -> np.ndarray:
        if j not in self._cache:
            size = min(self.span * self.window, self.n - j * self.span * self.window)
            self._cache = {j: np.random.default_rng([self.seed, self.epoch, j + 1])
                           .permutation(size)}
        return self._cache[j]

    def ids(self, start: int, stop: int) -> np.ndarray:
        out, w, p = np.empty(stop - start, dtype=np.int64), self.span * self.window, start
        while p < stop:
            j, inside = divmod(p, w)
            take = min(stop - p, w - inside)
            stream = j * w + self._window(j)[inside:inside + take]
            k = np.searchsorted(self.starts, stream, side="right") - 1
            out[p - start:p - start + take] = self.spans[k] * self.span + (stream - self.starts[k])
            p += take
        return out


def mix_table(n: int, steps: int) -> None:
    from training.data.order import FULL, WINDOW, EpochOrder, span_for

    minority = n // 10  # ids [0, minority) are the 10% source
    new_span = span_for(BLOCK, ITEM)
    orders = {"before": (BeforeOrder(n, 1337, 0, OLD_SPAN_BYTES // (BLOCK * ITEM)),
                         OLD_SPAN_BYTES // (BLOCK * ITEM)),
              "bucket": (EpochOrder(n, 1337, 0, new_span, shuffle=WINDOW), new_span),
              "volume": (EpochOrder(n, 1337, 0, new_span, shuffle=FULL), new_span)}
    print(f"mix: {n:,} sequences of {BLOCK} (10% minority first), {steps} steps of {GLOBAL}")
    print(f"{'order':8} {'span MiB':>8} {'spans/step':>10} {'minority share':>15} "
          f"{'std':>7} {'min-max':>13}")
    for name, (order, span) in orders.items():
        stride = max(1, (n // GLOBAL) // steps)
        spans, share = [], []
        for s in range(0, n // GLOBAL, stride)[:steps]:
            ids = order.ids(s * GLOBAL, (s + 1) * GLOBAL)
            spans.append(len(np.unique(ids // span)))
            share.append(float(np.mean(ids < minority)))
        sh = np.asarray(share)
        print(f"{name:8} {span * BLOCK * ITEM / 2**20:8.0f} {np.mean(spans):10.1f} "
              f"{sh.mean():15.3f} {sh.std():7.3f} {sh.min():6.3f}-{sh.max():.3f}")


def bytes_table(span_kib: int, windows: float) -> None:
    import pyarrow.fs as pafs  # noqa: F401  (pyarrow's S3 before the server starts)

    from submitter.contract.batch import shares
    from tests.support.corpus import GPT2, counting_source, make_corpus
    from tests.support.s3 import running_s3
    from training.data import shards as sh
    from training.data.order import WINDOW_SPANS, offsets, rank_positions
    from training.data.reader import open_corpus

    span = span_kib * 1024 // (BLOCK * ITEM)
    n = int(WINDOW_SPANS * span * windows) // GLOBAL * GLOBAL + 7
    split = shares(GLOBAL, WORLD)
    with running_s3() as server:
        os.environ.update(server.env)  # open_corpus's s3:// URI finds the server
        server.make_bucket("corpora")
        fs = server.filesystem()
        make_corpus(fs, "corpora/c", [n * BLOCK], block=BLOCK, tokenizer=GPT2)
        epoch_bytes = (n // GLOBAL * GLOBAL) * BLOCK * ITEM
        print(f"bytes: {n:,} sequences ({n * BLOCK * ITEM / 2**20:.0f} MiB), spans of "
              f"{span_kib} KiB (before: {4 * span_kib} KiB), {WORLD} ranks, one epoch")

        def reader(span_of: int, counter: list[int]):
            return open_corpus("s3://corpora/c", BLOCK, span=span_of,
                               source=counting_source(fs, "corpora/c", counter))

        fetched = {"before": [0], "after": [0]}
        for rank, (off, share) in enumerate(zip(offsets(split), split)):
            old = reader(4 * span, fetched["before"])  # the old reader's deal of the old order
            order = BeforeOrder(old.sequences(), 1337, 0, old.span)
            train = old.splits[sh.TRAIN]
            for a, b in rank_positions(0, order.n, GLOBAL, off, share):
                for s in range(a, b, MICRO):
                    ids = order.ids(s, s + MICRO)
                    train.prefetch(ids)
                    train.rows(ids)
            old.close()
            new = reader(span, fetched["after"])
            for _ in new.batches(new.order(1337, 0), 0, GLOBAL, off, share, MICRO):
                pass
            new.close()
        for name, (total,) in fetched.items():
            print(f"  {name:7} {total / 2**20:9.1f} MiB fetched = {total / epoch_bytes:.2f}x "
                  f"the epoch's bytes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sequences", type=int, default=9_700_000,
                    help="corpus size for the mix table (FineWeb-Edu 10B at block 1024)")
    ap.add_argument("--steps", type=int, default=2000, help="steps sampled for the mix table")
    ap.add_argument("--span-kib", type=int, default=64, help="span size of the bytes table")
    ap.add_argument("--windows", type=float, default=1.5, help="epoch size in windows")
    ap.add_argument("--no-bytes", action="store_true", help="skip the S3 table")
    args = ap.parse_args()
    mix_table(args.sequences, args.steps)
    if not args.no_bytes:
        bytes_table(args.span_kib, args.windows)


if __name__ == "__main__":
    main()
