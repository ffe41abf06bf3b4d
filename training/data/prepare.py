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
   pieces and writes the shard where it runs (`make_shard`: the tokens never pass through the
   driver); with fewer, a task per piece, and the driver writes each shard whole once its
   pieces are in (`shards_streamed`). The manifest is written last.

Documents and tokens: a Parquet/JSONL row is a document; in text, a document begins at each
file (or piece of a big file) and at each WikiText article title (` = Title = `), and its lines
keep their newline. Each document's tokens are `[EOT] + encode_ordinary(document)`; documents
that are empty or whitespace only are skipped. Validation: the source's validation split when
it has one (its own shards), else the documents whose content hash falls in `val_percent`
(`is_held_out`), written beside each training shard as `val-<same index>.bin`.

Idempotent and resumable: a corpus whose manifest matches (same fingerprint, tokenizer and
settings) is left as it is; a plan that matches continues: a shard whose file exists is
skipped (shards appear whole). A corpus or plan made from something else under the same name is
refused (CorpusError: one line, exit 2). Only the corpus directory is written; nothing is
deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import numpy as np

from submitter.contract.errors import UsageError
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


# --- the source -------------------------------------------------------------------------------

@dataclass(frozen=True)
class FileRef:
    path: str      # the path the filesystem reads
    rel: str       # its name inside the source (what the fingerprint names)
    size: int
    version: str   # a content version: LFS sha256, blob id or mtime
    split: str = sh.TRAIN


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

    def fingerprint(self) -> str:
        """The content's identity: format, column, and each file's name, size and version (not
        where it is mounted, nor how the user spelled it)."""
        doc = [self.kind, self.fmt, self.text_column,
               [[f.rel, f.size, f.version, f.split] for f in self.files]]
        return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:32]

    def identity(self) -> dict[str, Any]:
        return {"kind": self.kind, "what": self.what, "format": self.fmt,
                "text_column": self.text_column, "files": len(self.files),
                "bytes": sum(f.size for f in self.files), "fingerprint": self.fingerprint()}


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
    if not files and root.startswith("datasets/") and "@" not in root:
        converted = f"{root}@refs%2Fconvert%2Fparquet"
        return hub_files(fs, converted, config or "default", dataset)
    if not any(f.split == sh.TRAIN for f in files):
        raise UsageError(f"--dataset {dataset}{' ' + config if config else ''}: no Parquet "
                         f"training files found (prepare reads a Hub dataset's Parquet files); "
                         f"check the name and --dataset-config")
    return sorted(files, key=lambda f: (f.split != sh.TRAIN, f.rel))


def hub_source(dataset: str, config: Optional[str], text_column: str, fs: Any = None,
               root: Optional[str] = None) -> Source:
    """A Hub dataset by name and config, read as Parquet through `fs` (default: HfFileSystem,
    which reads by HTTP ranges: no file is downloaded whole to one disk)."""
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    if fs is None:
        from huggingface_hub import HfFileSystem

        fs = HfFileSystem()
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
    files = tuple(FileRef(i.path, i.path[len(base):].lstrip("/") or os.path.basename(i.path),
                          int(i.size or 0), str(i.mtime_ns or i.size)) for i in infos)
    return Source("files", data, fmt, text_column, fs, files)


def offline_source() -> Source:
    """The offline corpus: this Python's standard library (`pipeline.stdlib_files`)."""
    import sysconfig

    import pyarrow.fs as pafs

    from submitter.contract.naming import OFFLINE_DATASET

    base = sysconfig.get_paths()["stdlib"]
    files = tuple(FileRef(str(p), os.path.relpath(p, base), p.stat().st_size,
                          str(p.stat().st_mtime_ns)) for p in stdlib_files(base))
    return Source("offline", OFFLINE_DATASET, "text", "text", pafs.LocalFileSystem(), files)


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
    if ref.path.lower().endswith(_COMPRESSED):
        return [([ref.path, 0, -1], ref.size * 4)]
    if ref.size <= piece_bytes:
        return [([ref.path, 0, ref.size], ref.size)]
    with source.fs.open_input_file(ref.path) as f:
        return [([ref.path, s, e], e - s) for s, e in line_ranges(f, ref.size, piece_bytes)]


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


