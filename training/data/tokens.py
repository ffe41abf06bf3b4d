"""Tokenizers and `tokenize_and_chunk`: text rows -> fixed blocks of token ids.

Three encodings, all `tiktoken.Encoding` objects with `<|endoftext|>` as the document separator:
- "gpt2": tiktoken's GPT-2 BPE (needs a download the first time);
- a GPT-2 BPE built from a ranks file (`--bpe-file`, e.g. whisper's gpt2.tiktoken): identical
  ids, no network;
- "byte": 256 byte ranks + `<|endoftext|>` = 256. Works everywhere, offline, and is the local
  default when no BPE is available.
The driver picks one (`resolve_tokenizer`) and hands a small `TokenizerSpec` to the Ray Data
tasks, which rebuild the encoding once per process.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Mapping, Optional

import numpy as np

from submitter.contract.naming import ENV_GPT2_BPE

EOT = "<|endoftext|>"
#: GPT-2's pre-tokenizer pattern (tiktoken's r50k_pat_str).
R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_EOT_ID = 50256
BYTE_EOT_ID = 256
BYTE_ENCODING_NAME = "bytes"
#: A WikiText article title line: " = Title = " (a section is " = = Section = = ").
_TITLE = re.compile(r"^ = (?!=).*(?<!=) = $")


@dataclass(frozen=True)
class TokenizerSpec:
    """Enough to rebuild an encoding in any process: kind gpt2 | bpe-file | byte."""

    kind: str
    bpe_file: Optional[str] = None

    def describe(self) -> str:
        if self.kind == "bpe-file":
            return f"GPT-2 BPE from {self.bpe_file}"
        if self.kind == "gpt2":
            return "GPT-2 BPE (tiktoken gpt2)"
        return "byte-level (256 bytes + <|endoftext|>, offline)"


def _byte_ids(text: str) -> bytes:
    """What the byte encoding gives (its ranks are the bytes themselves, with no merges),
    without its regex pre-split: ~50x faster, so Ray Data leaves the CPUs to training."""
    return text.encode("utf-8")


def byte_encoding():
    import tiktoken

    return tiktoken.Encoding(
        name=BYTE_ENCODING_NAME, pat_str=R50K_PATTERN,
        mergeable_ranks={bytes([i]): i for i in range(256)},
        special_tokens={EOT: BYTE_EOT_ID})


def bpe_file_encoding(path: str):
    """The GPT-2 encoding from a tiktoken-format ranks file, with no download."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    return tiktoken.Encoding(name="gpt2", pat_str=R50K_PATTERN,
                             mergeable_ranks=load_tiktoken_bpe(path),
                             special_tokens={EOT: GPT2_EOT_ID})


@lru_cache(maxsize=4)
def get_encoding(spec: TokenizerSpec):
    """The encoding for a spec, built once per process (Ray Data tasks reuse it)."""
    if spec.kind == "byte":
        return byte_encoding()
    if spec.kind == "bpe-file":
        return bpe_file_encoding(str(spec.bpe_file))
    import tiktoken

    return tiktoken.get_encoding("gpt2")


def baked_bpe_file(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The GPT-2 BPE ranks the image carries (`$SUBMITTER_GPT2_BPE`, set by the Dockerfile), so
    an air-gapped cluster needs no download; None where there is none (a laptop)."""
    path = environ.get(ENV_GPT2_BPE)
    return path if path and os.path.isfile(path) else None


def resolve_tokenizer(choice: str, bpe_file: Optional[str],
                      environ: Mapping[str, str] = os.environ) -> tuple[TokenizerSpec, str]:
    """Pick the encoding on the driver; return it and a sentence saying why (for the output).

    auto and gpt2: `--bpe-file` if given, else the ranks baked into the image, else tiktoken's
    gpt2 if it can be loaded (cached or downloadable); auto then falls back to the offline
    byte-level encoding.
    """
    if choice != "byte" and not bpe_file:
        bpe_file = baked_bpe_file(environ)
    if bpe_file or choice == "bpe-file":
        spec = TokenizerSpec("bpe-file", bpe_file)
        get_encoding(spec)  # fail here, on the driver, with the file name
        return spec, f"tokenizer: {spec.describe()}"
    if choice == "byte":
        return TokenizerSpec("byte"), "tokenizer: byte-level (asked for with --tokenizer byte)"
    try:
        get_encoding(TokenizerSpec("gpt2"))
        return TokenizerSpec("gpt2"), "tokenizer: GPT-2 BPE (tiktoken gpt2)"
    except Exception as e:  # network or cache failure: no internet
        if choice == "gpt2":
            raise RuntimeError(f"tiktoken cannot load the gpt2 encoding ({type(e).__name__}); "
                               "pass --bpe-file PATH to build it offline") from e
        return TokenizerSpec("byte"), ("tokenizer: byte-level (256 bytes + <|endoftext|>), "
                                       "because tiktoken's gpt2 needs a download and none is "
                                       "possible; pass --bpe-file for GPT-2 BPE offline")


def is_title(line: str) -> bool:
    """True for a WikiText article title (` = Title = `), false for ` = = Section = = `."""
    return bool(_TITLE.match(line.rstrip("\n")))


def tokenize_and_chunk(texts: Iterable[str], encoding, block_size: int) -> np.ndarray:
    """Rows of text -> an int64 array [n_blocks, block_size].

    An `<|endoftext|>` goes before each article title line, each row ends with one newline
    (added unless it has one: WikiText from the Hub keeps it, a text file's lines do not), all
    tokens are concatenated and cut into fixed blocks; the remainder is dropped.
    """
    eot = encoding.eot_token
    encode = _byte_ids if encoding.name == BYTE_ENCODING_NAME else encoding.encode_ordinary
    ids: list[int] = []
    for text in texts:
        if is_title(text):
            ids.append(eot)
        if not text.endswith("\n"):
            text += "\n"
        ids.extend(encode(text))
    n = len(ids) // block_size
    return np.asarray(ids[: n * block_size], dtype=np.int64).reshape(n, block_size)


def is_validation_block(block: np.ndarray, val_percent: float) -> bool:
    """Deterministic hold-out by content (same on every worker, every run, any order)."""
    import zlib

    return zlib.crc32(np.ascontiguousarray(block, dtype=np.int64).tobytes()) % 10_000 < val_percent * 100
