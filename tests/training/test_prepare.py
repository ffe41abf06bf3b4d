"""Prepare once (training.data.prepare): a source becomes token shards that hold exactly the
tokenizer's tokens with an EOT before each document; a second prepare writes nothing; an
interrupted one continues shard by shard to the same bytes; a Hub dataset laid out as on the
Hub is read as Parquet through an fsspec filesystem. In this process (no Ray): the Ray Data path
runs the same functions (tests/submitter/test_data_prepare.py runs it end to end)."""

from __future__ import annotations

import dataclasses
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
    return _documents(out)


def _documents(ids: list[int], eot: int = 50256) -> list[tuple[int, ...]]:
    """A token stream's documents (each `[EOT] + tokens`), sorted: prepare writes them in a
    seeded order (test_documents_are_written_in_the_plan_s_seeded_order checks it)."""
    cuts = [i for i, t in enumerate(ids) if t == eot] + [len(ids)]
    assert not ids or cuts[0] == 0, "the stream begins with an EOT"
    return sorted(tuple(ids[a:b]) for a, b in zip(cuts, cuts[1:]))


def _expected(docs, tokenizer, val_percent):
    enc = get_encoding(tokenizer)
    sides = {sh.TRAIN: [], sh.VAL: []}
    for d in docs:
        if d.strip():
            sides[sh.VAL if prep.is_held_out(d, val_percent) else sh.TRAIN] += [enc.eot_token, *enc.encode_ordinary(d)]
    return {side: _documents(ids, enc.eot_token) for side, ids in sides.items()}


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


@pytest.mark.parametrize("name, content, says", [
    ("d.jsonl", b'not json\n{"text": "x"}\n', "d.jsonl line 1: not JSON"),
    ("d.jsonl", b'\n{"body": "x"}\n', "d.jsonl line 2: no key 'text' (it has body): pass --text-column"),
    ("d.jsonl", b'["a list"]\n', "d.jsonl line 1: a JSON list, not an object"),
    ("d.parquet", b"plain text, not Parquet\n", "d.parquet: not a Parquet file"),
    ("d.txt", b"", "are empty: no text to prepare"),
])
def test_bad_input_is_one_line_naming_the_file_before_ray_and_nothing_written(
        storage, tmp_path, bpe, capsys, name, content, says):
    """Issue 37 item 13: one line naming the file (and the line), exit 2, before Ray starts."""
    import ray

    (tmp_path / name).write_bytes(content)
    assert _program(storage, "c", tmp_path / name, bpe) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tmp_path / name) in err[0] and says in err[0], err
    assert not ray.is_initialized() and not os.path.exists(storage / "corpora")


def test_a_bad_line_further_in_or_no_text_at_all_is_refused_without_a_manifest(tmp_path, bpe):
    lines = [json.dumps({"text": d}) for d in _docs(30)]
    lines[17] = "{broken"
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"d.jsonl line 18: not JSON") as e:
        _prepare(prep.files_source(str(tmp_path / "d.jsonl"), "auto", "text"), tmp_path / "c", bpe,
                 piece_bytes=1 << 20)
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match=r"d.jsonl \(the line at byte \d+\): not JSON"):
        _prepare(prep.files_source(str(tmp_path / "d.jsonl"), "auto", "text"), tmp_path / "c2", bpe,
                 piece_bytes=300)  # a range that begins mid-file: the line's byte offset
    (tmp_path / "blank.txt").write_text("  \n\n\t\n", encoding="utf-8")
    with pytest.raises(UsageError, match="no training text in it"):
        _prepare(prep.files_source(str(tmp_path / "blank.txt"), "auto", "text"), tmp_path / "c3", bpe)
    assert not (tmp_path / "c3" / sh.MANIFEST).exists()
    # Ray hands the driver a task's traceback as text: its last bad-input line is the error
    wrapped = RuntimeError("ray::MapBatches()\n  File x\nsubmitter.contract.errors.UsageError: "
                           "/d.jsonl line 3: not JSON (x)\n\nThe above exception ...\nUDF failed")
    assert str(prep.task_bad_input(wrapped)) == "/d.jsonl line 3: not JSON (x)"
    assert prep.task_bad_input(RuntimeError("a real failure")) is None


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
    assert _documents(ids) == _expected(docs, bpe, 0.0)[sh.TRAIN]
    assert prep.prepare(source, fs, "bkt/runs/corpora/c", bpe, **kw).already
    assert not [k for k in s3_server.list("bkt/runs/corpora/c") if k.endswith(".partial")]
    assert set(first) <= set(s3_server.list("bkt/runs/corpora/c"))


