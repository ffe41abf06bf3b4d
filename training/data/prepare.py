"""Prepare once: a source -> token shards + a manifest on durable storage (`training.data.shards`).

What it does, in order:
1. The source is listed (`hub_source`, `files_source`, `offline_source`): its files, their
   sizes and versions make the source's fingerprint. Nothing is downloaded whole: a Hub
   dataset's Parquet files are read through an fsspec filesystem (`huggingface_hub`'s
   HfFileSystem) by ranged reads, a file or a bucket through pyarrow's filesystems.
2. The source is cut into input pieces (Parquet row groups, line-aligned byte ranges of text
   or JSONL, packed to ~PIECE_BYTES), and the pieces into shards of ~shard_tokens tokens (by an
   estimate of tokens per byte). That plan is written first (`plan.json`), before any shard:
   it names the fingerprint, the tokenizer, the settings and which pieces make which shard.
3. The shards not written yet are made on Ray Data across the cluster's CPUs (`map_batches`,
   order preserved): with at least as many shards as CPUs, a task per shard tokenizes its
   pieces and writes the shard where it runs (`make_shard`); with fewer, a Ray task per piece
   and a writer task per shard that gathers its pieces' tokens (`shards_fanned_out`): every
   CPU works whatever the file count, and the tokens never pass through the driver. A piece
   is read a megabyte at a time (a compressed file decompressed as it streams, a Parquet file
   opened once a piece) and its tokens held as uint16/uint32 arrays: a worker's memory is
   bounded by its piece (or its shard), never by a file. The manifest is written last.

Documents and tokens: a Parquet/JSONL row is a document; in text, a document begins at each
file (or piece of a big file) and at each WikiText article title (` = Title = `), and its lines
keep their newline. Each document's tokens are `[EOT] + encode_ordinary(document)`; documents
that are empty or whitespace only are skipped. Validation: the source's validation split when
it has one (its own shards), else the documents whose content hash falls in `val_percent`
(`is_held_out`), written beside each training shard as `val-<same index>.bin`.

Idempotent, resumable and self-repairing: a corpus whose manifest matches (same fingerprint,
tokenizer and settings) and whose shards are all whole is left as it is; otherwise the plan
continues: a shard whose files are whole (an llm.c header of the corpus's dtype, the size its
token count makes, the count the old manifest lists) is skipped, a missing, truncated or
overwritten one is made again, and the manifest is written anew (`force`: every shard is made
again). A corpus or plan made from something else under the same name is refused (CorpusError:
one line, exit 2). Only the corpus directory is written; nothing is deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np

from submitter.contract.errors import SubmitterError, UsageError
from training.data import shards as sh
from training.data.pipeline import (_COMPRESSED, DEFAULT_BPE_TOKENS_PER_BYTE, _filesystem,
                                    _guess_format, line_ranges, stdlib_files)
from training.data.tokens import BYTE_ENCODING_NAME, TokenizerSpec, get_encoding, is_title

PLAN = "plan.json"
#: Text bytes per input piece (one tokenizing task): enough to amortize a task, small enough
#: that every CPU gets work on a small corpus.
PIECE_BYTES = 16 * 2**20
#: Hub split names read as validation (`test` is never trained on, nor validated on).
VAL_SPLITS = ("validation", "valid", "val", "dev")
#: A card's `data_dir` names no split: each file's comes from its name (`split_of`).
ANY_SPLIT = "*"
PLAN_VERSION = 1
#: At most about this many tokens are held out for validation (llm.c's FineWeb: one shard of
#: 10^8): the hold-out is --val-percent of the documents or this, whichever is smaller.
HOLD_OUT_TOKENS = 100_000_000
#: The seed of the documents' order in the shards (recorded in the plan as `document_order`):
#: pieces dealt to shards in a seeded permutation, documents shuffled within each piece, so a
#: source listed by name (code after prose) is spread over every shard, not a run of them.
DOCUMENT_ORDER_SEED = 20261128


# --- the source -------------------------------------------------------------------------------

@dataclass(frozen=True)
class FileRef:
    path: str      # the path the filesystem reads
    rel: str       # its name inside the source (what the fingerprint names)
    size: int
    version: str   # a content version: LFS sha256 or blob id (the Hub), a content hash (files)
    split: str = sh.TRAIN
    legacy: str = ""  # the version corpora were prepared with before: mtime (files), or ""


@dataclass(frozen=True)
class Source:
    """What is read: its files, through which filesystem, in which format."""

    kind: str                   # hub | files | offline
    what: str                   # as the user named it
    fmt: str                    # text | jsonl | parquet
    text_column: str
    fs: Any                     # a pyarrow filesystem
    files: tuple[FileRef, ...]

    @property
    def has_val_split(self) -> bool:
        return any(f.split == sh.VAL for f in self.files)

    def fingerprint(self, legacy: bool = False) -> str:
        """The content's identity: format, column, and each file's name, size and content
        version (not where it is mounted, how the user spelled it, nor its mtime: a copy or a
        `touch` is the same corpus). `legacy`: as corpora prepared before were fingerprinted
        (files by mtime), so that they are still recognized."""
        doc = [self.kind, self.fmt, self.text_column,
               [[f.rel, f.size, (f.legacy or f.version) if legacy else f.version, f.split]
                for f in self.files]]
        return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:32]

    def identity(self, legacy: bool = False) -> dict[str, Any]:
        return {"kind": self.kind, "what": self.what, "format": self.fmt,
                "text_column": self.text_column, "files": len(self.files),
                "bytes": sum(f.size for f in self.files), "fingerprint": self.fingerprint(legacy)}


#: Files up to this size are hashed whole; bigger ones by their size and SAMPLES blocks.
HASH_WHOLE_BYTES = 8 * 2**20
SAMPLES, SAMPLE_BYTES = 16, 64 * 2**10


def content_version(fs: Any, path: str, size: int) -> str:
    """A file's content version from its bytes: sha256 of the whole file up to
    HASH_WHOLE_BYTES, else of its size and SAMPLES blocks spread evenly from its first byte to
    its last (1 MiB read: a copy, an rsync without -t or a `touch` keep it; an edit anywhere
    but between the samples changes the size or a sample)."""
    digest = hashlib.sha256(str(size).encode())
    with fs.open_input_file(path) as f:
        if size <= HASH_WHOLE_BYTES:
            digest.update(f.read())
        else:
            step = (size - SAMPLE_BYTES) / (SAMPLES - 1)
            for k in range(SAMPLES):
                f.seek(int(k * step))
                digest.update(f.read(SAMPLE_BYTES))
    return f"sha256:{digest.hexdigest()[:32]}"


def _version(info: Mapping[str, Any]) -> str:
    lfs = info.get("lfs") or {}
    return str(lfs.get("sha256") or lfs.get("oid") or info.get("blob_id")
               or info.get("mtime") or info.get("size"))


def split_of(path: str) -> Optional[str]:
    """A Hub file's split from its name, as the Hub's layouts spell it (`data/train-0000.parquet`,
    `validation/0000.parquet`); train when nothing says; None for test."""
    words = set(path.lower().replace("\\", "/").replace(".", "/").replace("-", "/")
                .replace("_", "/").split("/"))
    if "train" in words:
        return sh.TRAIN
    if words & set(VAL_SPLITS):
        return sh.VAL
    return None if "test" in words else sh.TRAIN


def card_configs(fs: Any, root: str) -> list[dict[str, Any]]:
    """The `configs:` block of a dataset card's YAML front matter ([] without one)."""
    import yaml

    try:
        text = fs.cat_file(f"{root}/README.md").decode("utf-8", errors="replace")
    except (FileNotFoundError, OSError):
        return []
    if not text.startswith("---"):
        return []
    end = text.find("\n---", 3)
    try:
        meta = yaml.safe_load(text[3:end if end > 0 else None]) or {}
    except yaml.YAMLError:
        return []
    configs = meta.get("configs") if isinstance(meta, dict) else None
    return [c for c in configs or [] if isinstance(c, dict)]


