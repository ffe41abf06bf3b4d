"""Reading a prepared corpus by position: each rank's sequences of each step, from a volume
(memory-mapped) and from a bucket (ranged reads, read-ahead, a bounded cache); a reader opened
late in an epoch reads nothing before its position."""

from __future__ import annotations

import numpy as np
import pyarrow.fs as pafs
import pytest

from submitter.contract.batch import shares
from tests.support.corpus import GPT2, make_corpus
from tests.support.s3 import s3_server  # noqa: F401 - fixture
from training.data import shards as sh
from training.data.order import offsets
from training.data.reader import MappedSource, RangedSource, open_corpus

BLOCK = 16


class Counting:
    """A source that records the byte ranges it serves."""

    def __init__(self, inner):
        self.inner, self.ranges = inner, []

    def read(self, shard, offset, nbytes):
        self.ranges.append((shard, offset, nbytes))
        return self.inner.read(shard, offset, nbytes)

    def close(self):
        self.inner.close()


def _ids(batch):
    return batch["input_ids"][:, 0].tolist()  # the corpus names each sequence by its 1st token


def test_the_reader_yields_each_rank_s_slice_of_each_step(tmp_path):
    make_corpus(pafs.LocalFileSystem(), str(tmp_path), [BLOCK * 50 + 3, BLOCK * 30], val=BLOCK * 9,
                block=BLOCK, tokenizer=GPT2)
    reader = open_corpus(str(tmp_path), BLOCK, check=True, span=4)
    assert reader.sequences() == 80 and reader.sequences(sh.VAL) == 9  # a shard's tail dropped
    order = reader.order(seed=3, epoch=1)
    split = shares(12, 3)
    got = [[_ids(b) for b in reader.batches(order, 0, 12, off, share, 2)]
           for off, share in zip(offsets(split), split)]
    assert [len(g) for g in got] == [6 * 2] * 3  # 6 whole steps, 2 micro-batches each
    for s in range(6):
        step = sum((got[r][2 * s] + got[r][2 * s + 1] for r in range(3)), [])
        assert step == order.ids(12 * s, 12 * s + 12).tolist()
    row = next(reader.batches(order, 0, 12, 0, 4, 4))["input_ids"][0]
    assert row.dtype == np.int64 and row.tolist() == [row[0]] * BLOCK
    val = [_ids(b) for r in range(2) for b in reader.val_batches(r, 2, 2)]
    assert len(val) == 4  # 9 sequences: 4 micro-batches of 2, dealt to 2 ranks
    reader.close()


def _resume_reads(reader, counting, fraction):
    """Open at `fraction` of the epoch (a step boundary); the ranges read until the first
    micro-batch, and the spans a reader there may touch (this rank's positions from it)."""
    n, g = reader.sequences(), 8
    position = int(n * fraction) // g * g
    order = reader.order(seed=0, epoch=0)
    counting.ranges.clear()
    batches = reader.batches(order, position, g, 0, 4, 2, read_ahead=0)
    next(batches)
    first = list(counting.ranges)
    allowed = set()
    for base in range(position, n - g + 1, g):
        allowed |= set((order.ids(base, base + 4) // reader.span).tolist())
    rest = list(batches)
    return first, allowed, rest


def _spans_of(reader, ranges):
    layout = reader.splits[sh.TRAIN].layout
    row = layout.block * layout.itemsize
    return {(layout.first[s] + (off - sh.HEADER_BYTES) // row) // reader.span
            for s, off, _ in ranges}


@pytest.mark.parametrize("where", ["volume", "bucket"])
def test_a_resume_at_90_percent_reads_nothing_before_its_position(tmp_path, where, request):
    if where == "volume":
        fs, root = pafs.LocalFileSystem(), str(tmp_path / "c")
    else:
        server = request.getfixturevalue("s3_server")
        server.make_bucket("corpora")
        fs, root = server.filesystem(), "corpora/c"
    make_corpus(fs, root, [BLOCK * 400] * 5, block=BLOCK, tokenizer=GPT2)
    uri = root if where == "volume" else f"s3://{root}"

    def opened():  # a fresh reader (an empty cache) and the counter of its train split
        sources = []

        def source(files):  # one per split: the train split's first
            inner = (MappedSource(root, files) if where == "volume"
                     else RangedSource(fs, root, files))
            sources.append(Counting(inner))
            return sources[-1]

        reader = open_corpus(uri, BLOCK, span=10, source=source)
        return reader, sources[0]

    reader, count = opened()
    early, _, _ = _resume_reads(reader, count, 0.01)
    reader.close()
    reader, count = opened()
    late, allowed, rest = _resume_reads(reader, count, 0.9)
    # the first micro-batch costs the same at 1% and at 90%: the spans it needs, no more
    assert len(late) == len(early) <= 2 * 2
    # and from there to the epoch's end every range read holds a sequence at or after the
    # position (whole spans: the one ranged read a bucket serves)
    assert _spans_of(reader, count.ranges) <= allowed
    assert sum(len(b["input_ids"]) for b in rest) == (2000 - 1800) // 8 * 4 - 2
    reader.close()


def test_a_bucket_reader_s_cache_stays_within_its_bytes(s3_server):
    s3_server.make_bucket("corpora")
    fs = s3_server.filesystem()
    make_corpus(fs, "corpora/c", [BLOCK * 300] * 3, block=BLOCK, tokenizer=GPT2)
    span_bytes = 10 * BLOCK * 2
    reader = open_corpus("s3://corpora/c", BLOCK, span=10, cache_bytes=3 * span_bytes)
    order = reader.order(seed=1, epoch=0)
    seen = []
    cache = reader.splits[sh.TRAIN].cache
    for b in reader.batches(order, 0, 8, 0, 8, 4):
        seen.extend(_ids(b))
        assert cache._held() <= 3 * span_bytes
    assert seen == order.ids(0, 896).tolist()
    reader.close()


@pytest.mark.parametrize("damage, says", [
    (lambda root: (root / "train-000001.bin").unlink(), "missing"),
    (lambda root: (root / "train-000000.bin").write_bytes(
        (root / "train-000000.bin").read_bytes()[:-2]), "truncated"),
    (lambda root: (root / "manifest.json").unlink(), "no manifest.json"),
])
def test_a_damaged_corpus_is_one_line(tmp_path, damage, says):
    make_corpus(pafs.LocalFileSystem(), str(tmp_path), [BLOCK * 4, BLOCK * 4], block=BLOCK)
    damage(tmp_path)
    with pytest.raises(sh.CorpusError, match=says) as e:
        open_corpus(str(tmp_path), BLOCK, check=True)
    assert "\n" not in str(e.value) and e.value.exit_code == 2


def test_a_corpus_of_another_tokenizer_is_refused(tmp_path):
    make_corpus(pafs.LocalFileSystem(), str(tmp_path), [BLOCK * 4], block=BLOCK)  # byte
    with pytest.raises(sh.CorpusError, match="tokenizer"):
        open_corpus(str(tmp_path), BLOCK, identity=GPT2)
