"""A prepared corpus on a volume (memory-mapped): the rows of the next micro-batches are read
ahead (madvise WILLNEED), and a shard that fails under the mapping (truncated, deleted before
it was mapped) is a one-line CorpusError naming it, not a SIGBUS that kills the worker."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow.fs as pafs
import pytest

from tests.support.corpus import GPT2, make_corpus
from training.data import shards as sh
from training.data.reader import MappedSource, open_corpus, runs

BLOCK = 16


def test_runs_are_the_consecutive_stretches_of_the_ids():
    assert runs(np.array([], dtype=np.int64)) == []
    assert runs(np.array([9, 3, 4, 5, 7, 8])) == [(3, 6), (7, 10)]
    assert runs(np.array([2])) == [(2, 3)]


def test_advise_takes_an_unaligned_offset_and_a_range_past_the_end(tmp_path):
    make_corpus(pafs.LocalFileSystem(), str(tmp_path), [BLOCK * 600], block=BLOCK, tokenizer=GPT2)
    source = MappedSource(str(tmp_path), (sh.shard_name(sh.TRAIN, 0),))
    assert source.advise(0, sh.HEADER_BYTES + 3 * BLOCK * 2, BLOCK * 2)  # not page-aligned
    assert source.advise(0, sh.HEADER_BYTES, 10**9)  # clipped to the file
    assert not source.advise(0, 10**9, 10)  # wholly past the end: nothing to read ahead
    source.close()


class Advised(MappedSource):
    """A mapped source that records what it was asked to read ahead (and reads it ahead)."""

    def __init__(self, root, files, log):
        super().__init__(root, files)
        self.log = log

    def advise(self, shard, offset, nbytes):
        self.log.append((shard, offset, nbytes))
        return super().advise(shard, offset, nbytes)


def test_a_mapped_reader_reads_the_next_micro_batches_rows_ahead(tmp_path):
    make_corpus(pafs.LocalFileSystem(), str(tmp_path), [BLOCK * 300, BLOCK * 200], block=BLOCK,
                tokenizer=GPT2)
    log: list = []
    reader = open_corpus(str(tmp_path), BLOCK, span=8,
                         source=lambda files: Advised(str(tmp_path), files, log))
    assert reader.mapped
    layout = reader.splits[sh.TRAIN].layout
    order = reader.order(seed=5, epoch=0)
    micro, ahead = 4, 3
    batches = [b["input_ids"][:, 0].tolist()
               for b in reader.batches(order, 0, 8, 0, 8, micro, read_ahead=ahead)][:ahead + 2]

    def advised(seq):
        shard, offset = layout.locate(seq)
        return any(s == shard and o <= offset and offset + BLOCK * 2 <= o + n
                   for s, o, n in log)

    # replay: when batch k was handed out, batches k+1..k+ahead had been advised already
    reader.close()
    log.clear()
    reader = open_corpus(str(tmp_path), BLOCK, span=8,
                         source=lambda files: Advised(str(tmp_path), files, log))
    it = reader.batches(order, 0, 8, 0, 8, micro, read_ahead=ahead)
    next(it)
    for later in batches[1:ahead + 1]:
        assert all(advised(seq) for seq in later), later
    assert not any(advised(seq) for seq in batches[ahead + 1])  # ahead, not the whole epoch
    reader.close()


def test_a_shard_deleted_before_it_is_mapped_is_a_corpus_error_naming_it(tmp_path):
    make_corpus(pafs.LocalFileSystem(), str(tmp_path), [BLOCK * 100, BLOCK * 100], block=BLOCK,
                tokenizer=GPT2)
    reader = open_corpus(str(tmp_path), BLOCK, span=4)
    gone = tmp_path / sh.shard_name(sh.TRAIN, 1)
    gone.unlink()
    with pytest.raises(sh.CorpusError) as e:
        for _ in reader.batches(reader.order(seed=0, epoch=0), 0, 8, 0, 8, 4):
            pass
    assert str(gone) in str(e.value) and "\n" not in str(e.value)
    reader.close()


# In a child process: on a mapping, touching a page past a truncated file's end is a SIGBUS,
# which would kill pytest itself.
_TRUNCATE = textwrap.dedent("""
    import os, sys
    from training.data import shards as sh
    from training.data.reader import open_corpus
    root, block = sys.argv[1], int(sys.argv[2])
    reader = open_corpus(root, block, span=4)
    batches = reader.batches(reader.order(seed=0, epoch=0), 0, 8, 0, 8, 4, read_ahead=2)
    next(batches)  # every shard read is mapped now (the read-ahead too)
    path = os.path.join(root, sh.shard_name(sh.TRAIN, 0))
    os.truncate(path, sh.HEADER_BYTES + 8 * block * 2)
    try:
        for _ in batches:
            pass
    except sh.CorpusError as e:
        print("REFUSED", e)
        sys.exit(2)
    print("READ ALL")
""")


def test_a_shard_truncated_under_the_mapping_is_a_corpus_error_not_a_sigbus(tmp_path):
    make_corpus(pafs.LocalFileSystem(), str(tmp_path), [BLOCK * 200, BLOCK * 200], block=BLOCK,
                tokenizer=GPT2)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", _TRUNCATE, str(tmp_path), str(BLOCK)],
                          capture_output=True, text=True, timeout=120, cwd=root,
                          env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])  # -7: SIGBUS
    line = done.stdout.strip()
    assert line.startswith("REFUSED ") and "\n" not in line
    assert str(tmp_path / sh.shard_name(sh.TRAIN, 0)) in line and "truncated" in line