def config_patterns(configs: Sequence[Mapping[str, Any]], config: Optional[str],
                    dataset: str) -> Optional[dict[str, list[str]]]:
    """{split: [glob patterns]} of one config from the card (None: the card has no configs).
    `data_files` may be a pattern, a list of patterns, a list of {split, path} or a mapping."""
    if not configs:
        return None
    by_name = {str(c.get("config_name", "default")): c for c in configs}
    wanted = config or ("default" if "default" in by_name else
                        next(iter(by_name)) if len(by_name) == 1 else None)
    if wanted not in by_name:
        raise UsageError(f"--dataset {dataset}: no config {config!r} in its card; its configs: "
                         f"{', '.join(sorted(by_name))} (pass one with --dataset-config)")
    files = by_name[wanted].get("data_files")
    if files is None:  # `data_dir: DIR`: its Parquet files, each split told by its name
        data_dir = by_name[wanted].get("data_dir")
        return {ANY_SPLIT: [f"{str(data_dir).strip('/')}/**/*.parquet"]} if data_dir else None
    if isinstance(files, (str, list)) and not (isinstance(files, list) and files
                                                and isinstance(files[0], dict)):
        return {"train": [files] if isinstance(files, str) else [str(f) for f in files]}
    pairs = files.items() if isinstance(files, dict) else (
        (f.get("split", "train"), f.get("path")) for f in files)
    out: dict[str, list[str]] = {}
    for split, paths in pairs:
        out.setdefault(str(split), []).extend([paths] if isinstance(paths, str) else list(paths or ()))
    return out


def hub_files(fs: Any, root: str, config: Optional[str], dataset: str) -> list[FileRef]:
    """The Parquet files of a Hub dataset's config, train then validation, from its card's
    `configs:` when it has one, else the usual layouts (`<config>/...`, `data/...`, anywhere),
    else the Hub's Parquet conversion (`refs/convert/parquet`). `fs` is an fsspec filesystem
    (HfFileSystem on the Hub; any other in tests) and `root` the repository in it."""
    patterns = config_patterns(card_configs(fs, root), config, dataset)
    found: dict[str, dict[str, Any]] = {}
    if patterns is not None:
        for split, globs in patterns.items():
            side = sh.TRAIN if split == "train" else sh.VAL if split in VAL_SPLITS else None
            for pattern in globs if side or split == ANY_SPLIT else ():
                for path, info in fs.glob(f"{root}/{pattern.lstrip('/')}", detail=True).items():
                    found[path] = {**info, "split": side or split_of(path[len(root):])}
    else:
        base = f"{root}/{config}" if config and fs.isdir(f"{root}/{config}") else (
            f"{root}/data" if fs.isdir(f"{root}/data") else root)
        for path, info in fs.glob(f"{base}/**/*.parquet", detail=True).items():
            found[path] = {**info, "split": split_of(path[len(base):])}
    files = [FileRef(p, p[len(root):].lstrip("/"), int(i.get("size") or 0), _version(i), i["split"])
             for p, i in sorted(found.items())
             if i.get("type", "file") == "file" and p.endswith(".parquet") and i["split"]]
    if not files and root.startswith("datasets/") and "@refs" not in root:
        converted = f"{root.split('@')[0]}@refs%2Fconvert%2Fparquet"
        return hub_files(fs, converted, config or "default", dataset)
    if not any(f.split == sh.TRAIN for f in files):
        raise UsageError(f"--dataset {dataset}{' ' + config if config else ''}: no Parquet "
                         f"training files found (prepare reads a Hub dataset's Parquet files); "
                         f"check the name and --dataset-config")
    return sorted(files, key=lambda f: (f.split != sh.TRAIN, f.rel))


def hub_root(dataset: str, api: Any) -> str:
    """The dataset's repository at the commit its `main` is at now (`datasets/NAME@SHA`): every
    file is listed and read at that commit, so a push during a prepare (or between a prepare
    and its resume) cannot mix two versions. A name that names a revision is kept as given."""
    if "@" in dataset:
        return f"datasets/{dataset}"
    try:
        sha = api.dataset_info(dataset).sha
    except Exception as e:  # noqa: BLE001 - the Hub's errors are many; said in one line
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 403, 404) or type(e).__name__ in (
                "RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError"):
            raise UsageError(f"--dataset {dataset}: not on the Hugging Face Hub, or not readable "
                             f"with these credentials ({why}): check the name, and HF_TOKEN for "
                             "a private or gated dataset") from None
        # a network error or the Hub's own (5xx): not bad input; a retry may get through
        raise SubmitterError(f"--dataset {dataset}: the Hugging Face Hub did not answer ({why}): "
                             "prepare again later (a RayJob retry does)") from None
    return f"datasets/{dataset}@{sha}" if sha else f"datasets/{dataset}"


def hub_source(dataset: str, config: Optional[str], text_column: str, fs: Any = None,
               root: Optional[str] = None) -> Source:
    """A Hub dataset by name and config, read as Parquet through `fs` (default: HfFileSystem,
    which reads by HTTP ranges: no file is downloaded whole to one disk)."""
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    if fs is None:
        from huggingface_hub import HfApi, HfFileSystem

        fs = HfFileSystem()
        root = root if root is not None else hub_root(dataset, HfApi())
    root = root if root is not None else f"datasets/{dataset}"
    files = hub_files(fs, root.rstrip("/"), config, dataset)
    what = f"{dataset} {config}" if config else dataset
    return Source("hub", what, "parquet", text_column, PyFileSystem(FSSpecHandler(fs)),
                  tuple(files))


