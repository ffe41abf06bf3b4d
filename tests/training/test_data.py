"""The Ray Data side: readers for --data, the offline corpus, the deterministic hold-out."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training.data.pipeline import _guess_format, chunk_batch, load_corpus, stdlib_files, token_datasets
from training.data.tokens import TokenizerSpec, byte_encoding, tokenize_and_chunk

BYTES = TokenizerSpec("byte")
TEXT = [" = Alpha = ", "", " The alpha line one . ", " = = Part = = ", " more text here . "] * 40


def test_stdlib_corpus_is_sorted_and_has_no_tests():
    files = stdlib_files()
    root = Path(sysconfig.get_paths()["stdlib"])
    rel = [f.relative_to(root) for f in files]
    assert files == sorted(files) and len(files) > 100
    assert Path("os.py") in rel and Path("json/__init__.py") in rel
    assert not any(p.parts[0] in ("test", "site-packages", "idlelib") for p in rel)


def test_guess_format(tmp_path):
    assert _guess_format("s3://b/x.parquet") == "parquet"
    assert _guess_format("/d/x.jsonl") == "jsonl"
    assert _guess_format("/d/x.txt") == "text"
    (tmp_path / "part-0.parquet").write_bytes(b"")
    assert _guess_format(str(tmp_path)) == "parquet"


def test_chunk_batch_splits_train_and_val_without_overlap():
    batch = {"text": np.array(TEXT * 5, dtype=object)}
    every = chunk_batch(batch, BYTES, 16)["input_ids"]
    train = chunk_batch(batch, BYTES, 16, keep="train", val_percent=20)["input_ids"]
    val = chunk_batch(batch, BYTES, 16, keep="val", val_percent=20)["input_ids"]
    assert len(train) + len(val) == len(every) and len(val) > 0 and len(train) > len(val)
    assert {r.tobytes() for r in train}.isdisjoint({r.tobytes() for r in val}) or \
        len({r.tobytes() for r in every}) < len(every)  # identical blocks land on one side
    np.testing.assert_array_equal(every, tokenize_and_chunk(TEXT * 5, byte_encoding(), 16))


@pytest.mark.slow
def test_readers_feed_the_same_blocks(tmp_path):
    """Text, jsonl and parquet holding the same rows give the same token blocks."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    (tmp_path / "a.txt").write_text("\n".join(TEXT) + "\n")
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in TEXT))
    pq.write_table(pa.table({"body": TEXT, "other": list(range(len(TEXT)))}), tmp_path / "a.parquet")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        from ray.data import DataContext

        DataContext.get_current().execution_options.preserve_order = True
        expected = tokenize_and_chunk(TEXT, byte_encoding(), 32)
        for name, column in (("a.txt", "text"), ("a.jsonl", "body"), ("a.parquet", "body")):
            corpus = load_corpus("ignored", None, str(tmp_path / name), "auto", column)
            assert name in corpus.description
            train, val = token_datasets(corpus, BYTES, 32, val_percent=0.0)
            got = np.stack([r["input_ids"] for r in train.take_all()])
            np.testing.assert_array_equal(got, expected)
            assert val.count() == 0
        stdlib = load_corpus("python-stdlib", None, None)
        assert "python-stdlib" in stdlib.description and ".py files" in stdlib.description
        train, val = token_datasets(stdlib, BYTES, 64, val_percent=5.0)
        a = {r["input_ids"].tobytes() for r in train.limit(300).take_all()}
        b = [r["input_ids"].tobytes() for r in val.limit(30).take_all()]
        assert len(b) == 30 and not a & set(b)  # equal blocks hash to the same side
    finally:
        ray.shutdown()


# --- fast start: sizes and estimates instead of a counting pass ---------------------------------

