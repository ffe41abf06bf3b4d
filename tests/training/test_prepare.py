"""Prepare once (training.data.prepare): a source becomes token shards that hold exactly the
tokenizer's tokens with an EOT before each document; a second prepare writes nothing; an
interrupted one continues shard by shard to the same bytes; a Hub dataset laid out as on the
Hub is read as Parquet through an fsspec filesystem. In this process (no Ray): the Ray Data path
runs the same functions (tests/submitter/test_data_prepare.py runs it end to end)."""

from __future__ import annotations

import json
import os

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from submitter.contract.errors import UsageError
from tests.conftest import shared_file
from training.data import prepare as prep
from training.data import shards as sh
from training.data.tokens import TokenizerSpec, get_encoding

FS = pafs.LocalFileSystem()


@pytest.fixture(scope="module")
def bpe():
    return TokenizerSpec("bpe-file", str(shared_file("data", "gpt2.tiktoken")))


def _docs(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = ["lobster", "claw", " ", "the", "Atlantic", "é", "sea", "\n", "1984", ",", "shell"]
    return [" ".join(rng.choice(words, size=int(rng.integers(5, 60)))) + f" doc {seed}-{i}"
            for i in range(n)]


def _read(root, manifest: sh.Manifest, split: str) -> list[int]:
    out: list[int] = []
    for s in manifest.split(split):
        raw = (root / s.file).read_bytes()
        assert sh.decode_header(raw) == (manifest.dtype, s.tokens)
        out += np.frombuffer(raw[sh.HEADER_BYTES:], dtype="<u2").tolist()
    return out


def _expected(docs, tokenizer, val_percent):
    enc = get_encoding(tokenizer)
    sides = {sh.TRAIN: [], sh.VAL: []}
    for d in docs:
        if d.strip():
            sides[sh.VAL if prep.is_held_out(d, val_percent) else sh.TRAIN] += [enc.eot_token, *enc.encode_ordinary(d)]
    return sides


def _parquet(path, docs, rows_per_group=7):
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": list(range(len(docs))), "text": docs})
    pq.write_table(table, path, row_group_size=rows_per_group)


def _prepare(source, root, tokenizer, **kw):
    kw = {"name": "c", "val_percent": 20.0, "shard_tokens": 400, "piece_bytes": 600,
          "use_ray": False, **kw}
    return prep.prepare(source, FS, str(root), tokenizer, **kw)


def _files(root):
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(root.iterdir())}


def test_shards_hold_the_tokenizer_s_tokens_with_an_eot_before_each_document(tmp_path, bpe):
    docs = _docs(60)
    _parquet(tmp_path / "src" / "part-0.parquet", docs[:30])
    _parquet(tmp_path / "src" / "part-1.parquet", docs[30:])
    out = _prepare(prep.files_source(str(tmp_path / "src"), "auto", "text"), tmp_path / "c", bpe)
    m = sh.read_manifest(FS, str(tmp_path / "c"))
    sh.check_files(FS, str(tmp_path / "c"), m)
    want = _expected(docs, bpe, 20.0)
    assert want[sh.VAL] and len(m.split(sh.TRAIN)) > 2  # both sides, several shards
    assert _read(tmp_path / "c", m, sh.TRAIN) == want[sh.TRAIN]
    assert _read(tmp_path / "c", m, sh.VAL) == want[sh.VAL]
    assert m.dtype == "uint16" and m.tokenizer == {"encoding": "gpt2", "vocab_size": 50257, "eot_id": 50256}
    assert m.eot == sh.EOT_POLICY and m.source["format"] == "parquet" and m.source["fingerprint"]
    assert out.facts["documents"] == 60 and out.facts["tokens"] > 0 and out.facts["seconds"] >= 0


