"""The prepared corpus's files: llm.c's shard format, the manifest, and the checks that refuse
a corpus that is not what it says, in one line, before any GPU work."""

from __future__ import annotations

import struct

import numpy as np
import pyarrow.fs as pafs
import pytest

from tests.conftest import shared_file
from training.data import shards as sh


def _corpus(tmp_path, dtype="uint16", counts=(1000, 700)):
    fs = pafs.LocalFileSystem()
    files = []
    for i, n in enumerate(counts):
        split = sh.VAL if i == 0 else sh.TRAIN
        name = sh.shard_name(split, 0 if i == 0 else i - 1)
        sh.write_shard(fs, str(tmp_path / name), np.arange(n) % 50257, dtype)
        files.append(sh.Shard(name, split, n))
    m = sh.Manifest(name="c", source={"kind": "files", "what": "x", "fingerprint": "f"},
                    tokenizer={"encoding": "gpt2", "vocab_size": 50257, "eot_id": 50256},
                    dtype=dtype, shards=tuple(files))
    sh.write_manifest(fs, str(tmp_path), m)
    return fs, m


def test_a_shard_is_llm_c_s_format(tmp_path):
    fs = pafs.LocalFileSystem()
    tokens = np.array([50256, 1, 2, 65535], dtype=np.int64)
    sh.write_shard(fs, str(tmp_path / "s.bin"), tokens, "uint16")
    raw = (tmp_path / "s.bin").read_bytes()
    header = struct.unpack("<256i", raw[:1024])
    assert header[:3] == (20240520, 1, 4) and set(header[3:]) == {0}
    assert np.frombuffer(raw[1024:], dtype="<u2").tolist() == tokens.tolist()
    assert not list(tmp_path.glob("*.partial"))
    assert sh.decode_header(raw) == ("uint16", 4)


def test_a_vocabulary_past_uint16_gets_uint32_shards(tmp_path):
    assert sh.dtype_for(50257) == "uint16" and sh.dtype_for(128256) == "uint32"
    raw = sh.shard_bytes([128000, 5], "uint32")
    assert sh.decode_header(raw) == ("uint32", 2)
    assert struct.unpack("<2i", raw[:8]) == (20240801, 7)
    with pytest.raises(ValueError):
        sh.shard_bytes([70000], "uint16")


def test_the_manifest_round_trips_and_checks_its_files(tmp_path):
    fs, m = _corpus(tmp_path)
    back = sh.read_manifest(fs, str(tmp_path))
    assert back == m and back.tokens(sh.TRAIN) == 700 and back.tokens(sh.VAL) == 1000
    sh.check_files(fs, str(tmp_path), back)  # whole: no error
    assert sh.read_manifest(fs, str(tmp_path / "nothing-here")) is None


@pytest.mark.parametrize("damage, says", [
    (lambda p: p.write_bytes(p.read_bytes()[:-10]), "truncated"),
    (lambda p: p.unlink(), "missing"),
    (lambda p: p.write_bytes(sh.shard_bytes(np.arange(5), "uint16")), "the manifest says"),
    (lambda p: p.write_bytes(b"x" * 2000), "not a token shard"),
    (lambda p: p.write_bytes(b"x" * 10), "shorter than"),
])
def test_a_damaged_shard_is_one_line_naming_it(tmp_path, damage, says):
    fs, m = _corpus(tmp_path)
    damage(tmp_path / "train-000000.bin")
    with pytest.raises(sh.CorpusError) as err:
        sh.check_files(fs, str(tmp_path), m)
    assert says in str(err.value) and "train-000000.bin" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_manifest_of_another_format_or_tokenizer_is_refused(tmp_path):
    fs, m = _corpus(tmp_path)
    with pytest.raises(sh.CorpusError, match="not a prepared corpus"):
        sh.Manifest.from_json('{"format": "other"}')
    with pytest.raises(sh.CorpusError, match="unreadable"):
        sh.Manifest.from_json("{not json")
    sh.check_tokenizer(m, {"encoding": "gpt2", "vocab_size": 50257, "eot_id": 50256}, "c")
    with pytest.raises(sh.CorpusError, match="prepared with tokenizer"):
        sh.check_tokenizer(m, {"encoding": "bytes", "vocab_size": 257, "eot_id": 256}, "c")


def test_the_tokenizer_identity_is_the_same_for_tiktoken_and_a_ranks_file():
    from training.data.tokens import TokenizerSpec, get_encoding

    bpe = str(shared_file("data", "gpt2.tiktoken"))
    ident = sh.tokenizer_identity(get_encoding(TokenizerSpec("bpe-file", bpe)))
    assert ident == {"encoding": "gpt2", "vocab_size": 50257, "eot_id": 50256}
    assert sh.tokenizer_identity(get_encoding(TokenizerSpec("byte"))) == {
        "encoding": "bytes", "vocab_size": 257, "eot_id": 256}