def files_source(data: str, data_format: str, text_column: str) -> Source:
    """`--data`: a file or a directory (local, on the volume, or a bucket URI) of text, Parquet
    or JSONL, as the on-the-fly path reads them (training.data.pipeline)."""
    import pyarrow.fs as pafs

    try:
        fs, path = _filesystem(data)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            infos = [i for i in fs.get_file_info(pafs.FileSelector(path, recursive=True))
                     if i.type == pafs.FileType.File
                     and not any(p.startswith((".", "_")) for p in i.path[len(path):].split("/"))]
            base = path.rstrip("/")
        elif info.type == pafs.FileType.File:
            infos, base = [info], os.path.dirname(path)
        else:
            raise UsageError(f"--data {data}: not found; give a file or directory of text, "
                             "Parquet or JSONL (a local path, a path on the volume, or a bucket URI)")
    except OSError as e:
        raise UsageError(f"--data {data}: cannot list it ({e})") from None
    fmt = data_format if data_format != "auto" else next(
        (g for g in (_guess_format(i.path) for i in sorted(infos, key=lambda i: i.path)) if g != "text"),
        "text")
    wanted = {"parquet": (".parquet",), "jsonl": (".jsonl", ".json", ".jsonl.gz", ".json.gz")}.get(fmt)
    infos = sorted((i for i in infos if wanted is None or i.path.lower().endswith(wanted)),
                   key=lambda i: i.path)
    if not infos:
        raise UsageError(f"--data {data}: no {fmt} files in it (--data-format {data_format})")
    try:
        files = tuple(FileRef(i.path, i.path[len(base):].lstrip("/") or os.path.basename(i.path),
                              int(i.size or 0), content_version(fs, i.path, int(i.size or 0)),
                              legacy=str(i.mtime_ns or i.size)) for i in infos)
    except OSError as e:
        raise UsageError(f"--data {data}: cannot read it ({e})") from None
    return Source("files", data, fmt, text_column, fs, files)


def offline_source() -> Source:
    """The offline corpus: this Python's standard library (`pipeline.stdlib_files`)."""
    import sysconfig

    import pyarrow.fs as pafs

    from submitter.contract.naming import OFFLINE_DATASET

    base = sysconfig.get_paths()["stdlib"]
    fs = pafs.LocalFileSystem()
    files = tuple(FileRef(str(p), os.path.relpath(p, base), p.stat().st_size,
                          content_version(fs, str(p), p.stat().st_size),
                          legacy=str(p.stat().st_mtime_ns)) for p in stdlib_files(base))
    return Source("offline", OFFLINE_DATASET, "text", "text", fs, files)


def resolve_source(dataset: str, dataset_config: Optional[str], data: Optional[str],
                   data_format: str, text_column: str) -> Source:
    """The job's data settings as a Source: --data, else the offline corpus, else the Hub."""
    from submitter.contract.naming import OFFLINE_DATASET

    if data:
        return files_source(data, data_format, text_column)
    if dataset == OFFLINE_DATASET:
        return offline_source()
    return hub_source(dataset, dataset_config, text_column)


# --- pieces and the plan ----------------------------------------------------------------------

def file_ranges(source: Source, ref: FileRef, piece_bytes: int) -> list[tuple[list[Any], int]]:
    """([path, start, end], text bytes) of one file: Parquet row groups [start, end), line-aligned
    byte ranges of an uncompressed text/JSONL file, else the whole file (end -1: a stream)."""
    if source.fmt == "parquet":
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(ref.path, filesystem=source.fs).metadata
        names = [meta.schema.column(j).path for j in range(meta.num_columns)]
        if source.text_column not in names:
            raise UsageError(f"{ref.rel}: no column {source.text_column!r} (it has "
                             f"{', '.join(names[:8])}); pass --text-column")
        j = names.index(source.text_column)
        return [([ref.path, g, g + 1], meta.row_group(g).column(j).total_uncompressed_size)
                for g in range(meta.num_row_groups)]
    if is_compressed(ref.path):
        return compressed_ranges(ref.path, text_size_estimate(source.fs, ref), piece_bytes)
    if ref.size <= piece_bytes:
        return [([ref.path, 0, ref.size], ref.size)]
    with source.fs.open_input_file(ref.path) as f:
        return [([ref.path, s, e], e - s) for s, e in line_ranges(f, ref.size, piece_bytes)]


#: Text bytes per compressed byte when the file says nothing (gzip's trailer does).
COMPRESSION_RATIO = 4