def test_text_documents_begin_at_each_file_and_each_wikitext_title(tmp_path, bpe):
    text = shared_file("data", "wikitext-2", "valid.txt").read_text(encoding="utf-8")
    lines = text.splitlines()[:400]
    (tmp_path / "a.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("print('hello')\nx = 1\n", encoding="utf-8")
    docs = list(prep.text_documents(lines)) + ["print('hello')\nx = 1\n"]
    assert sum(d.startswith(" = ") for d in docs) >= 3  # articles, not lines
    source = prep.files_source(str(tmp_path), "text", "text")
    _prepare(source, tmp_path / "c", bpe, val_percent=0.0, piece_bytes=1 << 20)
    m = sh.read_manifest(FS, str(tmp_path / "c"))
    assert _read(tmp_path / "c", m, sh.TRAIN) == _expected(docs, bpe, 0.0)[sh.TRAIN]
    assert not m.split(sh.VAL)


def test_jsonl_rows_are_documents_of_the_text_column(tmp_path, bpe):
    docs = _docs(12, seed=3) + ["a line\u2028separator inside"]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"body": d, "n": i}) + "\n" for i, d in enumerate(docs)),
                    encoding="utf-8")
    _prepare(prep.files_source(str(path), "auto", "body"), tmp_path / "c", bpe, val_percent=0.0)
    m = sh.read_manifest(FS, str(tmp_path / "c"))
    assert _read(tmp_path / "c", m, sh.TRAIN) == _expected(docs, bpe, 0.0)[sh.TRAIN]


def test_a_second_prepare_writes_nothing(tmp_path, bpe):
    _parquet(tmp_path / "src.parquet", _docs(30))
    source = prep.files_source(str(tmp_path / "src.parquet"), "auto", "text")
    _prepare(source, tmp_path / "c", bpe)
    before = _files(tmp_path / "c")
    again = _prepare(prep.files_source(str(tmp_path / "src.parquet"), "auto", "text"),
                     tmp_path / "c", bpe)
    assert again.already and not again.written
    assert _files(tmp_path / "c") == before  # same files, same bytes, same mtimes


@pytest.mark.parametrize("by_shard", [False, True], ids=["task-per-piece", "task-per-shard"])
def test_an_interrupted_prepare_continues_shard_by_shard_to_the_same_bytes(tmp_path, bpe, by_shard):
    """Also: a task per shard and a task per piece write the same bytes."""
    _parquet(tmp_path / "src.parquet", _docs(80, seed=1))
    source = prep.files_source(str(tmp_path / "src.parquet"), "auto", "text")
    whole = _prepare(source, tmp_path / "whole", bpe, by_shard=not by_shard)
    assert len(whole.manifest.split(sh.TRAIN)) >= 5

    class Abort(Exception):
        pass

    def stop_after_two(p: prep.Progress) -> None:
        if p.shards_done == 2:
            raise Abort()

    with pytest.raises(Abort):
        _prepare(source, tmp_path / "cut", bpe, on_progress=stop_after_two, by_shard=by_shard)
    cut = _files(tmp_path / "cut")
    assert sh.MANIFEST not in cut and prep.PLAN in cut
    assert {"train-000000.bin", "train-000001.bin"} <= set(cut) and "train-000002.bin" not in cut
    seen: list[prep.Progress] = []
    resumed = _prepare(source, tmp_path / "cut", bpe, on_progress=seen.append, by_shard=by_shard)
    after = _files(tmp_path / "cut")
    assert resumed.skipped == 2 and seen[0].shards_done == 3
    assert all(after[f] == cut[f] for f in cut if f.endswith(".bin"))  # untouched: same mtime
    assert {f: b for f, (_, b) in after.items() if f.endswith(".bin")} == \
        {f: b for f, (_, b) in _files(tmp_path / "whole").items() if f.endswith(".bin")}
    a = sh.read_manifest(FS, str(tmp_path / "cut"))
    b = sh.read_manifest(FS, str(tmp_path / "whole"))
    assert (a.shards, a.source, a.tokenizer) == (b.shards, b.source, b.tokenizer)


def test_another_source_under_the_same_name_is_refused_and_nothing_changes(tmp_path, bpe):
    _parquet(tmp_path / "one.parquet", _docs(20))
    _parquet(tmp_path / "two.parquet", _docs(20, seed=9))
    _prepare(prep.files_source(str(tmp_path / "one.parquet"), "auto", "text"), tmp_path / "c", bpe)
    before = _files(tmp_path / "c")
    for other, kw in ((tmp_path / "two.parquet", {}), (tmp_path / "one.parquet", {"val_percent": 1.0})):
        with pytest.raises(sh.CorpusError) as err:
            _prepare(prep.files_source(str(other), "auto", "text"), tmp_path / "c", bpe, **kw)
        assert "another --name" in str(err.value) and "\n" not in str(err.value)
    assert err.value.exit_code == 2 and _files(tmp_path / "c") == before


def _hub_repo(root, card: str | None, files: dict[str, list[str]]):
    root.mkdir(parents=True)
    if card is not None:
        (root / "README.md").write_text(card, encoding="utf-8")
    for rel, docs in files.items():
        _parquet(root / rel, docs)