def _damage(root):
    """A truncated training shard, a deleted one and a held-out part overwritten with text."""
    cut = root / "train-000001.bin"
    cut.write_bytes(cut.read_bytes()[:-6])
    (root / "train-000003.bin").unlink()
    (root / "val-000000.bin").write_bytes(b"not a shard")
    return {0, 1, 3}  # the shards (a training file and its held-out part) made again


def test_prepare_repairs_a_damaged_corpus_that_training_refused(tmp_path, bpe):
    """Issue 37 item 5: the refusal's advice works. Training's own check (open_manifest with
    check) refuses the damaged corpus, prepare of the same name remakes only the damaged
    shards, and the check passes on the same bytes as before."""
    from training.data.reader import open_manifest

    _parquet(tmp_path / "src.parquet", _docs(80, seed=1))
    source = prep.files_source(str(tmp_path / "src.parquet"), "auto", "text")
    first = _prepare(source, tmp_path / "c", bpe)
    assert len(first.manifest.split(sh.TRAIN)) >= 5
    before = _files(tmp_path / "c")
    shards = _damage(tmp_path / "c")
    remade = {f for k in shards for f in (sh.shard_name(sh.TRAIN, k), sh.shard_name(sh.VAL, k))
              if f in before}
    with pytest.raises(sh.CorpusError, match="submitter data prepare --name c ") as refused:
        open_manifest(str(tmp_path / "c"), check=True)
    assert refused.value.exit_code == 2 and "\n" not in str(refused.value)
    assert prep.damage(FS, str(tmp_path / "c"), first.manifest) is not None
    again = _prepare(source, tmp_path / "c", bpe)
    assert not again.already and again.facts["repaired"]
    # shard 0's held-out part was damaged: shard 0 again (its train file too); 1 and 3 again
    planned = sum(f.startswith("train-") for f in before)
    assert set(again.written) == remade and again.skipped == planned - 3
    after = _files(tmp_path / "c")
    assert {f: b for f, (_, b) in after.items() if f.endswith(".bin")} == \
        {f: b for f, (_, b) in before.items() if f.endswith(".bin")}
    assert all(after[f] == before[f] for f in before if f.endswith(".bin") and f not in remade)
    open_manifest(str(tmp_path / "c"), check=True)  # trains again
    assert sh.read_manifest(FS, str(tmp_path / "c")).shards == first.manifest.shards
    assert _prepare(source, tmp_path / "c", bpe).already  # whole now: nothing to do


def test_without_its_manifest_a_truncated_shard_is_made_again_not_counted_whole(tmp_path, bpe):
    _parquet(tmp_path / "src.parquet", _docs(80, seed=1))
    source = prep.files_source(str(tmp_path / "src.parquet"), "auto", "text")
    first = _prepare(source, tmp_path / "c", bpe)
    (tmp_path / "c" / sh.MANIFEST).unlink()
    cut = tmp_path / "c" / "train-000002.bin"
    cut.write_bytes(cut.read_bytes()[:-10])
    again = _prepare(source, tmp_path / "c", bpe)
    assert again.written == ("val-000002.bin", "train-000002.bin")
    assert again.manifest.shards == first.manifest.shards
    sh.check_files(FS, str(tmp_path / "c"), again.manifest)