def text_size_estimate(fs: Any, ref: FileRef) -> int:
    """A compressed file's text size, to cut it into pieces (an estimate: the last piece
    reads to the end whatever it is). A gzip file's trailer holds it modulo 2^32 (one 4-byte
    ranged read): the smallest such size not below the compressed one; else COMPRESSION_RATIO."""
    if ref.path.lower().endswith(".gz") and ref.size >= 18:
        try:
            with fs.open_input_file(ref.path) as f:
                f.seek(ref.size - 4)
                isize = int.from_bytes(f.read(4), "little")
        except OSError:
            return ref.size * COMPRESSION_RATIO
        wraps = max(0, -(-(ref.size - isize) // 2**32))
        return isize + wraps * 2**32
    return ref.size * COMPRESSION_RATIO


def compressed_ranges(path: str, text_bytes: int, piece_bytes: int) -> list[tuple[list[Any], int]]:
    """([path, start, end], text bytes) of a compressed file: ranges of ~piece_bytes of its
    decompressed text, the last one open (end -1: to the end of the stream). A range holds the
    lines that begin in it (`stream_lines`), so the ranges cover every line once whatever the
    estimate was. On Ray one task decompresses the file once for all of them (`feed_ranges`)."""
    count = max(1, -(-text_bytes // piece_bytes))
    return [([path, k * piece_bytes, (k + 1) * piece_bytes if k < count - 1 else -1],
             piece_bytes if k < count - 1 else max(text_bytes - k * piece_bytes, 0))
            for k in range(count)]


def check_source(source: Source) -> None:
    """Refuse, before any work, a source that cannot be prepared (UsageError: one line naming
    the file, and the line): no bytes at all; a `.parquet` that is not Parquet or lacks the text
    column (its footer: one ranged read); a JSONL whose first record is not a JSON object with
    the text key. A bad line further in is found while tokenizing (`range_documents`)."""
    if not any(f.size for f in source.files):
        raise UsageError(f"{source.what}: its {len(source.files)} file(s) are empty: no text to "
                         "prepare")
    for ref in source.files:
        if source.fmt == "parquet":
            _check_parquet(source, ref)
        elif source.fmt == "jsonl" and ref.size:
            _check_jsonl(source, ref)


def _check_parquet(source: Source, ref: FileRef) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.ParquetFile(ref.path, filesystem=source.fs).schema_arrow.names
    except (pa.ArrowInvalid, OSError) as e:
        raise UsageError(f"{ref.path}: not a Parquet file ({str(e).splitlines()[0]}): give Parquet "
                         "files, or --data-format text|jsonl for what it is") from None
    if source.text_column not in names:
        raise UsageError(f"{ref.path}: no column {source.text_column!r} (it has "
                         f"{', '.join(names[:8])}): pass --text-column")


def _check_jsonl(source: Source, ref: FileRef) -> None:
    try:
        with source.fs.open_input_stream(ref.path, compression="detect") as f:
            head = f.read(1 << 20)
    except OSError as e:
        raise UsageError(f"{ref.path}: cannot read it ({e})") from None
    lines = head.split(b"\n")
    whole = lines[:-1] if len(head) == 1 << 20 else lines  # the last may be cut short
    for number, line in enumerate(whole, 1):
        if line.strip():
            record = json_record(line, ref.path, number)
            if source.text_column not in record:
                raise UsageError(f"{ref.path} line {number}: no key {source.text_column!r} (it has "
                                 f"{', '.join(list(record)[:8])}): pass --text-column")
            return


def json_record(line: bytes, path: str, where: Any) -> dict[str, Any]:
    """One JSONL line as an object; UsageError naming the file and `where` (a line number, or
    a phrase) when it is not one."""
    at = f"line {where}" if isinstance(where, int) else str(where)
    try:
        record = json.loads(line.decode("utf-8", errors="replace"))
    except ValueError as e:
        raise UsageError(f"{path} {at}: not JSON ({e}): each line of a JSONL file is one JSON "
                         "object") from None
    if not isinstance(record, dict):
        raise UsageError(f"{path} {at}: a JSON {type(record).__name__}, not an object: each line "
                         "of a JSONL file is one JSON object")
    return record


def make_pieces(source: Source, piece_bytes: int) -> list[dict[str, Any]]:
    """The source as pieces of ~piece_bytes of text: consecutive ranges of one split."""
    pieces: list[dict[str, Any]] = []
    for ref in source.files:
        for rng, nbytes in file_ranges(source, ref, piece_bytes):
            last = pieces[-1] if pieces else None
            if last is None or last["split"] != ref.split or last["bytes"] >= piece_bytes:
                last = {"split": ref.split, "bytes": 0, "ranges": []}
                pieces.append(last)
            last["ranges"].append(rng)
            last["bytes"] += int(nbytes)
    return pieces


def piece_order(count: int, seed: Optional[int]) -> list[int]:
    """The order pieces are dealt to shards in: a permutation from `seed` (None: as listed)."""
    if seed is None:
        return list(range(count))
    return [int(i) for i in np.random.default_rng([seed, count]).permutation(count)]


def document_order(piece: Mapping[str, Any], count: int, seed: Optional[int]) -> list[int]:
    """The order of a piece's `count` documents: a permutation from `seed` and the piece's
    ranges (the same on any machine, any run; None: as read)."""
    if seed is None:
        return list(range(count))
    key = zlib.crc32(json.dumps(piece["ranges"], sort_keys=True).encode("utf-8"))
    return [int(i) for i in np.random.default_rng([seed, key]).permutation(count)]


def plan_shards(pieces: Sequence[Mapping[str, Any]], tokens_per_byte: float, shard_tokens: int,
                hold_out: bool, order: Optional[Sequence[int]] = None) -> list[dict[str, Any]]:
    """Pieces into shards of ~shard_tokens (estimated), taken in `order` (default: as
    listed): training shards (each with its held-out validation shard when `hold_out`), then
    the validation split's own shards."""
    def groups(split: str) -> Iterator[list[int]]:
        current: list[int] = []
        estimate = 0.0
        for i in (order if order is not None else range(len(pieces))):
            piece = pieces[i]
            if piece["split"] != split:
                continue
            current.append(i)
            estimate += piece["bytes"] * tokens_per_byte
            if estimate >= shard_tokens:
                yield current
                current, estimate = [], 0.0
        if current:
            yield current

    out = [{"train": sh.shard_name(sh.TRAIN, k), "val": sh.shard_name(sh.VAL, k) if hold_out else None,
            "pieces": g} for k, g in enumerate(groups(sh.TRAIN))]
    return out + [{"train": None, "val": sh.shard_name(sh.VAL, k), "pieces": g}
                  for k, g in enumerate(groups(sh.VAL))]


def done_file(shard: Mapping[str, Any]) -> str:
    """The file a shard writes last: its presence means the shard is done."""
    return shard["train"] or shard["val"]


# --- documents and tokens ---------------------------------------------------------------------

def text_documents(lines: Iterable[str]) -> Iterator[str]:
    """Text lines as documents: one begins with the first line and at each WikiText title."""
    doc: list[str] = []
    for line in lines:
        if doc and is_title(line):
            yield "".join(doc)
            doc = []
        doc.append(line + "\n")
    if doc:
        yield "".join(doc)


#: Bytes read from a file or a decompressing stream at a time: a piece is never read whole.
READ_BYTES = 1 << 20


def stream_lines(f: Any, start: int, end: int, skip: bool,
                 chunk: int = READ_BYTES) -> Iterator[tuple[int, bytes]]:
    """(offset, line without its newline) of the lines of stream `f` that begin in [start,
    end) (end < 0: to the end), read `chunk` bytes at a time. A line begins at 0 or right
    after a newline. `skip`: the stream cannot seek (a decompressing one): the bytes before
    `start` are read and dropped; else `f` seeks."""
    pos = max(start - 1, 0)  # from the byte before start: a newline there begins a line at start
    if pos and skip:
        left = pos
        while left:
            got = len(f.read(min(chunk, left)))
            if not got:
                return
            left -= got
    elif pos:
        f.seek(pos)
    buffer = data = b""
    if start > 0:  # drop the rest of the line that began before start
        while True:
            data = f.read(chunk)
            if not data:
                return
            cut = data.find(b"\n")
            if cut >= 0:
                pos += cut + 1
                data = data[cut + 1:]
                break
            pos += len(data)
    while True:
        if not data:
            data = f.read(chunk)
            if not data:
                if buffer and not 0 <= end <= pos:
                    yield pos, buffer
                return
        lines = data.split(b"\n")
        data = b""
        if len(lines) == 1:  # a line longer than a chunk
            buffer += lines[0]
            continue
        lines[0] = buffer + lines[0]
        for line in lines[:-1]:
            if 0 <= end <= pos:
                return
            yield pos, line
            pos += len(line) + 1
        buffer = lines[-1]
        if 0 <= end <= pos:
            return


def _lines_of(fs: Any, path: str, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """A range's lines, the file opened once and read READ_BYTES at a time (a compressed file
    decompressed as it streams, never whole)."""
    if is_compressed(path):
        with fs.open_input_stream(path, compression="detect") as f:
            yield from stream_lines(f, start, end, skip=True)
    else:
        with fs.open_input_file(path) as f:
            yield from stream_lines(f, start, end, skip=False)


#: Rows of a Parquet row group read at a time.
PARQUET_BATCH_ROWS = 1024


def is_compressed(path: str) -> bool:
    return path.lower().endswith(_COMPRESSED)


def feed_ranges(fs: Any, path: str, ranges: Sequence[Sequence[int]]) -> Iterator[tuple[int, bytes]]:
    """One pass over a compressed file for the ranges of its text that pieces need: for each
    [start, end) of `ranges` (sorted, not overlapping), (the offset of its first line, its
    lines' bytes), as `stream_lines` would read it alone. A piece of a big `.jsonl.gz` is then
    not read by decompressing all the text before it (N pieces: N/2 passes)."""
    wanted = [(int(a), int(b)) for a, b in ranges]
    k, first, text = 0, -1, bytearray()

    def whole() -> tuple[int, bytes]:
        return (first if first >= 0 else wanted[k][0]), bytes(text)

    with fs.open_input_stream(path, compression="detect") as f:
        for offset, line in stream_lines(f, 0, -1, skip=True):
            while k < len(wanted) and 0 <= wanted[k][1] <= offset:
                yield whole()
                k, first, text = k + 1, -1, bytearray()
            if k == len(wanted):
                return
            if offset >= wanted[k][0]:
                first = offset if first < 0 else first
                text += line
                text += b"\n"
    while k < len(wanted):
        yield whole()
        k, first, text = k + 1, -1, bytearray()


def range_documents(fs: Any, fmt: str, text_column: str, rng: Sequence[Any],
                    opened: Optional[dict[str, Any]] = None,
                    fed: Optional[tuple[int, bytes]] = None) -> Iterator[str]:
    """The documents of one range, in order, streamed. `opened`: Parquet files already open
    (path -> ParquetFile), kept across the ranges of a piece: a file is opened once a piece,
    not once a row group. `fed`: the range's lines already read (`feed_ranges`)."""
    import io

    path, start, end = str(rng[0]), int(rng[1]), int(rng[2])
    if fmt == "parquet":
        import pyarrow.parquet as pq

        opened = {} if opened is None else opened
        if path not in opened:
            opened[path] = pq.ParquetFile(path, filesystem=fs)
        for batch in opened[path].iter_batches(batch_size=PARQUET_BATCH_ROWS,
                                               row_groups=list(range(start, end)),
                                               columns=[text_column]):
            yield from (t if isinstance(t, str) else "" for t in batch.column(0).to_pylist())
        return
    lines = (_lines_of(fs, path, start, end) if fed is None else
             ((fed[0] + at, line) for at, line in stream_lines(io.BytesIO(fed[1]), 0, -1, False)))
    if fmt == "jsonl":  # split on \n only: a JSON string may hold U+2028, which splitlines cuts
        for number, (offset, line) in enumerate(lines, 1):
            if line.strip():  # the line number is the file's when the range begins it
                where = number if start <= 0 else f"(the line at byte {offset})"
                value = json_record(line, path, where).get(text_column)
                yield value if isinstance(value, str) else ""
        return
    # as str.splitlines() of the whole range: a \n-line may hold other line breaks (\r...)
    yield from text_documents(part for _, line in lines
                              for part in (line.decode("utf-8", errors="replace").splitlines()
                                           or [""]))


def is_held_out(document: str, val_percent: float) -> bool:
    """The hash hold-out: the same document lands on the same side on any machine, any run.
    Resolution 10^-6 %; for a percent in whole hundredths the same documents as `crc % 10^4 <
    percent * 100` (the rule corpora were prepared with before), since the finer part adds
    less than one to an integer compared with an integer."""
    h = zlib.crc32(document.encode("utf-8"))
    return (h % 10_000) + (h // 10_000 % 10_000) / 10_000 < val_percent * 100


def hold_out_percent(val_percent: float, estimated_tokens: float,
                     cap_tokens: int = HOLD_OUT_TOKENS) -> float:
    """The share of documents held out: `val_percent`, or about `cap_tokens` tokens of the
    corpus's estimate, whichever is smaller (FineWeb-Edu 10B at 5% would withhold ~500 M tokens
    where evaluation reads a few million)."""
    if val_percent <= 0 or estimated_tokens <= 0:
        return val_percent
    return min(val_percent, 100.0 * cap_tokens / estimated_tokens)


def tokenize_piece(piece: Mapping[str, Any], *, fs: Any, fmt: str, text_column: str,
                   tokenizer: TokenizerSpec, dtype: str, val_percent: float,
                   hold_out: bool, shuffle_seed: Optional[int] = None,
                   fed: Optional[Mapping[tuple[str, int, int], tuple[int, bytes]]] = None
                   ) -> dict[str, Any]:
    """One piece -> {"train": ids, "val": ids, "documents": n}: `[EOT] + tokens` per
    document, each on its side (the piece's split, or the hash hold-out), the documents in
    the piece's seeded order (`document_order`; `shuffle_seed` None: as read). `fed`: the
    text of some of its ranges, already read (`feed_ranges`), by (path, start, end)."""
    encoding = get_encoding(tokenizer)
    np_dtype = f"<u{sh.itemsize(dtype)}"
    if encoding.name == BYTE_ENCODING_NAME:
        def encode(text: str) -> np.ndarray:
            return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np_dtype)
    else:
        def encode(text: str) -> np.ndarray:
            return np.asarray(encoding.encode_ordinary(text), dtype=np_dtype)
    eot = np.asarray([encoding.eot_token], dtype=np_dtype)
    # each document's tokens as it is read ([EOT] + ids, 2 or 4 bytes a token, not Python
    # ints): the piece's text is never held, only its tokens; then dealt in the seeded order
    docs: list[tuple[bool, np.ndarray]] = []
    opened: dict[str, Any] = {}
    for rng in piece["ranges"]:
        key = (str(rng[0]), int(rng[1]), int(rng[2]))
        for doc in range_documents(fs, fmt, text_column, rng, opened, (fed or {}).get(key)):
            if doc.strip():
                held = piece["split"] == sh.VAL or (hold_out and is_held_out(doc, val_percent))
                docs.append((held, np.concatenate([eot, encode(doc)])))
    order = document_order(piece, len(docs), shuffle_seed)
    sides = {side: [docs[i][1] for i in order if docs[i][0] == (side == "val")]
             for side in ("train", "val")}
    out: dict[str, Any] = {side: np.concatenate(arrays) if arrays else np.zeros(0, np_dtype)
                           for side, arrays in sides.items()}
    return {**out, "documents": len(docs)}


def tokenized(pieces: Sequence[tuple[int, Mapping[str, Any]]],
              work: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Each piece's tokens, in the pieces' order, in this process (tests, tiny corpora)."""
    for index, piece in pieces:
        yield {"piece": index, **tokenize_piece(piece, **work)}


def _on_ray(items: list[dict[str, Any]], fn: Callable[..., Any], work: Mapping[str, Any]) -> Iterator[Any]:
    """`fn` over `items` on Ray Data, one task an item, results in the items' order."""
    if not items:
        return
    import ray.data

    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False
    ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        fn, batch_size=1, batch_format="numpy", fn_kwargs=dict(work))
    try:
        yield from ds.iter_rows()
    except Exception as e:  # noqa: BLE001 - only bad input is translated
        bad = task_bad_input(e)
        if bad is None:
            raise
        raise bad from None


#: The last line of a task's traceback when it raised the project's bad-input error.
_BAD_INPUT_LINE = re.compile(r"(?m)^(?:[\w.]+\.)?(UsageError|CorpusError): (.+)$")


def task_bad_input(error: BaseException) -> Optional[UsageError]:
    """Bad input a Ray task found (a JSONL line that is not JSON...) as the one-line error it
    raised: Ray hands the driver only its traceback's text (the exception itself is not kept)."""
    found = _BAD_INPUT_LINE.findall(str(error))
    if not found:
        return None
    kind, message = found[-1]
    return (sh.CorpusError if kind == "CorpusError" else UsageError)(message.strip())


def write_shard_files(out_fs: Any, root: str, shard: Mapping[str, Any],
                      parts: Mapping[str, Sequence[np.ndarray]], dtype: str) -> tuple[list[str], int]:
    """One shard's files from its pieces' tokens, in order: the held-out validation part first
    (none when empty), the done file last. Returns (files written, tokens)."""
    written, tokens = [], 0
    for side in ("val", "train"):
        target = shard[side]
        ids = np.concatenate(parts[side]) if parts[side] else np.zeros(0, dtype=np.uint16)
        if target and (len(ids) or target == done_file(shard)):
            sh.write_shard(out_fs, f"{root}/{target}", ids, dtype)
            written.append(target)
            tokens += len(ids)
    return written, tokens


def make_shard(shard: Mapping[str, Any], pieces: Sequence[Mapping[str, Any]], *, out_fs: Any,
               root: str, **work: Any) -> dict[str, Any]:
    """One shard tokenized and written by one task (where it runs: a worker writes to the
    volume or the bucket itself, the driver sees counts only)."""
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    documents = 0
    for piece in pieces:
        result = tokenize_piece(piece, **work)
        parts["train"].append(result["train"])
        parts["val"].append(result["val"])
        documents += result["documents"]
    written, tokens = write_shard_files(out_fs, root, shard, parts, work["dtype"])
    return {"shard": done_file(shard), "written": written, "tokens": tokens, "documents": documents}


def _make_shard_batch(batch: dict[str, np.ndarray], **work: Any) -> dict[str, np.ndarray]:
    """Ray Data's map_batches function: {"spec"} -> what make_shard wrote."""
    done = [make_shard(**{**json.loads(str(spec)), **work}) for spec in batch["spec"]]
    return {"shard": np.array([d["shard"] for d in done], dtype=object),
            "written": np.array([json.dumps(d["written"]) for d in done], dtype=object),
            "tokens": np.array([d["tokens"] for d in done], dtype=np.int64),
            "documents": np.array([d["documents"] for d in done], dtype=np.int64)}


def shards_by_task(pending: Sequence[Mapping[str, Any]], pieces: Sequence[Mapping[str, Any]],
                   work: Mapping[str, Any], out_fs: Any, root: str,
                   use_ray: bool) -> Iterator[dict[str, Any]]:
    """Each pending shard made by a task of its own (make_shard), in the shards' order."""
    jobs = [{"shard": s, "pieces": [pieces[i] for i in s["pieces"]]} for s in pending]
    if not use_ray:
        for job in jobs:
            yield make_shard(**job, out_fs=out_fs, root=root, **work)
        return
    items = [{"spec": json.dumps(job)} for job in jobs]
    for row in _on_ray(items, _make_shard_batch, {**work, "out_fs": out_fs, "root": root}):
        yield {"shard": str(row["shard"]), "written": json.loads(row["written"]),
               "tokens": int(row["tokens"]), "documents": int(row["documents"])}


def shards_streamed(pending: Sequence[Mapping[str, Any]], pieces: Sequence[Mapping[str, Any]],
                    work: Mapping[str, Any], out_fs: Any, root: str,
                    use_ray: bool) -> Iterator[dict[str, Any]]:
    """Each pending shard from tasks of one piece each (every CPU busy even for one shard):
    on Ray, a writer task per shard gathers its pieces' tokens and writes it where it runs
    (`shards_fanned_out`: the tokens never pass through this process); in this process, the
    shards are written as their pieces come in."""
    if use_ray:
        yield from shards_fanned_out(pending, pieces, work, out_fs, root)
        return
    owner = {i: s for s in pending for i in s["pieces"]}
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    documents = 0
    for result in tokenized([(i, pieces[i]) for s in pending for i in s["pieces"]], work):
        shard = owner[result["piece"]]
        parts["train"].append(result["train"])
        parts["val"].append(result["val"])
        documents += result["documents"]
        if result["piece"] == shard["pieces"][-1]:
            written, tokens = write_shard_files(out_fs, root, shard, parts, work["dtype"])
            yield {"shard": done_file(shard), "written": written, "tokens": tokens,
                   "documents": documents}
            parts, documents = {"train": [], "val": []}, 0


def _tokenize_task(piece: Mapping[str, Any], work: Mapping[str, Any], keys: Sequence[Any],
                   *fed: tuple[int, bytes]) -> dict[str, Any]:
    """A Ray task: one piece's tokens (numpy arrays: handed through the object store); `fed`:
    the text of its compressed ranges `keys`, from `_feed_task`."""
    return tokenize_piece(piece, **work, fed={tuple(k): f for k, f in zip(keys, fed)})


def _feed_task(fs: Any, path: str, ranges: Sequence[Sequence[int]]) -> Iterator[tuple[int, bytes]]:
    """A Ray task (a generator: each range stored as it is read, never the file): one
    compressed file decompressed once for the pieces' tokenizing tasks."""
    yield from feed_ranges(fs, path, ranges)


def _write_task(shard: Mapping[str, Any], refs: Sequence[Any], out_fs: Any, root: str,
                dtype: str) -> dict[str, Any]:
    """A Ray task (no CPU of its own: it waits on its pieces): one shard from its pieces'
    tokens, fetched one piece at a time in order, written where it runs."""
    import ray

    parts: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    documents = 0
    for ref in refs:
        result = ray.get(ref)
        parts["train"].append(result["train"])
        parts["val"].append(result["val"])
        documents += result["documents"]
    written, tokens = write_shard_files(out_fs, root, shard, parts, dtype)
    return {"shard": done_file(shard), "written": written, "tokens": tokens, "documents": documents}


def shards_fanned_out(pending: Sequence[Mapping[str, Any]], pieces: Sequence[Mapping[str, Any]],
                      work: Mapping[str, Any], out_fs: Any, root: str) -> Iterator[dict[str, Any]]:
    """Fewer shards than CPUs (100 FineWeb files on 128 CPUs, one big file): a Ray task per
    piece (every CPU works) and a writer task per shard; this process sees counts only, in
    the shards' order."""
    import ray

    tokenize = ray.remote(num_cpus=1)(_tokenize_task)
    write = ray.remote(num_cpus=0)(_write_task)
    feed = ray.remote(num_cpus=1)(_feed_task)
    shared = ray.put(dict(work))
    needed = [i for s in pending for i in s["pieces"]]
    compressed = sorted({(str(r[0]), int(r[1]), int(r[2])) for i in needed
                         for r in pieces[i]["ranges"]
                         if work["fmt"] != "parquet" and is_compressed(str(r[0]))},
                        key=lambda k: (k[0], k[1]))
    fed: dict[tuple[str, int, int], Any] = {}
    for path in sorted({k[0] for k in compressed}):
        keys = [k for k in compressed if k[0] == path]
        refs = feed.options(num_returns=len(keys)).remote(work["fs"], path,
                                                          [k[1:] for k in keys])
        fed.update(zip(keys, refs if len(keys) > 1 else [refs]))

    def task(i: int) -> Any:
        keys = [k for k in ((str(r[0]), int(r[1]), int(r[2])) for r in pieces[i]["ranges"])
                if k in fed]
        return tokenize.remote(pieces[i], shared, keys, *[fed[k] for k in keys])

    jobs = [write.remote(s, [task(i) for i in s["pieces"]], out_fs, root, work["dtype"])
            for s in pending]
    try:
        for job in jobs:
            yield ray.get(job)
    except Exception as e:  # noqa: BLE001 - only bad input is translated
        for job in jobs:
            ray.cancel(job)
        bad = task_bad_input(e)
        if bad is None:
            raise
        raise bad from None


# --- prepare ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Progress:
    shards_done: int        # all of the corpus's shards written, skipped ones included
    shards: int
    tokens: int             # tokens written by this run
    documents: int          # documents tokenized by this run
    seconds: float          # since this run's tokenizing began
    last: str = ""          # the shard just written

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Outcome:
    root: str
    manifest: sh.Manifest
    already: bool                      # prepared before: nothing was written
    written: tuple[str, ...] = ()      # shard files this run wrote
    skipped: int = 0                   # shards a previous run had written
    facts: dict[str, Any] = field(default_factory=dict)


def tokens_per_byte(tokenizer: TokenizerSpec) -> float:
    """For the plan's shard sizes only (shards are ~shard_tokens): 1 for bytes, ~1/4 for BPE."""
    return 1.0 if tokenizer.kind == "byte" else DEFAULT_BPE_TOKENS_PER_BYTE


def plan_key(source: Source, identity: Mapping[str, Any], val_percent: float,
             shard_tokens: int = sh.SHARD_TOKENS, piece_bytes: int = PIECE_BYTES,
             legacy: bool = False) -> dict[str, Any]:
    """What a corpus under a name is made of: prepared again with the same key, it is the same
    bytes; with another, it is another corpus."""
    return {"source": source.identity(legacy), "tokenizer": dict(identity), "eot": sh.EOT_POLICY,
            "validation": "split" if source.has_val_split else f"hold-out {val_percent:g}%",
            "shard_tokens": shard_tokens, "piece_bytes": piece_bytes, "plan": PLAN_VERSION}


def _differs(name: str, where: str, mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> sh.CorpusError:
    part = next((k for k in ("source", "tokenizer", "validation", "shard_tokens", "piece_bytes")
                 if mine.get(k) != theirs.get(k)), "plan")
    what = {"source": f"another source ({theirs.get('source', {}).get('what')}, fingerprint "
                      f"{theirs.get('source', {}).get('fingerprint')})",
            "tokenizer": f"another tokenizer ({theirs.get('tokenizer')})"}.get(
        part, f"other settings ({part}: {theirs.get(part)})")
    return sh.CorpusError(f"corpus {name} at {where} was prepared from {what}; this prepare reads "
                          f"{mine['source']['what']}: give it another --name (nothing was "
                          "changed)")


def _read_json(fs: Any, path: str) -> Optional[dict[str, Any]]:
    import pyarrow.fs as pafs

    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        try:
            return json.loads(f.read().decode("utf-8"))
        except ValueError:
            raise sh.CorpusError(f"{path}: unreadable plan: give the corpus another --name") from None


def recorded_key(fs: Any, root: str, source: Source, identity: Mapping[str, Any],
                 val_percent: float, shard_tokens: int = sh.SHARD_TOKENS,
                 piece_bytes: int = PIECE_BYTES) -> dict[str, Any]:
    """This prepare's key; for a corpus (or plan) recorded with the key its source had before
    fingerprints were by content (mtimes) and whose files have not changed since, that key,
    kept as it was (a run's checkpoint pins the corpus's fingerprint)."""
    key = plan_key(source, identity, val_percent, shard_tokens, piece_bytes)
    manifest = sh.read_manifest(fs, root)
    theirs = (manifest.extra.get("key") if manifest is not None
              else (_read_json(fs, f"{root}/{PLAN}") or {}).get("key"))
    if theirs and theirs != key and any(f.legacy for f in source.files):
        old = plan_key(source, identity, val_percent, shard_tokens, piece_bytes, legacy=True)
        if theirs == old:
            return old
    return key


def existing(fs: Any, root: str, name: str, key: Mapping[str, Any]) -> Optional[sh.Manifest]:
    """The corpus's manifest when it is already prepared with `key` (None: not prepared, or
    begun with the same key); CorpusError when the name holds another corpus, finished or not."""
    manifest = sh.read_manifest(fs, root)
    theirs = (manifest.extra.get("key", {}) if manifest is not None
              else (_read_json(fs, f"{root}/{PLAN}") or {"key": key}).get("key") or {})
    if theirs != dict(key):
        raise _differs(name, root, key, theirs)
    return manifest


def prepare(source: Source, out_fs: Any, root: str, tokenizer: TokenizerSpec, *, name: str,
            val_percent: float, shard_tokens: int = sh.SHARD_TOKENS,
            piece_bytes: int = PIECE_BYTES, use_ray: bool = True,
            by_shard: Optional[bool] = None, force: bool = False,
            hold_out_tokens: int = HOLD_OUT_TOKENS,
            on_progress: Callable[[Progress], None] = lambda p: None,
            clock: Callable[[], float] = time.monotonic) -> Outcome:
    """Prepare `source` into the corpus directory `root` of `out_fs` (a pyarrow filesystem).

    `by_shard`: a task per shard that writes it where it runs (the default when there are at
    least as many shards to write as the cluster has CPUs), else a task per piece and a writer
    task per shard (every CPU busy with few shards). Either writes the same bytes, and the
    tokens never pass through this process. `force`: every shard made again, whole or not."""
    start = clock()
    root = root.rstrip("/")
    identity = sh.tokenizer_identity(get_encoding(tokenizer))
    dtype = sh.dtype_for(identity["vocab_size"])
    key = recorded_key(out_fs, root, source, identity, val_percent, shard_tokens, piece_bytes)
    done = existing(out_fs, root, name, key)
    if done is not None and not force and damage(out_fs, root, done) is None:
        return Outcome(root, done, already=True)
    hold_out = not source.has_val_split and val_percent > 0
    # its key is the same: existing() said so
    plan = None if force else _read_json(out_fs, f"{root}/{PLAN}")
    if plan is None:
        check_source(source)
        pieces = make_pieces(source, piece_bytes)
        if not pieces:
            raise UsageError(f"{source.what}: no text to prepare")
        estimate = sum(p["bytes"] for p in pieces if p["split"] == sh.TRAIN) * tokens_per_byte(tokenizer)
        plan = {"name": name, "key": key, "pieces": pieces,
                "shards": plan_shards(pieces, tokens_per_byte(tokenizer), shard_tokens, hold_out,
                                      piece_order(len(pieces), DOCUMENT_ORDER_SEED)),
                # how the documents were ordered (a plan from before has none: as listed)
                "document_order": {"seed": DOCUMENT_ORDER_SEED,
                                   "pieces": "dealt to shards in a seeded permutation",
                                   "documents": "shuffled within each piece"},
                "hold_out_percent": hold_out_percent(val_percent, estimate, hold_out_tokens)}
        out_fs.create_dir(root, recursive=True)
        sh.write_whole(out_fs, f"{root}/{PLAN}", json.dumps(plan, indent=1).encode("utf-8"))
    shards, pieces = plan["shards"], plan["pieces"]
    listed = {s.file: s.tokens for s in done.shards} if done is not None else {}
    pending = shards if force else unfinished(out_fs, root, shards, dtype, listed)
    # a plan begun before the cap held out val_percent: it goes on so
    held = float(plan.get("hold_out_percent", val_percent))
    work = {"fs": source.fs, "fmt": source.fmt, "text_column": source.text_column,
            "tokenizer": tokenizer, "dtype": dtype, "val_percent": held,
            "hold_out": hold_out,
            "shuffle_seed": (plan.get("document_order") or {}).get("seed")}
    if by_shard is None:  # a compressed file's pieces are read in one pass: a task per piece
        by_shard = (use_ray and len(pending) >= _cpus(use_ray)
                    and not (source.fmt != "parquet" and any(is_compressed(f.path)
                                                             for f in source.files)))
    make = shards_by_task if by_shard else shards_streamed
    written: list[str] = []
    tokens = documents = 0
    shards_done = len(shards) - len(pending)
    began = clock()
    for made in make(pending, pieces, work, out_fs, root, use_ray):
        written += made["written"]
        tokens += made["tokens"]
        documents += made["documents"]
        shards_done += 1
        on_progress(Progress(shards_done, len(shards), tokens, documents, clock() - began,
                             made["shard"]))
    seconds = clock() - start
    facts = {"seconds": round(seconds, 3), "documents": documents, "tokens": tokens,
             "tokens_per_sec": round(tokens / max(clock() - began, 1e-9), 1),
             "shards_written": len(pending), "shards_skipped": len(shards) - len(pending),
             "repaired": done is not None and not force, "forced": force,
             "cpus": _cpus(use_ray), "task_per": "shard" if by_shard else "piece"}
    manifest = sh.Manifest(name=name, source=dict(key["source"]), tokenizer=identity,
                           dtype=dtype, shards=_listed(out_fs, root, shards),
                           shard_tokens=shard_tokens,
                           extra={"key": key, "prepare": facts,
                                  "validation": validation_facts(source.has_val_split, hold_out,
                                                                 val_percent, held, hold_out_tokens)})
    if not manifest.tokens(sh.TRAIN):  # never a manifest that says "complete" for nothing
        raise UsageError(f"{source.what}: no training text in it ({documents} document(s) with "
                         f"text{'' if source.fmt == 'text' else f' in column {source.text_column!r}'}"
                         f"): nothing to train on; check --data and --text-column")
    sh.write_manifest(out_fs, root, manifest)
    return Outcome(root, manifest, already=False, written=tuple(written),
                   skipped=len(shards) - len(pending), facts=facts)


def validation_facts(has_split: bool, hold_out: bool, val_percent: float, held: float,
                     cap_tokens: int) -> dict[str, Any]:
    """How the validation tokens were chosen, for the manifest (and `status`)."""
    if has_split:
        return {"kind": "split"}
    if not hold_out:
        return {"kind": "none"}
    return {"kind": "hold-out", "percent": round(held, 6), "requested_percent": val_percent,
            "cap_tokens": cap_tokens, "capped": held < val_percent}


def describe_validation(manifest: sh.Manifest) -> str:
    """One phrase: how much is held out and why ('' for a corpus prepared before this said)."""
    v = manifest.extra.get("validation") or {}
    if v.get("kind") == "split":
        return "the source's validation split"
    if v.get("kind") == "none":
        return "no hold-out (--val-percent 0)"
    if v.get("kind") == "hold-out":
        cap = (f", capped at ~{v['cap_tokens']:,} tokens (--val-percent {v['requested_percent']:g})"
               if v.get("capped") else "")
        return f"hold-out {v['percent']:.4g}% of documents{cap}"
    return ""


def damage(fs: Any, root: str, manifest: sh.Manifest) -> Optional[str]:
    """What is wrong with a finished corpus's files (the training-side check's line), or None
    when every shard its manifest lists is there and whole."""
    try:
        sh.check_files(fs, root, manifest)
    except sh.CorpusError as e:
        return str(e)
    return None


def whole_files(fs: Any, root: str, names: Sequence[str], dtype: str) -> dict[str, int]:
    """Of `names`, the files that are there and whole, with their token counts: an llm.c
    header of `dtype` and the size that count makes (one header read each)."""
    import pyarrow.fs as pafs

    infos = fs.get_file_info([f"{root}/{n}" for n in names])
    out = {}
    for name, info in zip(names, infos):
        if info.type != pafs.FileType.File or info.size < sh.HEADER_BYTES:
            continue
        with fs.open_input_file(f"{root}/{name}") as f:
            try:
                got, tokens = sh.decode_header(f.read(sh.HEADER_BYTES), name)
            except sh.CorpusError:
                continue
        if got == dtype and info.size == sh.HEADER_BYTES + tokens * sh.itemsize(dtype):
            out[name] = tokens
    return out


def unfinished(fs: Any, root: str, shards: Sequence[Mapping[str, Any]], dtype: str,
               listed: Mapping[str, int]) -> list[dict[str, Any]]:
    """The plan's shards to make (again): the done file not whole, or a held-out part that is
    there but damaged, or that the old manifest (`listed`: file -> tokens) lists and is gone;
    a file whose count differs from the one listed is damaged too."""
    names = [f for s in shards for f in (s["train"], s["val"]) if f]
    whole = whole_files(fs, root, names, dtype)
    present = _present(fs, root, names)

    def sound(file: Optional[str]) -> bool:
        if not file:
            return True
        if file not in present:
            return file not in listed
        return file in whole and listed.get(file, whole[file]) == whole[file]

    return [dict(s) for s in shards
            if done_file(s) not in whole or not sound(s["train"]) or not sound(s["val"])]


def _present(fs: Any, root: str, names: Sequence[str]) -> set[str]:
    import pyarrow.fs as pafs

    infos = fs.get_file_info([f"{root}/{n}" for n in names])
    return {n for n, i in zip(names, infos) if i.type == pafs.FileType.File}


def _listed(fs: Any, root: str, shards: Sequence[Mapping[str, Any]]) -> tuple[sh.Shard, ...]:
    """The manifest's shards from the files' own headers (one small read each): validation
    first (llm.c's shard 0), then training; a held-out part with no document has no file."""
    names = [(f, side) for side in (sh.VAL, sh.TRAIN) for s in shards
             for f in [s["val" if side == sh.VAL else "train"]] if f]
    present = _present(fs, root, [n for n, _ in names])
    out = []
    for file, side in names:
        if file not in present:
            continue
        with fs.open_input_file(f"{root}/{file}") as f:
            _, count = sh.decode_header(f.read(sh.HEADER_BYTES), f"{root}/{file}")
        if count:
            out.append(sh.Shard(file, side, count))
    return tuple(out)


def _cpus(use_ray: bool) -> int:
    if use_ray:
        import ray

        if ray.is_initialized():
            return int(ray.cluster_resources().get("CPU", 0)) or 1
    return 1