FINEWEB_CARD = """---
license: odc-by
configs:
- config_name: default
  data_files:
  - split: train
    path: data/*/*
- config_name: sample-10BT
  data_files:
  - split: train
    path: sample/10BT/*
---
# FineWeb-Edu (a few rows laid out as on the Hub)
"""


def test_a_hub_dataset_is_read_as_parquet_through_an_fsspec_filesystem(tmp_path, bpe):
    repo = tmp_path / "HuggingFaceFW" / "fineweb-edu"
    sample = _docs(25, seed=5) + _docs(25, seed=6)
    _hub_repo(repo, FINEWEB_CARD, {"sample/10BT/000_00000.parquet": sample[:25],
                                   "sample/10BT/001_00000.parquet": sample[25:],
                                   "data/CC-MAIN-2024-10/000_00000.parquet": _docs(5, seed=7)})
    local = fsspec.filesystem("file")  # where HfFileSystem goes on a cluster
    source = prep.hub_source("HuggingFaceFW/fineweb-edu", "sample-10BT", "text", fs=local,
                             root=str(repo))
    assert [f.rel for f in source.files] == ["sample/10BT/000_00000.parquet",
                                             "sample/10BT/001_00000.parquet"]
    _prepare(source, tmp_path / "c", bpe)
    m = sh.read_manifest(FS, str(tmp_path / "c"))
    want = _expected(sample, bpe, 20.0)
    assert _read(tmp_path / "c", m, sh.TRAIN) == want[sh.TRAIN]
    assert _read(tmp_path / "c", m, sh.VAL) == want[sh.VAL]
    assert m.source["kind"] == "hub" and m.source["what"] == "HuggingFaceFW/fineweb-edu sample-10BT"
    with pytest.raises(UsageError, match="its configs: default, sample-10BT"):
        prep.hub_source("HuggingFaceFW/fineweb-edu", "sample-350BT", "text", fs=local, root=str(repo))


def test_a_hub_layout_without_a_card_gives_its_validation_split_its_own_shards(tmp_path, bpe):
    repo = tmp_path / "repo"
    train, val = _docs(30, seed=11), _docs(8, seed=12)
    _hub_repo(repo, None, {"data/train-00000-of-00001.parquet": train,
                           "data/validation-00000-of-00001.parquet": val,
                           "data/test-00000-of-00001.parquet": _docs(4, seed=13)})
    source = prep.hub_source("someone/wiki", None, "text", fs=fsspec.filesystem("file"),
                             root=str(repo))
    assert [(f.rel, f.split) for f in source.files] == [
        ("data/train-00000-of-00001.parquet", sh.TRAIN),
        ("data/validation-00000-of-00001.parquet", sh.VAL)]  # test is never read
    _prepare(source, tmp_path / "c", bpe)
    m = sh.read_manifest(FS, str(tmp_path / "c"))
    assert _read(tmp_path / "c", m, sh.TRAIN) == _expected(train, bpe, 0.0)[sh.TRAIN]
    assert _read(tmp_path / "c", m, sh.VAL) == _expected(val, bpe, 0.0)[sh.TRAIN]
    assert m.source["fingerprint"] == source.fingerprint()


def test_a_card_s_data_dir_config_splits_its_files_by_name(tmp_path):
    repo = tmp_path / "repo"
    card = "---\nconfigs:\n- config_name: en\n  data_dir: en\n- config_name: de\n  data_dir: de\n---\n"
    _hub_repo(repo, card, {"en/train-0.parquet": ["a"], "en/validation-0.parquet": ["b"],
                           "de/train-0.parquet": ["c"]})
    source = prep.hub_source("someone/multi", "en", "text", fs=fsspec.filesystem("file"),
                             root=str(repo))
    assert [(f.rel, f.split) for f in source.files] == [("en/train-0.parquet", sh.TRAIN),
                                                        ("en/validation-0.parquet", sh.VAL)]


def test_a_missing_source_or_column_is_one_line(tmp_path, bpe):
    with pytest.raises(UsageError, match="not found"):
        prep.files_source(str(tmp_path / "nothing"), "auto", "text")
    _parquet(tmp_path / "p.parquet", _docs(3))
    with pytest.raises(UsageError, match="no column 'body'"):
        _prepare(prep.files_source(str(tmp_path / "p.parquet"), "auto", "body"), tmp_path / "c", bpe)
    assert not os.path.exists(tmp_path / "c")