def test_force_makes_every_shard_again(tmp_path, bpe):
    _parquet(tmp_path / "src.parquet", _docs(40, seed=2))
    source = prep.files_source(str(tmp_path / "src.parquet"), "auto", "text")
    first = _prepare(source, tmp_path / "c", bpe)
    before = _files(tmp_path / "c")
    shards = {f for f in before if f.endswith(".bin")}
    inodes = {f: (tmp_path / "c" / f).stat().st_ino for f in shards}
    forced = _prepare(source, tmp_path / "c", bpe, force=True)
    assert not forced.already and set(forced.written) == shards and forced.facts["forced"]
    after = _files(tmp_path / "c")
    # each file written anew (a new file moved into place), with the same bytes
    assert all((tmp_path / "c" / f).stat().st_ino != inodes[f] for f in shards)
    assert all(after[f][1] == before[f][1] for f in shards)
    assert forced.manifest.shards == first.manifest.shards


def test_the_finer_hold_out_keeps_every_corpus_prepared_in_hundredths_of_a_percent():
    """Repairs and resumes of older corpora must hold out the same documents as before."""
    import zlib

    docs = [f"document {i} " * (i % 7) for i in range(3000)]
    for percent in (0.0, 0.01, 0.5, 5.0, 37.25, 100.0):
        old = [zlib.crc32(d.encode()) % 10_000 < percent * 100 for d in docs]
        assert [prep.is_held_out(d, percent) for d in docs] == old
    # below a hundredth of a percent the finer rule still holds some out (FineWeb-scale caps)
    many = [f"d{i}" for i in range(200_000)]
    assert 2 <= sum(prep.is_held_out(d, 0.005) for d in many) <= 20  # ~10 expected


def test_the_default_hold_out_is_capped_in_tokens_and_the_manifest_says_how_much(tmp_path, bpe):
    assert prep.hold_out_percent(5.0, 10e9) == pytest.approx(1.0)  # FineWeb-Edu 10B: 100 M
    assert prep.hold_out_percent(5.0, 1e9) == 5.0  # 5% is 50 M: smaller than the cap
    assert prep.hold_out_percent(0.0, 10e9) == 0.0
    _parquet(tmp_path / "src.parquet", _docs(400, seed=5))
    source = prep.files_source(str(tmp_path / "src.parquet"), "auto", "text")
    free = _prepare(source, tmp_path / "free", bpe, hold_out_tokens=10**9)
    capped = _prepare(source, tmp_path / "capped", bpe, hold_out_tokens=600)
    total = free.manifest.tokens(sh.TRAIN) + free.manifest.tokens(sh.VAL)
    assert free.manifest.tokens(sh.VAL) > 0.12 * total  # 20% asked, not capped
    assert 0 < capped.manifest.tokens(sh.VAL) < 0.06 * total  # ~600 of ~15k estimated
    v = capped.manifest.extra["validation"]
    assert v["kind"] == "hold-out" and v["capped"] and v["requested_percent"] == 20.0
    assert v["percent"] < 20.0 and v["cap_tokens"] == 600
    assert prep.describe_validation(capped.manifest).startswith(f"hold-out {v['percent']:.4g}% of "
                                                                "documents, capped at ~600 tokens")
    assert prep.describe_validation(free.manifest) == "hold-out 20% of documents"


def test_a_corpus_without_validation_tokens_says_so_plainly(tmp_path, bpe):
    from training.prepare import no_validation_note

    (tmp_path / "one.txt").write_text("a single short document\n", encoding="utf-8")
    out = _prepare(prep.files_source(str(tmp_path / "one.txt"), "auto", "text"), tmp_path / "c",
                   bpe, val_percent=5.0)
    assert out.manifest.tokens(sh.VAL) == 0 and out.manifest.tokens(sh.TRAIN) > 0
    note = no_validation_note(out.manifest, False, 5.0)
    assert note.startswith("note: no validation split: the source has none and the 5% hold-out "
                           "took no document") and "no val_loss" in note
    assert "--val-percent 0" in no_validation_note(out.manifest, False, 0.0)
    held = dataclasses.replace(out.manifest, shards=(sh.Shard("val-000000.bin", sh.VAL, 5),))
    assert no_validation_note(held, False, 5.0) == ""