def test_hub_tables_are_cut_into_a_block_per_core_or_more():
    from training.data.pipeline import HUB_BLOCK_BYTES, hub_block_count

    assert hub_block_count(rows=1000, text_bytes=1_000, cpus=16) == 16
    assert hub_block_count(rows=10, text_bytes=1_000, cpus=16) == 10
    assert hub_block_count(rows=10**6, text_bytes=540 * 2**20, cpus=8) == -(-540 * 2**20 // HUB_BLOCK_BYTES)
    assert hub_block_count(rows=0, text_bytes=0, cpus=4) == 1


def test_the_steps_per_epoch_estimate_follows_the_texts_size(tmp_path):
    from training.data.pipeline import (Corpus, _files_size_and_sample, estimate_blocks,
                               steps_per_epoch_estimate)

    text = tmp_path / "a.txt"
    text.write_text("\n".join(TEXT * 50) + "\n")
    nbytes, sample = _files_size_and_sample(str(text), "text", "text")
    assert nbytes == text.stat().st_size and sample[0] == TEXT[0]
    real = len(tokenize_and_chunk(TEXT * 50, byte_encoding(), 32))
    corpus = Corpus(None, None, "x", nbytes, sample)
    blocks = estimate_blocks(corpus, BYTES, 32, val_percent=0.0)
    assert abs(blocks - real) <= 0.05 * real  # byte tokens: size is the count (+ newlines)
    assert estimate_blocks(corpus, BYTES, 32, val_percent=10.0) == pytest.approx(0.9 * blocks, abs=1)
    assert steps_per_epoch_estimate(blocks, 8, 2) == blocks // 16
    assert steps_per_epoch_estimate(None, 8, 1) == 1
    assert estimate_blocks(Corpus(None, None, "x"), BYTES, 32, 0.0) is None


def test_parquet_text_size_comes_from_the_footers_and_a_sample(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from training.data.pipeline import _files_size_and_sample

    rows = TEXT * 100  # repetitive: dictionary encoding makes the stored column tiny
    for part in range(2):
        pq.write_table(pa.table({"body": rows, "n": list(range(len(rows)))}),
                       tmp_path / f"part-{part}.parquet", compression="zstd", row_group_size=500)
    nbytes, sample = _files_size_and_sample(str(tmp_path), "parquet", "body")
    raw = 2 * sum(len(t.encode()) + 1 for t in rows)
    assert raw * 0.9 < nbytes < raw * 1.1 and sample[:5] == tuple(TEXT[:5])


def test_gpt2_tokens_per_byte_is_measured_on_the_sample():
    from tests.conftest import shared_file
    from training.data.pipeline import Corpus, tokens_per_byte
    from training.data.tokens import TokenizerSpec

    bpe = TokenizerSpec("bpe-file", str(shared_file("data", "gpt2.tiktoken")))
    lines = shared_file("data", "wikitext-2", "valid.txt").read_text().splitlines()[:3000]
    ratio = tokens_per_byte(Corpus(None, None, "x", 1, tuple(lines)), bpe)
    assert 0.2 < ratio < 0.3  # ~4 bytes per GPT-2 token on English
    assert tokens_per_byte(Corpus(None, None, "x", 1, ()), bpe) == 0.25


@pytest.mark.slow
def test_a_hub_dataset_is_tokenized_by_every_core_and_limited(tmp_path):
    """The Hub path offline: a datasets.DatasetDict built here, as load_dataset returns it."""
    import datasets
    import ray

    from training.data.pipeline import hub_corpus, limited

    rows = [f" line {i} of the corpus . " for i in range(4000)]
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"body": rows}),
                               "validation": datasets.Dataset.from_dict({"body": rows[:100]})})
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        from ray.data import DataContext

        DataContext.get_current().execution_options.preserve_order = True
        corpus = hub_corpus(dd, "body", "local/test")
        assert corpus.train.num_blocks() >= 4 and "4000 train rows" in corpus.description
        assert corpus.text_bytes == sum(len(r) for r in rows) and corpus.val is not None
        train, val = token_datasets(corpus, BYTES, 32, val_percent=5.0)
        got = np.concatenate([b["input_ids"] for b in train.iter_batches(batch_size=None)])
        # same blocks as one pass over all rows, only cut per slice
        expected_tokens = len(tokenize_and_chunk(rows, byte_encoding(), 32))
        assert abs(len(got) - expected_tokens) <= corpus.train.num_blocks()
        small = limited(corpus, 10)
        assert small.train.count() == 10 and small.text_bytes < corpus.text_bytes
        assert hub_corpus(dd, "body", "x", limit_rows=7).train.count() == 7
    finally:
        ray.shutdown()


# --- one big text file: line-aligned ranges, the same rows as read_text --------------------------

LINE_TEXTS = st.lists(st.text(alphabet=st.sampled_from(list("ab é€\r\n\x85\u2028\t")), max_size=12),
                      max_size=12)


@settings(max_examples=300, deadline=None)
@given(pieces=LINE_TEXTS, chunk=st.integers(min_value=1, max_value=9))
def test_line_ranges_cover_the_file_and_give_its_splitlines(pieces, chunk):
    """Whatever the line breaks (\\r\\n, \\r, U+0085, U+2028, none at the end) and however long
    the lines are against the range size, the ranges' lines are the file's splitlines()."""
    import io

    from training.data.pipeline import line_ranges, read_line_ranges

    data = "\n".join(pieces).encode()
    ranges = line_ranges(io.BytesIO(data), len(data), chunk)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(ranges, ranges[1:]))
    assert all(data[start - 1:start] == b"\n" for start, _ in ranges[1:])
    got = [line for start, end in ranges
           for line in data[start:end].decode().splitlines()]
    assert got == data.decode().splitlines()


def test_a_big_text_file_is_read_in_ranges_with_read_texts_rows(tmp_path, monkeypatch):
    import ray

    import training.data.pipeline as data

    lines = [f"line {i} " + "é" * (i % 7) + ("\r" if i % 5 == 0 else "") for i in range(3000)]
    path = tmp_path / "big.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", newline="")
    monkeypatch.setattr(data, "TEXT_RANGE_BYTES", 4096)
    assert data._single_file_ranges(str(tmp_path)) is None          # a directory: read_text
    (tmp_path / "small.txt").write_text("a\nb\n")
    assert data._single_file_ranges(str(tmp_path / "small.txt")) is None  # one range: read_text
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        from ray.data import DataContext

        DataContext.get_current().execution_options.preserve_order = True
        ranged = data.read_text(str(path))
        assert len(data._single_file_ranges(str(path))) > 10
        expected = [r["text"] for r in ray.data.read_text(str(path)).take_all()]
        assert [r["text"] for r in ranged.take_all()] == expected == \
            path.read_bytes().decode("utf-8").splitlines()
    finally:
        ray.shutdown()
