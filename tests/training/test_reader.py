"""Reading a prepared corpus by position: each rank's sequences of each step, from a volume
(memory-mapped) and from a bucket (ranged reads, read-ahead, a bounded cache); a reader opened
late in an epoch reads nothing before its position."""

from __future__ import annotations

import numpy as np
import pyarrow.fs as pafs
import pytest

from submitter.contract.batch import shares
from tests.support.corpus import GPT2, counting_source, make_corpus
from tests.support.s3 import s3_server  # noqa: F401 - fixture
from training.data import shards as sh
from training.data.order import offsets, rank_ids
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
        assert step == sorted(order.ids(12 * s, 12 * s + 12).tolist())  # dealt by id
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
        allowed |= set((rank_ids(order, base, g, 0, 4) // reader.span).tolist())
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
    assert 1 <= len(late) <= 2 * 2 and 1 <= len(early) <= 2 * 2
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
    assert seen == [i for b in range(0, 896, 8) for i in sorted(order.ids(b, b + 8).tolist())]
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


def test_a_resume_into_a_changed_corpus_is_refused_before_training(tmp_path):
    """The driver's check (before Ray starts): the run's latest checkpoint's note pins the
    order; a re-prepared corpus or another block refuses in one line, --restart-epoch lets
    it start the epoch afresh, a checkpoint at an epoch's end continues anyway."""
    from training.data.order import OrderChanged
    from training.data.reader import (check_resumed_order, latest_order_note,
                                      write_order_note)

    root, run = tmp_path / "c", tmp_path / "run"
    manifest = make_corpus(pafs.LocalFileSystem(), str(root), [BLOCK * 40], block=BLOCK)
    reader = open_corpus(str(root), BLOCK)
    pin = reader.pin(reader.order(5, 1))
    reader.close()
    assert latest_order_note(str(run)) is None  # no run yet
    for name, seqs in (("checkpoint_epoch002_step0000009", 8),
                       ("checkpoint_epoch002_step0000010", 16),
                       ("checkpoint_epoch001_step0000099", 24)):
        (run / name).mkdir(parents=True)
        write_order_note(str(run / name), {"epoch": 1, "epoch_done": False, "model": "x",
                                           "sequences_in_epoch": seqs, "data_order": pin})
    assert latest_order_note(str(run))["sequences_in_epoch"] == 16  # the latest: epoch 2 step 10
    check_resumed_order(str(root), manifest, BLOCK, str(run), restart=False)  # unchanged
    with pytest.raises(OrderChanged, match="the block size: 16 -> 8") as e:
        check_resumed_order(str(root), manifest, 8, str(run), restart=False)
    assert "\n" not in str(e.value) and e.value.exit_code == 2
    again = make_corpus(pafs.LocalFileSystem(), str(tmp_path / "d"), [BLOCK * 41], block=BLOCK)
    with pytest.raises(OrderChanged, match="the corpus: .*the sequence count: 40 -> 41"):
        check_resumed_order(str(tmp_path / "d"), again, BLOCK, str(run), restart=False)
    check_resumed_order(str(tmp_path / "d"), again, BLOCK, str(run), restart=True)
    write_order_note(str(run / "checkpoint_epoch002_step0000010"),
                     {"epoch": 1, "epoch_done": True, "sequences_in_epoch": 40, "data_order": pin})
    check_resumed_order(str(tmp_path / "d"), again, BLOCK, str(run), restart=False)


def test_the_ranks_of_a_group_fetch_about_one_epoch_from_a_bucket(s3_server):
    """Bucket reads by share: 4 ranks (a reader each, as in their own processes) read a whole
    epoch; the bytes the bucket serves them all are at most 1.5x the epoch's (each rank
    reading every span of its steps: 4x), and each step's sequences are read once."""
    s3_server.make_bucket("corpora")
    fs = s3_server.filesystem()
    make_corpus(fs, "corpora/c", [BLOCK * 1300, BLOCK * 1000], block=BLOCK, tokenizer=GPT2)
    served, seen, global_batch = [0], [], 64
    source = counting_source(fs, "corpora/c", served)

    split = shares(global_batch, 4)
    for off, share in zip(offsets(split), split):
        reader = open_corpus("s3://corpora/c", BLOCK, span=8, source=source)
        order = reader.order(seed=2, epoch=0)
        assert order.shuffle == "window"
        seen += [i for b in reader.batches(order, 0, global_batch, off, share, 4) for i in _ids(b)]
        reader.close()
    epoch = 2300 // global_batch * global_batch
    assert sorted(seen) == sorted(order.ids(0, epoch).tolist())  # each sequence once
    assert served[0] <= 1.5 * epoch * BLOCK * 2


def test_a_mixture_reads_each_step_from_its_corpora_by_weight(tmp_path):
    """Two prepared corpora mixed 3:1: the ranks' micro-batches are the mixture's steps, each
    row read from its own corpus (b's sequences are named 10,000 + j), b's share of every
    step a quarter, and validation reads both corpora's validation shards."""
    from training.data.reader import open_mixture

    fs = pafs.LocalFileSystem()
    make_corpus(fs, str(tmp_path / "a"), [BLOCK * 300], val=BLOCK * 4, block=BLOCK,
                tokenizer=GPT2)
    make_corpus(fs, str(tmp_path / "b"), [BLOCK * 50], val=BLOCK * 4, block=BLOCK,
                tokenizer=GPT2, tokens=lambda split, i, n: (
                    np.repeat(np.arange(10_000, 10_000 + n // BLOCK), BLOCK)
                    if split == sh.TRAIN else np.arange(n)))
    mixed = open_mixture([{"name": "a", "uri": str(tmp_path / "a"), "weight": 3},
                          {"name": "b", "uri": str(tmp_path / "b"), "weight": 1}], BLOCK)
    assert mixed.sequences() == 350 and mixed.sequences(sh.VAL) == 8
    order = mixed.order(seed=1, epoch=0)
    split = shares(16, 2)
    got = [[_ids(b) for b in mixed.batches(order, 0, 16, off, share, 4)]
           for off, share in zip(offsets(split), split)]
    for s in range(350 // 16):
        step = sum((got[r][2 * s] + got[r][2 * s + 1] for r in range(2)), [])
        want = [i if i < 300 else 10_000 + i - 300 for i in order.ids(16 * s, 16 * s + 16)]
        assert step == sorted(want)
        assert abs(sum(i >= 10_000 for i in step) - 4) <= 2
    assert len([b for b in mixed.val_batches(0, 1, 2)]) == 4
    pin = mixed.pin(order)
    assert "a:3=" in pin["corpus"] and "b:1=" in pin["corpus"] and pin["sequences"] == 350
    mixed.close()