def test_documents_are_written_in_the_plan_s_seeded_order(tmp_path, bpe):
    """Two sources listed by name (a 10% minority first): the plan records the seeded order,
    pieces are dealt to shards in a permutation and documents shuffled within each, so the
    minority is spread over the shards instead of filling the first ones."""
    enc = get_encoding(bpe)
    minority = [f"code {i} " + "print(x) " * 20 for i in range(10)]  # ~5 pieces of ~50
    majority = [f"prose {i} " + " ".join(_docs(1, seed=i)) for i in range(90)]
    for name, docs in (("a-code.jsonl", minority), ("b-prose.jsonl", majority)):
        (tmp_path / "src").mkdir(exist_ok=True)
        (tmp_path / "src" / name).write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    _prepare(prep.files_source(str(tmp_path / "src"), "auto", "text"), tmp_path / "c", bpe,
             val_percent=0.0, piece_bytes=300)
    plan = json.loads((tmp_path / "c" / prep.PLAN).read_text())
    assert plan["document_order"]["seed"] == prep.DOCUMENT_ORDER_SEED
    m = sh.read_manifest(FS, str(tmp_path / "c"))
    stream = []
    for s in m.split(sh.TRAIN):
        stream += np.frombuffer((tmp_path / "c" / s.file).read_bytes()[sh.HEADER_BYTES:],
                                dtype="<u2").tolist()
    cuts = [i for i, t in enumerate(stream) if t == enc.eot_token] + [len(stream)]
    written = [enc.decode(stream[a + 1:b]) for a, b in zip(cuts, cuts[1:])]
    assert sorted(written) == sorted(minority + majority)
    assert written != minority + majority  # not the listed order
    where = [i for i, d in enumerate(written) if d.startswith("code ")]
    # a piece keeps its documents together: the pieces spread the minority over the corpus
    assert min(where) < 50 < max(where) and max(where) - min(where) > 40
    assert where != list(range(min(where), min(where) + 10))  # not one run
    assert len(m.split(sh.TRAIN)) > 3  # several shards


def test_a_copied_or_touched_source_is_the_same_corpus(tmp_path, bpe):
    """Issue 37 item 9: the fingerprint is the files' content, not their mtimes."""
    import shutil

    _parquet(tmp_path / "a" / "src.parquet", _docs(30))
    big = tmp_path / "a" / "big.txt"  # bigger than HASH_WHOLE_BYTES: sampled
    big.write_bytes(b"x" * (prep.HASH_WHOLE_BYTES + 12345))
    first = prep.files_source(str(tmp_path / "a"), "text", "text")
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # new mtimes
    os.utime(tmp_path / "a" / "src.parquet", (1, 1))  # touched
    assert prep.files_source(str(tmp_path / "a"), "text", "text").fingerprint() == \
        prep.files_source(str(tmp_path / "b"), "text", "text").fingerprint() == first.fingerprint()
    with open(big, "r+b") as f:  # the same size, other bytes at the start
        f.write(b"y")
    assert prep.files_source(str(tmp_path / "a"), "text", "text").fingerprint() != first.fingerprint()
    # a corpus recorded with the old (mtime) fingerprint is still recognized, its key kept
    _parquet(tmp_path / "c" / "src.parquet", _docs(30))
    source = prep.files_source(str(tmp_path / "c" / "src.parquet"), "auto", "text")
    identity = sh.tokenizer_identity(get_encoding(bpe))
    old = prep.plan_key(source, identity, 20.0, 400, 600, legacy=True)
    assert old != prep.plan_key(source, identity, 20.0, 400, 600)
    out = _prepare(source, tmp_path / "out", bpe)
    manifest = dataclasses.replace(out.manifest, extra={**out.manifest.extra, "key": old})
    sh.write_manifest(FS, str(tmp_path / "out"), manifest)
    again = _prepare(source, tmp_path / "out", bpe)
    assert again.already and again.manifest.extra["key"] == old


