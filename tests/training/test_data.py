"""The Ray Data side: readers for --data, the offline corpus, the deterministic hold-out."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from training.data import _guess_format, chunk_batch, load_corpus, stdlib_files, token_datasets
from training.tokens import TokenizerSpec, byte_encoding, tokenize_and_chunk

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
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
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
