"""The prepared corpus on disk: token shards plus a manifest, written once, read by position.

A prepared corpus is one directory (on the run's RWX volume or in a bucket):

    <corpus>/manifest.json        written last: its presence means "complete"
    <corpus>/val-000000.bin       the validation shard(s)
    <corpus>/train-000000.bin     training shards of ~SHARD_TOKENS tokens each
    <corpus>/train-000001.bin ...

A shard is llm.c's format (`dev/data/data_common.py`, `llmc/dataloader.h`), so llm.c reads
it as is: a header of 256 little-endian int32 (magic, version, token count, then zeros) and
the tokens, uint16 when the vocabulary fits (magic 20240520, version 1: GPT-2) else uint32
(magic 20240801, version 7). The token stream holds an EOT before each document. A position in
the corpus is (shard, offset): one seek, no scan.

The manifest (`Manifest`) says what the shards mean: the source and its fingerprint, the
tokenizer (encoding, vocabulary size, EOT id), the EOT policy, the dtype, and each shard's
token count. It is checked against the files (`check_files`: each header and size, one small
read per shard) and against the job (`check_tokenizer`) before any GPU work.

Pure Python + NumPy; file access goes through a pyarrow filesystem so a volume and a bucket
read the same way.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from submitter.contract.errors import UsageError

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
#: llm.c's (magic, version) per token width.
HEADERS = {"uint16": (20240520, 1), "uint32": (20240801, 7)}
#: Target tokens per training shard (llm.c's FineWeb shards: 10^8).
SHARD_TOKENS = 100_000_000
MANIFEST = "manifest.json"
FORMAT = "submitter-corpus"
FORMAT_VERSION = 1
#: The one EOT policy: `<|endoftext|>` before each document (llm.c, GPT-2's training data).
EOT_POLICY = "eot-before-each-document"
TRAIN, VAL = "train", "val"


class CorpusError(UsageError):
    """A prepared corpus that cannot be trained on as it is (one line: what, and the fix)."""


def dtype_for(vocab_size: int) -> str:
    """uint16 while every id fits (GPT-2's 50,257 does), else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def itemsize(dtype: str) -> int:
    return 2 if dtype == "uint16" else 4


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:06d}.bin"


def encode_header(tokens: int, dtype: str) -> bytes:
    magic, version = HEADERS[dtype]
    return struct.pack(f"<{HEADER_INTS}i", magic, version, tokens, *([0] * (HEADER_INTS - 3)))


def decode_header(raw: bytes, where: str = "shard") -> tuple[str, int]:
    """(dtype, token count) from a shard's first HEADER_BYTES; CorpusError when it is none."""
    if len(raw) < HEADER_BYTES:
        raise CorpusError(f"{where}: {len(raw)} bytes, shorter than the {HEADER_BYTES}-byte shard "
                          f"header (truncated?): prepare the corpus again")
    magic, version, tokens = struct.unpack("<3i", raw[:12])
    for dtype, known in HEADERS.items():
        if (magic, version) == known:
            return dtype, tokens
    raise CorpusError(f"{where}: not a token shard (magic {magic}, version {version}; expected "
                      f"llm.c's {HEADERS}): prepare the corpus again")


def shard_bytes(tokens: Any, dtype: str) -> bytes:
    """A whole shard file's bytes: header + tokens (a 1-D integer array or sequence)."""
    import numpy as np

    array = np.asarray(tokens)
    if array.size and (int(array.min()) < 0 or int(array.max()) >= 1 << (8 * itemsize(dtype))):
        raise ValueError(f"token ids out of the {dtype} range")
    return encode_header(int(array.size), dtype) + array.astype(f"<u{itemsize(dtype)}").tobytes()


def write_shard(fs: Any, path: str, tokens: Any, dtype: str) -> int:
    """Write one shard with a pyarrow filesystem; returns its token count. On a local or
    mounted filesystem the file appears whole (written beside it, then moved): an interrupted
    prepare never leaves a shard that looks complete. An object store's PUT is whole already."""
    data = shard_bytes(tokens, dtype)
    write_whole(fs, path, data)
    return (len(data) - HEADER_BYTES) // itemsize(dtype)


def write_whole(fs: Any, path: str, data: bytes) -> None:
    """Write a file so that it appears whole or not at all: on a local or mounted filesystem
    beside it, then moved; an object store's PUT is whole already."""
    local = type(fs).__name__ == "LocalFileSystem"
    target = f"{path}.partial" if local else path
    with fs.open_output_stream(target) as out:
        out.write(data)
    if local:
        fs.move(target, path)


@dataclass(frozen=True)
class Shard:
    file: str      # name inside the corpus directory
    split: str     # "train" | "val"
    tokens: int