def _program(storage, name, data, bpe, **more):
    """`python -m training.prepare` in this process, given its job document as a pod is."""
    from submitter.contract.naming import ENV_JOB
    from training import prepare as program

    job = {"name": name, "data": str(data), "bpe_file": bpe.bpe_file, "storage_path": str(storage),
           **more}
    return program.main([], environ={ENV_JOB: json.dumps(job)})


def test_the_program_refuses_before_ray_starts_and_writes_nothing(storage, tmp_path, bpe, capsys):
    _parquet(tmp_path / "one.parquet", _docs(20))
    _parquet(tmp_path / "two.parquet", _docs(20, seed=4))
    corpus = storage / "corpora" / "c"
    _prepare(prep.files_source(str(tmp_path / "one.parquet"), "auto", "text"), corpus, bpe,
             val_percent=5.0, shard_tokens=sh.SHARD_TOKENS, piece_bytes=prep.PIECE_BYTES)
    before = _files(corpus)
    assert _program(storage, "c", tmp_path / "one.parquet", bpe) == 0  # prepared: nothing to do
    assert "already prepared" in capsys.readouterr().out
    assert _program(storage, "c", tmp_path / "two.parquet", bpe) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another --name" in err[0]
    assert _files(corpus) == before
    assert _program("/tmp/scratch-runs", "c", tmp_path / "one.parquet", bpe) == 2  # storage policy
    assert "/tmp" in capsys.readouterr().err and not os.path.exists("/tmp/scratch-runs")


def test_the_offline_corpus_makes_each_file_a_document(tmp_path, bpe):
    import dataclasses

    source = prep.offline_source()
    assert source.kind == "offline" and len(source.files) > 100
    assert prep.offline_source().fingerprint() == source.fingerprint()
    few = dataclasses.replace(source, files=source.files[:4])
    _prepare(few, tmp_path / "c", bpe, val_percent=0.0, piece_bytes=1 << 20)
    m = sh.read_manifest(FS, str(tmp_path / "c"))
    docs = [d for f in few.files
            for d in prep.text_documents(open(f.path, encoding="utf-8").read().splitlines())]
    assert len(docs) >= 4  # each file begins one
    assert _read(tmp_path / "c", m, sh.TRAIN) == _expected(docs, bpe, 0.0)[sh.TRAIN]


def test_a_bucket_source_prepares_into_a_bucket_and_continues_there(s3_server, bpe):
    """The object-store path (moto's S3 server): read by ranges, written object by object."""
    s3_server.make_bucket("bkt")
    fs = s3_server.filesystem()
    docs = _docs(40, seed=21)
    with fs.open_output_stream("bkt/src/part-0.jsonl") as out:
        out.write("".join(json.dumps({"text": d}) + "\n" for d in docs).encode())
    source = prep.files_source("s3://bkt/src", "auto", "text")
    kw = {"name": "c", "val_percent": 0.0, "shard_tokens": 300, "piece_bytes": 400, "use_ray": False}

    def stop(p: prep.Progress) -> None:
        if p.shards_done == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prep.prepare(source, fs, "bkt/runs/corpora/c", bpe, on_progress=stop, **kw)
    first = s3_server.list("bkt/runs/corpora/c")
    assert "bkt/runs/corpora/c/train-000000.bin" in first and "bkt/runs/corpora/c/plan.json" in first
    assert "bkt/runs/corpora/c/manifest.json" not in first
    resumed = prep.prepare(source, fs, "bkt/runs/corpora/c", bpe, **kw)
    assert resumed.skipped == 1 and not resumed.already
    m = sh.read_manifest(fs, "bkt/runs/corpora/c")
    sh.check_files(fs, "bkt/runs/corpora/c", m)
    ids = []
    for s in m.split(sh.TRAIN):
        with fs.open_input_file(f"bkt/runs/corpora/c/{s.file}") as f:
            ids += np.frombuffer(f.read()[sh.HEADER_BYTES:], dtype="<u2").tolist()
    assert ids == _expected(docs, bpe, 0.0)[sh.TRAIN]
    assert prep.prepare(source, fs, "bkt/runs/corpora/c", bpe, **kw).already
    assert not [k for k in s3_server.list("bkt/runs/corpora/c") if k.endswith(".partial")]
    assert set(first) <= set(s3_server.list("bkt/runs/corpora/c"))