def test_a_hub_dataset_is_read_at_the_commit_main_is_at():
    class Api:
        def __init__(self, error=None):
            self.error = error

        def dataset_info(self, name):
            if self.error:
                raise self.error
            return type("Info", (), {"sha": "0123abc"})()

    class NotFound(Exception):
        response = type("R", (), {"status_code": 404})()

    assert prep.hub_root("HuggingFaceFW/fineweb-edu", Api()) == "datasets/HuggingFaceFW/fineweb-edu@0123abc"
    assert prep.hub_root("someone/x@v2", Api()) == "datasets/someone/x@v2"
    with pytest.raises(UsageError, match="not on the Hugging Face Hub"):
        prep.hub_root("someone/gone", Api(NotFound("404 Client Error")))
    with pytest.raises(Exception, match="did not answer") as e:  # transient: not bad input
        prep.hub_root("someone/x", Api(ConnectionError("timed out")))
    assert e.value.exit_code == 1


# --- issue 37 item 11: bounded memory at full parallelism -------------------------------------

def _gz_jsonl(path, docs):
    import gzip

    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")


@pytest.mark.parametrize("skip", [False, True], ids=["seek", "decompressing-stream"])
def test_ranges_cut_anywhere_hold_each_line_once(skip):
    """`stream_lines`: ranges cut at any byte (a compressed file's ranges are not aligned)
    give every line exactly once, whatever the chunk size."""
    import io

    rng = np.random.default_rng(5)
    data = b"".join(b"x" * int(rng.integers(0, 9)) + b"\n" for _ in range(200)) + b"tail"
    lines, pos = [], 0
    for line in data.split(b"\n"):
        lines.append((pos, line))
        pos += len(line) + 1
    want = lines if lines[-1][1] else lines[:-1]
    for cuts in ([], [1], [5, 6, 7], sorted(rng.choice(len(data), 30, replace=False).tolist())):
        bounds = [0, *cuts, -1]
        got = [ln for a, b in zip(bounds, bounds[1:])
               for ln in prep.stream_lines(io.BytesIO(data), a, b, skip=skip, chunk=7)]
        assert got == want, cuts


def test_a_compressed_source_is_read_a_bounded_number_of_bytes_at_a_time(tmp_path, bpe):
    """A `.jsonl.gz` was decompressed whole into memory (and its text held again as lines and
    documents): its documents now stream, the peak bounded by READ_BYTES, not the file."""
    import tracemalloc

    doc = "the sea and the shell " * 200  # ~4.4 kB a document, ~44 MB of text
    path = tmp_path / "big.jsonl.gz"
    _gz_jsonl(path, [f"{i} {doc}" for i in range(10_000)])
    tracemalloc.start()
    try:
        count = sum(1 for _ in prep.range_documents(FS, "jsonl", "text", [str(path), 0, -1]))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 10_000
    assert peak < 8 * prep.READ_BYTES, f"peak {peak / 2**20:.1f} MiB reading ~44 MB of text"


def test_a_piece_s_tokens_are_buffered_as_uint16_not_python_ints(tmp_path, bpe):
    """Tokens accumulated as Python ints (~36 B a token); as uint16 arrays a piece's peak is a
    few bytes a token plus the read buffer."""
    import tracemalloc

    path = tmp_path / "d.jsonl.gz"
    docs = _docs(8000, seed=9)
    _gz_jsonl(path, [" ".join(docs[i:i + 10]) for i in range(0, 8000, 10)])  # ~450 tokens each
    piece = {"split": sh.TRAIN, "bytes": 0, "ranges": [[str(path), 0, -1]]}
    work = {"fs": FS, "fmt": "jsonl", "text_column": "text", "tokenizer": bpe, "dtype": "uint16",
            "val_percent": 0.0, "hold_out": False, "shuffle_seed": 1}
    prep.tokenize_piece(piece, **work)  # the tokenizer loaded before measuring
    tracemalloc.start()
    try:
        out = prep.tokenize_piece(piece, **work)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    tokens = len(out["train"])
    assert out["train"].dtype == np.dtype("<u2") and out["documents"] == 800 and tokens > 300_000
    assert peak < prep.READ_BYTES + 8 * tokens, f"{peak / tokens:.1f} B a token"