@dataclass(frozen=True)
class Manifest:
    """What a prepared corpus is. Stored as `manifest.json`; compared field by field."""

    name: str
    source: dict[str, Any]       # {"kind", "what", "fingerprint"}: what was read
    tokenizer: dict[str, Any]    # {"encoding", "vocab_size", "eot_id"}
    dtype: str
    shards: tuple[Shard, ...]
    eot: str = EOT_POLICY
    shard_tokens: int = SHARD_TOKENS
    format: str = FORMAT
    version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)  # prepare's facts (seconds, rows...)

    def split(self, split: str) -> tuple[Shard, ...]:
        return tuple(s for s in self.shards if s.split == split)

    def tokens(self, split: str = TRAIN) -> int:
        return sum(s.tokens for s in self.split(split))

    def to_json(self) -> str:
        doc = asdict(self)
        doc["shards"] = [asdict(s) for s in self.shards]
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = MANIFEST) -> "Manifest":
        try:
            doc = json.loads(text)
            if doc.get("format") != FORMAT:
                raise CorpusError(f"{where}: not a prepared corpus manifest (format "
                                  f"{doc.get('format')!r}, expected {FORMAT!r})")
            if doc.get("version") != FORMAT_VERSION:
                raise CorpusError(f"{where}: corpus format version {doc.get('version')}, this "
                                  f"image reads {FORMAT_VERSION}: prepare the corpus again")
            shards = tuple(Shard(str(s["file"]), str(s["split"]), int(s["tokens"]))
                           for s in doc.pop("shards"))
            doc.pop("format"), doc.pop("version")
            return cls(shards=shards, **doc)
        except CorpusError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CorpusError(f"{where}: unreadable manifest ({exc}): prepare the corpus "
                              f"again") from None


def read_manifest(fs: Any, root: str) -> Optional[Manifest]:
    """The corpus's manifest, or None when `root` holds none (not prepared, or not finished)."""
    import pyarrow.fs as pafs

    path = f"{root.rstrip('/')}/{MANIFEST}"
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        return Manifest.from_json(f.read().decode("utf-8"), where=path)


def write_manifest(fs: Any, root: str, manifest: Manifest) -> None:
    """Written last, whole (local: beside it, then moved)."""
    write_whole(fs, f"{root.rstrip('/')}/{MANIFEST}", manifest.to_json().encode("utf-8"))


def check_files(fs: Any, root: str, manifest: Manifest) -> None:
    """Every shard the manifest names is there, whole, and says what the manifest says: one
    header read and one size per shard. CorpusError (one line) on the first that is not."""
    import pyarrow.fs as pafs

    base = root.rstrip("/")
    fix = (f"prepare the corpus again (submitter data prepare --name {manifest.name} with its "
           f"source and tokenizer: it makes the missing or damaged shards again)")
    infos = fs.get_file_info([f"{base}/{s.file}" for s in manifest.shards])
    for shard, info in zip(manifest.shards, infos):
        where = f"{base}/{shard.file}"
        if info.type != pafs.FileType.File:
            raise CorpusError(f"{where}: missing (the manifest lists it): {fix}")
        with fs.open_input_file(where) as f:
            try:
                dtype, tokens = decode_header(f.read(HEADER_BYTES), where)
            except CorpusError as e:
                raise CorpusError(str(e).replace("prepare the corpus again", fix)) from None
        if dtype != manifest.dtype or tokens != shard.tokens:
            raise CorpusError(f"{where}: holds {tokens} {dtype} tokens, the manifest says "
                              f"{shard.tokens} {manifest.dtype}: {fix}")
        expected = HEADER_BYTES + tokens * itemsize(dtype)
        if info.size != expected:
            raise CorpusError(f"{where}: {info.size} bytes, a shard of {tokens} tokens has "
                              f"{expected} (truncated?): {fix}")


def tokenizer_identity(encoding: Any) -> dict[str, Any]:
    """What decides whether token ids mean the same: the encoding's name, size and EOT id
    (GPT-2 BPE from tiktoken and from a ranks file are the same: both are named gpt2)."""
    from training.data.tokens import EOT

    return {"encoding": encoding.name, "vocab_size": int(encoding.n_vocab),
            "eot_id": int(encoding.encode_single_token(EOT))}


def check_tokenizer(manifest: Manifest, identity: dict[str, Any], where: str) -> None:
    """The job's tokenizer must be the one the corpus was prepared with."""
    mine = {k: manifest.tokenizer.get(k) for k in identity}
    if mine != identity:
        raise CorpusError(f"{where}: prepared with tokenizer {manifest.tokenizer}, the job uses "
                          f"{identity}: train with the corpus's tokenizer (--tokenizer/--bpe-file) "
                          f"or prepare the corpus again with the job's")