def plan_shards(pieces: Sequence[Mapping[str, Any]], tokens_per_byte: float, shard_tokens: int,
                hold_out: bool) -> list[dict[str, Any]]:
    """Consecutive pieces into shards of ~shard_tokens (estimated): training shards (each with
    its held-out validation shard when `hold_out`), then the validation split's own shards."""
    def groups(split: str) -> Iterator[list[int]]:
        current: list[int] = []
        estimate = 0.0
        for i, piece in enumerate(pieces):
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

def text_documents(lines: Sequence[str]) -> Iterator[str]:
    """Text lines as documents: one begins with the first line and at each WikiText title."""
    doc: list[str] = []
    for line in lines:
        if doc and is_title(line):
            yield "".join(doc)
            doc = []
        doc.append(line + "\n")
    if doc:
        yield "".join(doc)


def _read_range(fs: Any, path: str, start: int, end: int) -> bytes:
    if end < 0:
        with fs.open_input_stream(path, compression="detect") as f:
            return f.read()
    with fs.open_input_file(path) as f:
        f.seek(start)
        return f.read(end - start)


def range_documents(fs: Any, fmt: str, text_column: str, rng: Sequence[Any]) -> Iterator[str]:
    """The documents of one range, in order."""
    path, start, end = str(rng[0]), int(rng[1]), int(rng[2])
    if fmt == "parquet":
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path, filesystem=fs).read_row_groups(
            list(range(start, end)), columns=[text_column])
        yield from (t if isinstance(t, str) else "" for t in table.column(0).to_pylist())
        return
    text = _read_range(fs, path, start, end).decode("utf-8", errors="replace")
    if fmt == "jsonl":  # split on \n only: a JSON string may hold U+2028, which splitlines cuts
        for line in text.split("\n"):
            if line.strip():
                value = json.loads(line).get(text_column)
                yield value if isinstance(value, str) else ""
        return
    yield from text_documents(text.splitlines())


def is_held_out(document: str, val_percent: float) -> bool:
    """The hash hold-out: the same document lands on the same side on any machine, any run."""
    return zlib.crc32(document.encode("utf-8")) % 10_000 < val_percent * 100


def tokenize_piece(piece: Mapping[str, Any], *, fs: Any, fmt: str, text_column: str,
                   tokenizer: TokenizerSpec, dtype: str, val_percent: float,
                   hold_out: bool) -> dict[str, Any]:
    """One piece -> {"train": ids, "val": ids, "documents": n}: `[EOT] + tokens` per
    document, each on its side (the piece's split, or the hash hold-out)."""
    encoding = get_encoding(tokenizer)
    encode = ((lambda t: t.encode("utf-8")) if encoding.name == BYTE_ENCODING_NAME
              else encoding.encode_ordinary)
    eot = encoding.eot_token
    train: list[int] = []
    val: list[int] = []
    documents = 0
    for rng in piece["ranges"]:
        for doc in range_documents(fs, fmt, text_column, rng):
            if not doc.strip():
                continue
            side = val if piece["split"] == sh.VAL or (hold_out and is_held_out(doc, val_percent)) else train
            side.append(eot)
            side.extend(encode(doc))
            documents += 1
    np_dtype = f"<u{sh.itemsize(dtype)}"
    return {"train": np.asarray(train, dtype=np_dtype), "val": np.asarray(val, dtype=np_dtype),
            "documents": documents}


def _tokenize_batch(batch: dict[str, np.ndarray], **work: Any) -> dict[str, np.ndarray]:
    """Ray Data's map_batches function: {"piece", "spec"} -> the piece's tokens as bytes."""
    out: dict[str, list[Any]] = {"piece": [], "train": [], "val": [], "documents": []}
    for index, spec in zip(batch["piece"], batch["spec"]):
        result = tokenize_piece(json.loads(str(spec)), **work)
        out["piece"].append(int(index))
        out["train"].append(result["train"].tobytes())
        out["val"].append(result["val"].tobytes())
        out["documents"].append(result["documents"])
    return {"piece": np.array(out["piece"], dtype=np.int64),
            "train": np.array(out["train"], dtype=object), "val": np.array(out["val"], dtype=object),
            "documents": np.array(out["documents"], dtype=np.int64)}


