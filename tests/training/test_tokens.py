"""Tokenization: the offline GPT-2 encoding and tokenize_and_chunk on real WikiText-2 lines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from submitter.contract.naming import ENV_GPT2_BPE
from tests.conftest import shared_file
from training.data.tokens import (BYTE_EOT_ID, GPT2_EOT_ID, TokenizerSpec, baked_bpe_file,
                             byte_encoding, get_encoding, is_title, is_validation_block, resolve_tokenizer,
                             tokenize_and_chunk)


@pytest.fixture(scope="module")
def gpt2():
    return get_encoding(TokenizerSpec("bpe-file", str(shared_file("data", "gpt2.tiktoken"))))


@pytest.fixture(scope="module")
def wiki_lines() -> list[str]:
    return shared_file("data", "wikitext-2", "valid.txt").read_text(encoding="utf-8").splitlines()


def test_bpe_file_gives_the_ids_of_the_shared_readme(gpt2):
    assert gpt2.encode_ordinary("Hello world") == [15496, 995]
    assert gpt2.encode_ordinary(" the") == [262]
    assert gpt2.encode_ordinary(" = Valkyria Chronicles III = \n") == [
        796, 569, 18354, 7496, 17740, 6711, 796, 220, 198]
    assert gpt2.eot_token == GPT2_EOT_ID and gpt2.n_vocab == 50257


def test_byte_encoding_is_offline_and_lossless():
    enc = byte_encoding()
    text = "def f(x):\n    return 'é' * x\n"
    assert enc.n_vocab == 257 and enc.eot_token == BYTE_EOT_ID
    assert enc.encode_ordinary(text) == list(text.encode("utf-8"))
    assert enc.decode(enc.encode_ordinary(text)) == text


@pytest.mark.parametrize("line, title", [
    (" = Homarus gammarus = ", True),
    (" = Valkyria Chronicles III = \n", True),
    (" = = Description = = ", False),
    (" = = = Sub section = = = ", False),
    (" The = sign = ", False),
    ("", False),
])
def test_title_lines(line, title):
    assert is_title(line) is title


def _reference(texts, enc, block):
    """The semantics spelled out the slow way, independently of the implementation."""
    stream: list[int] = []
    for t in texts:
        stripped = t[:-1] if t.endswith("\n") else t
        if stripped.startswith(" = ") and not stripped.startswith(" = = ") and stripped.endswith(" = "):
            stream.append(enc.eot_token)
        stream += enc.encode_ordinary(stripped + "\n")
    n = len(stream) // block
    return [stream[i * block:(i + 1) * block] for i in range(n)], stream[n * block:]


def test_chunking_real_wikitext(gpt2, wiki_lines):
    lines = wiki_lines[:400]
    blocks = tokenize_and_chunk(lines, gpt2, 64)
    expected, remainder = _reference(lines, gpt2, 64)
    assert blocks.dtype == np.int64 and blocks.shape == (len(expected), 64)
    assert blocks.tolist() == expected
    assert 0 < len(remainder) < 64  # the remainder was really dropped, not padded
    flat = blocks.reshape(-1).tolist()
    titles = [ln for ln in lines if is_title(ln)]
    assert len(titles) >= 1
    # one EOT per article title, directly before the title's tokens
    first_title_ids = gpt2.encode_ordinary(titles[0] + "\n")
    i = flat.index(GPT2_EOT_ID)
    assert flat[i + 1:i + 1 + len(first_title_ids)] == first_title_ids
    n_titles_in_blocks = sum(1 for t in flat if t == GPT2_EOT_ID)
    assert n_titles_in_blocks <= len(titles)


def test_rows_already_ending_in_newline_are_not_doubled(gpt2):
    hub_style = tokenize_and_chunk([" = A = \n", " text \n"], gpt2, 1)
    file_style = tokenize_and_chunk([" = A = ", " text "], gpt2, 1)
    assert hub_style.tolist() == file_style.tolist()
    assert hub_style[0, 0] == GPT2_EOT_ID


def test_section_lines_get_no_eot(gpt2):
    ids = tokenize_and_chunk([" = = Section = = ", "x"], gpt2, 1).reshape(-1).tolist()
    assert GPT2_EOT_ID not in ids


def test_block_boundaries_cross_rows():
    enc = byte_encoding()
    out = tokenize_and_chunk(["ab", "cd"], enc, 3)  # "ab\ncd\n" = 6 bytes -> 2 blocks
    assert out.tolist() == [[97, 98, 10], [99, 100, 10]]
    assert tokenize_and_chunk(["a"], enc, 3).shape == (0, 3)


def test_validation_hold_out_is_deterministic_and_roughly_sized():
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 257, size=(4000, 16))
    picks = [is_validation_block(b, 5.0) for b in blocks]
    assert picks == [is_validation_block(b.copy(), 5.0) for b in blocks]
    assert 100 < sum(picks) < 300
    assert not any(is_validation_block(b, 0.0) for b in blocks)


def test_resolve_tokenizer_prefers_the_bpe_file_and_falls_back_to_bytes():
    path = str(shared_file("data", "gpt2.tiktoken"))
    spec, line = resolve_tokenizer("auto", path)
    assert spec == TokenizerSpec("bpe-file", path) and path in line
    spec, line = resolve_tokenizer("byte", None)
    assert spec.kind == "byte" and "byte" in line


def test_the_byte_fast_path_equals_the_byte_encoding(wiki_lines):
    enc = byte_encoding()
    lines = wiki_lines[:300] + ["naïve — ünïcode ✓", " = Title = "]
    slow: list[int] = []
    for line in lines:
        if is_title(line):
            slow.append(BYTE_EOT_ID)
        slow += enc.encode_ordinary(line + "\n")
    n = len(slow) // 32
    assert tokenize_and_chunk(lines, enc, 32).reshape(-1).tolist() == slow[:n * 32]


def test_the_image_s_baked_gpt2_ranks_are_the_default_without_a_download(tmp_path):
    """The image sets $SUBMITTER_GPT2_BPE: auto and gpt2 use it (no download on an air-gapped
    cluster); byte stays byte; an explicit --bpe-file wins; a missing file is ignored."""
    path = str(shared_file("data", "gpt2.tiktoken"))
    baked = {ENV_GPT2_BPE: path}
    for choice in ("auto", "gpt2"):
        spec, line = resolve_tokenizer(choice, None, environ=baked)
        assert spec == TokenizerSpec("bpe-file", path) and path in line
        assert get_encoding(spec).encode("Hello world") == [15496, 995]
    assert resolve_tokenizer("byte", None, environ=baked)[0].kind == "byte"
    other = tmp_path / "other.tiktoken"
    other.write_bytes(Path(path).read_bytes())
    assert resolve_tokenizer("auto", str(other), environ=baked)[0].bpe_file == str(other)
    assert baked_bpe_file({ENV_GPT2_BPE: str(tmp_path / "absent")}) is None