@pytest.mark.parametrize("estimate", [None, 0.2, 5.0], ids=["gzip-trailer", "under", "over"])
def test_one_compressed_file_is_split_into_pieces_that_hold_each_document_once(
        tmp_path, bpe, monkeypatch, estimate):
    """One `.jsonl.gz` was one piece (one CPU, its whole text in memory): it is cut into
    ranges of its decompressed text, each document in exactly one, even when the text size
    estimate is wrong; the corpus is the plain file's."""
    docs = _docs(120, seed=4)
    path = tmp_path / "src" / "one.jsonl.gz"
    path.parent.mkdir()
    _gz_jsonl(path, docs)
    text_bytes = sum(len(json.dumps({"text": d}).encode()) + 1 for d in docs)
    if estimate is None:
        ref = prep.FileRef(str(path), "x", path.stat().st_size, "")
        assert prep.text_size_estimate(FS, ref) == text_bytes  # the gzip trailer's size
    else:
        monkeypatch.setattr(prep, "text_size_estimate", lambda fs, ref: int(text_bytes * estimate))
    source = prep.files_source(str(path), "auto", "text")
    pieces = prep.make_pieces(source, 600)
    assert len(pieces) > 4 and pieces[-1]["ranges"][-1][2] == -1
    _prepare(source, tmp_path / "c", bpe, val_percent=0.0)
    m = sh.read_manifest(FS, str(tmp_path / "c"))
    assert _read(tmp_path / "c", m, sh.TRAIN) == _expected(docs, bpe, 0.0)[sh.TRAIN]


def test_a_parquet_file_is_opened_once_per_piece_not_per_row_group(tmp_path, bpe, monkeypatch):
    docs = _docs(70, seed=6)
    _parquet(tmp_path / "p.parquet", docs, rows_per_group=5)  # 14 row groups
    source = prep.files_source(str(tmp_path / "p.parquet"), "auto", "text")
    pieces = prep.make_pieces(source, 1 << 20)
    assert len(pieces) == 1 and len(pieces[0]["ranges"]) == 14
    opened = []

    class Counting(pq.ParquetFile):
        def __init__(self, *a, **kw):
            opened.append(a[0])
            super().__init__(*a, **kw)

    monkeypatch.setattr(pq, "ParquetFile", Counting)
    out = prep.tokenize_piece(pieces[0], fs=FS, fmt="parquet", text_column="text", tokenizer=bpe,
                              dtype="uint16", val_percent=0.0, hold_out=False)
    assert opened == [str(tmp_path / "p.parquet")]
    assert out["documents"] == 70


def test_a_compressed_file_is_decompressed_once_for_all_its_pieces(tmp_path, bpe):
    """`feed_ranges` (one Ray task a compressed file) hands each piece the lines it would
    read alone: the same documents, the same tokens, one pass over the file."""
    docs = _docs(150, seed=8)
    path = tmp_path / "one.jsonl.gz"
    _gz_jsonl(path, docs)
    source = prep.files_source(str(path), "auto", "text")
    pieces = prep.make_pieces(source, 500)
    ranges = [r for p in pieces for r in p["ranges"]]
    assert len(ranges) > 5
    wanted = ranges[1::2]  # some of them, as a resumed prepare needs
    fed = list(prep.feed_ranges(FS, str(path), [r[1:] for r in wanted]))
    assert len(fed) == len(wanted)
    for rng, text in zip(wanted, fed):
        alone = list(prep.range_documents(FS, "jsonl", "text", rng))
        assert list(prep.range_documents(FS, "jsonl", "text", rng, fed=text)) == alone
    work = {"fs": FS, "fmt": "jsonl", "text_column": "text", "tokenizer": bpe, "dtype": "uint16",
            "val_percent": 10.0, "hold_out": True, "shuffle_seed": 3}
    piece = {"split": sh.TRAIN, "bytes": 0, "ranges": wanted}
    given = {tuple(r): t for r, t in zip(wanted, fed)}
    a, b = prep.tokenize_piece(piece, **work), prep.tokenize_piece(piece, **work, fed=given)
    assert a["documents"] == b["documents"] > 0
    assert a["train"].tolist() == b["train"].tolist() and a["val"].tolist() == b["val"].tolist()