def tokenized(pieces: Sequence[tuple[int, Mapping[str, Any]]], work: Mapping[str, Any],
              use_ray: bool) -> Iterator[dict[str, Any]]:
    """Each piece's tokens, in the pieces' order: on Ray Data (one task a piece, across the
    cluster's CPUs, order preserved), or in this process (tests, tiny corpora)."""
    if not use_ray:
        for index, piece in pieces:
            yield {"piece": index, **tokenize_piece(piece, **work)}
        return
    np_dtype = f"<u{sh.itemsize(work['dtype'])}"
    items = [{"piece": index, "spec": json.dumps(piece)} for index, piece in pieces]
    for row in _on_ray(items, _tokenize_batch, work):
        yield {"piece": int(row["piece"]), "documents": int(row["documents"]),
               "train": np.frombuffer(row["train"], dtype=np_dtype),
               "val": np.frombuffer(row["val"], dtype=np_dtype)}


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
    yield from ds.iter_rows()


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
    """Each pending shard from tasks of one piece each (every CPU busy even for one shard);
    the pieces' tokens stream to this process, which writes each shard once its pieces are in."""
    owner = {i: s for s in pending for i in s["pieces"]}
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    documents = 0
    for result in tokenized([(i, pieces[i]) for s in pending for i in s["pieces"]], work, use_ray):
        shard = owner[result["piece"]]
        parts["train"].append(result["train"])
        parts["val"].append(result["val"])
        documents += result["documents"]
        if result["piece"] == shard["pieces"][-1]:
            written, tokens = write_shard_files(out_fs, root, shard, parts, work["dtype"])
            yield {"shard": done_file(shard), "written": written, "tokens": tokens,
                   "documents": documents}
            parts, documents = {"train": [], "val": []}, 0


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
             shard_tokens: int = sh.SHARD_TOKENS, piece_bytes: int = PIECE_BYTES) -> dict[str, Any]:
    """What a corpus under a name is made of: prepared again with the same key, it is the same
    bytes; with another, it is another corpus."""
    return {"source": source.identity(), "tokenizer": dict(identity), "eot": sh.EOT_POLICY,
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
            by_shard: Optional[bool] = None,
            on_progress: Callable[[Progress], None] = lambda p: None,
            clock: Callable[[], float] = time.monotonic) -> Outcome:
    """Prepare `source` into the corpus directory `root` of `out_fs` (a pyarrow filesystem).

    `by_shard`: a task per shard that writes it where it runs (the default when there are at
    least as many shards to write as the cluster has CPUs: the tokens never pass through this
    process), else a task per piece with this process writing the shards (every CPU busy on a
    small corpus). Either writes the same bytes."""
    start = clock()
    root = root.rstrip("/")
    identity = sh.tokenizer_identity(get_encoding(tokenizer))
    dtype = sh.dtype_for(identity["vocab_size"])
    key = plan_key(source, identity, val_percent, shard_tokens, piece_bytes)
    done = existing(out_fs, root, name, key)
    if done is not None:
        return Outcome(root, done, already=True)
    hold_out = not source.has_val_split and val_percent > 0
    plan = _read_json(out_fs, f"{root}/{PLAN}")  # its key is the same: existing() said so
    if plan is None:
        pieces = make_pieces(source, piece_bytes)
        if not pieces:
            raise UsageError(f"{source.what}: no text to prepare")
        plan = {"name": name, "key": key, "pieces": pieces,
                "shards": plan_shards(pieces, tokens_per_byte(tokenizer), shard_tokens, hold_out)}
        out_fs.create_dir(root, recursive=True)
        sh.write_whole(out_fs, f"{root}/{PLAN}", json.dumps(plan, indent=1).encode("utf-8"))
    shards, pieces = plan["shards"], plan["pieces"]
    present = _present(out_fs, root, [f for s in shards for f in (s["train"], s["val"]) if f])
    pending = [s for s in shards if done_file(s) not in present]
    work = {"fs": source.fs, "fmt": source.fmt, "text_column": source.text_column,
            "tokenizer": tokenizer, "dtype": dtype, "val_percent": val_percent,
            "hold_out": hold_out}
    if by_shard is None:
        by_shard = use_ray and len(pending) >= _cpus(use_ray)
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
             "cpus": _cpus(use_ray), "task_per": "shard" if by_shard else "piece"}
    manifest = sh.Manifest(name=name, source=dict(key["source"]), tokenizer=identity,
                           dtype=dtype, shards=_listed(out_fs, root, shards),
                           shard_tokens=shard_tokens,
                           extra={"key": key, "prepare": facts})
    sh.write_manifest(out_fs, root, manifest)
    return Outcome(root, manifest, already=False, written=tuple(written),
                   skipped=len(shards) - len(pending), facts=facts)


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
