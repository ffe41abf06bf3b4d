"""The Ray Data pipeline: text rows -> token blocks, streamed to the workers.

Sources: a Hugging Face dataset by name (loaded with `datasets.load_dataset`, handed to Ray
Data with `from_arrow`; `from_huggingface` re-scans the working directory), files
given with `--data` (text, parquet or jsonl through Ray Data's readers), or the offline corpus
`python-stdlib` (this Python's own standard library source). Validation is `--val-data` when
given, else the dataset's own validation split when it has one, else a deterministic
content-hash hold-out of the blocks. `--limit-rows` keeps the first N rows (smoke runs).

Start-up never waits for a pass over the data:
- A Hub table is cut into `hub_block_count` slices before `from_arrow` (one block would be one
  tokenizing task on one core, for every epoch).
- One big text file is read in line-aligned byte ranges of TEXT_RANGE_BYTES (`read_text`):
  Ray Data's reader makes a file one block, read whole before the first row comes out.
- The steps per epoch, which the learning-rate plan needs, are ESTIMATED from the data's size
  (`estimate_blocks`: text bytes from file sizes, Parquet metadata or the Arrow table, times
  tokens per byte measured on a sample), never counted with `Dataset.count()` (which runs the
  whole tokenizing pipeline before step 1). The loop re-plans the schedule from the current LR
  when the first epoch ends and the real figure is known (training.gpt2.schedule), so an estimate
  that is off costs a little schedule shape, never a jump.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np

from submitter.contract.naming import OFFLINE_DATASET
from training.data.tokens import TokenizerSpec, get_encoding, is_validation_block, tokenize_and_chunk

#: Rows per tokenization task: big enough to amortize, small enough to stream.
ROWS_PER_BATCH = 512
_SKIP_DIRS = {"test", "tests", "site-packages", "dist-packages", "idlelib", "lib2to3",
              "turtledemo", "__pycache__", "ensurepip", "venv"}


#: Tokens per byte of English text under GPT-2's BPE when no sample can be read (~4 bytes a
#: token on WikiText).
DEFAULT_BPE_TOKENS_PER_BYTE = 0.25
#: Bytes of text per Hub slice at most (tokenizing runs at ~18 MB/s per core).
HUB_BLOCK_BYTES = 16 * 1024 * 1024
#: Text read to measure tokens per byte.
SAMPLE_BYTES = 256 * 1024
#: A single text file bigger than this is read (and tokenized) in ranges of this size, in
#: parallel (training.data.pipeline.read_text); in an object store, ranges are bigger: finding each
#: range's first line is one request made before training starts.
TEXT_RANGE_BYTES = 2 * 1024 * 1024
OBJECT_STORE_TEXT_RANGE_BYTES = 32 * 1024 * 1024
#: Suffixes of files read_text decompresses (their byte offsets are not the text's).
_COMPRESSED = (".gz", ".bz2", ".zst", ".lz4", ".snappy", ".br", ".xz", ".zstd")


@dataclass(frozen=True)
class Corpus:
    train: Any           # ray.data.Dataset of {"text": str}
    val: Optional[Any]   # its validation split, or None: hold out blocks by hash
    description: str     # one line for the output: what was used
    text_bytes: Optional[int] = None  # bytes of training text (an estimate; None: unknown)
    sample: tuple[str, ...] = ()      # some training rows, to measure tokens per byte


def stdlib_files(root: Optional[str] = None) -> list[Path]:
    """This Python's standard library `*.py`, sorted, without tests and third-party trees."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(base).parts[:-1]
        if any(p in _SKIP_DIRS or p.startswith("test") for p in parts):
            continue
        out.append(path)
    return out


def load_corpus(dataset: str, dataset_config: Optional[str], data: Optional[str],
                data_format: str = "auto", text_column: str = "text",
                val_data: Optional[str] = None, limit_rows: Optional[int] = None) -> Corpus:
    """The training text (and validation text, if separate) as Ray datasets of {"text"}."""
    import ray.data

    if data:
        corpus = _files_corpus(data, data_format, text_column)
    elif dataset == OFFLINE_DATASET:
        files = stdlib_files()
        size = sum(f.stat().st_size for f in files)
        ds = ray.data.read_text([str(f) for f in files], drop_empty_lines=False)
        corpus = Corpus(ds, None, f"data: {OFFLINE_DATASET}: {len(files)} .py files, "
                                  f"{size / 1e6:.1f} MB of this Python's standard library "
                                  f"({sysconfig.get_paths()['stdlib']}), offline",
                        size, tuple(_head_lines(str(files[0]))))
    else:
        corpus = _hub_corpus(dataset, dataset_config, text_column, limit_rows)
    if val_data:
        val = _files_corpus(val_data, data_format, text_column)
        corpus = replace(corpus, val=val.train,
                         description=f"{corpus.description}, validation: {val_data}")
    if limit_rows:
        corpus = limited(corpus, limit_rows)
    return corpus


def limited(corpus: Corpus, rows: int) -> Corpus:
    """The first `rows` training rows (the size estimate shrinks with them)."""
    total = corpus.text_bytes
    if total is not None and corpus.sample:
        per_row = sum(len(t.encode()) + 1 for t in corpus.sample) / len(corpus.sample)
        total = min(total, int(per_row * rows))
    return replace(corpus, train=corpus.train.limit(rows), text_bytes=total,
                   description=f"{corpus.description}, first {rows} rows")


def _files_corpus(data: str, data_format: str, text_column: str) -> Corpus:
    import ray.data

    fmt = data_format if data_format != "auto" else _guess_format(data)
    if fmt == "parquet":
        ds = ray.data.read_parquet(data).select_columns([text_column])
    elif fmt == "jsonl":
        ds = ray.data.read_json(data, lines=True)
    else:
        ds = read_text(data)
    if fmt != "text" and text_column != "text":
        ds = ds.rename_columns({text_column: "text"})
    nbytes, sample = _files_size_and_sample(data, fmt, text_column)
    return Corpus(ds.select_columns(["text"]), None, f"data: {data} ({fmt})", nbytes, sample)


#: JSONL read before Ray starts, every line of it (beyond: the first record of each file).
CHECK_JSONL_BYTES = 64 * 1024 * 1024


def check_files(data: str, data_format: str = "auto", text_column: str = "text",
                flag: str = "--data", jsonl_bytes: int = CHECK_JSONL_BYTES) -> None:
    """Before Ray starts: UsageError (one line naming the file, and the line; exit 2) for
    files the on-the-fly readers would fail on inside Ray with a traceback per task: none
    there, all empty, a `.parquet` that is not Parquet or lacks the text column, a JSONL line
    that is not a JSON object (every line of the first `jsonl_bytes`, then each file's first
    record). The checks are prepare's (training.data.prepare.check_source, json_record); a bad
    line further in than the budget still fails inside Ray."""
    import pyarrow.fs as pafs

    from submitter.contract.errors import UsageError
    from training.data.prepare import FileRef, Source, check_source

    fmt = data_format if data_format != "auto" else _guess_format(data)
    try:
        fs, path = _filesystem(data)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            infos = [i for i in fs.get_file_info(pafs.FileSelector(path, recursive=True))
                     if i.type == pafs.FileType.File and not any(
                         p.startswith((".", "_")) for p in i.path[len(path):].split("/"))]
        elif info.type == pafs.FileType.File:
            infos = [info]
        else:
            raise UsageError(f"{flag} {data}: not found; give a file or directory of text, "
                             "Parquet or JSONL (a local path, a path on the volume, or a bucket "
                             "URI)")
    except (OSError, ValueError) as e:
        raise UsageError(f"{flag} {data}: cannot list it ({e})") from None
    wanted = {"parquet": (".parquet",),  # in a directory (a file named is read as it is)
              "jsonl": (".jsonl", ".json", ".jsonl.gz", ".json.gz")}.get(fmt)
    if info.type == pafs.FileType.Directory and wanted is not None:
        infos = [i for i in infos if i.path.lower().endswith(wanted)]
    infos.sort(key=lambda i: i.path)
    if not infos:
        raise UsageError(f"{flag} {data}: no {fmt} files in it (--data-format {data_format})")
    files = tuple(FileRef(i.path, os.path.basename(i.path), int(i.size or 0), "")
                  for i in infos)
    source = Source("files", f"{flag} {data}", fmt, text_column, fs, files)
    check_source(source)  # empty, Parquet footers, each JSONL's first record
    if fmt == "jsonl":
        check_jsonl_lines(source, jsonl_bytes)


def check_jsonl_lines(source: Any, budget: int) -> None:
    """Every line of the source's JSONL files, up to `budget` bytes in all, is a JSON object
    (training.data.prepare.json_record: UsageError naming the file and the line)."""
    from submitter.contract.errors import UsageError
    from training.data.prepare import json_record

    for ref in source.files:
        if budget <= 0:
            return
        try:
            with source.fs.open_input_stream(ref.path, compression="detect") as f:
                rest = b""
                number = 0
                while budget > 0:
                    chunk = f.read(min(1 << 20, budget))
                    budget -= len(chunk)
                    lines = (rest + chunk).split(b"\n")
                    rest = lines.pop() if chunk else b""
                    for line in lines:
                        number += 1
                        if line.strip():
                            json_record(line, ref.path, number)
                    if not chunk:
                        break
        except OSError as e:
            raise UsageError(f"{ref.path}: cannot read it ({e})") from None


def read_text(data: str) -> Any:
    """Rows {"text": line} of a text file or directory, exactly as `ray.data.read_text` gives
    them (`str.splitlines`). One big file is read in line-aligned byte ranges, one task each:
    read_text makes a file one block, so the first batch would wait for the whole file to be
    read and one core would tokenize all of it."""
    import ray.data

    ranges = _single_file_ranges(data)
    if ranges is None:
        return ray.data.read_text(data, drop_empty_lines=False)
    items = [{"path": data, "start": start, "end": end} for start, end in ranges]
    return ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        read_line_ranges, batch_size=1, batch_format="numpy")


def _filesystem(data: str) -> tuple[Any, str]:
    """pyarrow's filesystem for a URI or a local path, and the path within it."""
    import pyarrow.fs as pafs

    return pafs.FileSystem.from_uri(data if "://" in data else os.path.abspath(data))


def _single_file_ranges(data: str) -> Optional[list[tuple[int, int]]]:
    """Line-aligned ranges of `data` when it is one uncompressed file bigger than a range
    (None: let read_text handle it, errors included)."""
    if data.lower().endswith(_COMPRESSED):
        return None
    try:
        import pyarrow.fs as pafs

        fs, path = _filesystem(data)
        chunk = OBJECT_STORE_TEXT_RANGE_BYTES if "://" in data else TEXT_RANGE_BYTES
        info = fs.get_file_info(path)
        if info.type != pafs.FileType.File or (info.size or 0) <= chunk:
            return None
        with fs.open_input_file(path) as f:
            return line_ranges(f, info.size, chunk)
    except Exception:  # noqa: BLE001 - read_text reports what is wrong with the path
        return None


def line_ranges(f: Any, size: int, chunk: int) -> list[tuple[int, int]]:
    """[start, end) byte ranges of a file, about `chunk` bytes each, that cover it and begin
    where a line begins (right after a newline byte, or at 0). `f` is seekable."""
    starts = [0]
    for nominal in range(chunk, size, chunk):
        if nominal <= starts[-1]:
            continue  # a line longer than a chunk already took us past it
        f.seek(nominal - 1)
        pos = nominal - 1
        while True:
            piece = f.read(64 * 1024)
            newline = piece.find(b"\n")
            if newline >= 0:
                pos += newline + 1
                break
            if not piece:
                pos = size
                break
            pos += len(piece)
        if starts[-1] < pos < size:
            starts.append(pos)
    return list(zip(starts, starts[1:] + [size]))


def read_line_ranges(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Ray Data map_batches function: {"path", "start", "end"} -> {"text": lines}. Each range
    ends with a line break (or the file), so its `splitlines()` are exactly its share of the
    whole file's."""
    lines: list[str] = []
    for path, start, end in zip(batch["path"], batch["start"], batch["end"]):
        fs, local = _filesystem(str(path))
        with fs.open_input_file(local) as f:
            f.seek(int(start))
            lines.extend(f.read(int(end) - int(start)).decode("utf-8").splitlines())
    return {"text": np.array(lines, dtype=object)}


def _files_size_and_sample(data: str, fmt: str, text_column: str) -> tuple[Optional[int], tuple[str, ...]]:
    """Bytes of text in the files (file sizes; for Parquet the footers' row counts times the
    bytes per row of a sample) and a sample of rows (local text files, Parquet). Never
    raises."""
    try:
        import pyarrow.fs as pafs

        fs, path = _filesystem(data)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            infos = [i for i in fs.get_file_info(pafs.FileSelector(path, recursive=True))
                     if i.type == pafs.FileType.File and not os.path.basename(i.path).startswith(".")]
        else:
            infos = [info]
        if fmt == "parquet":
            import pyarrow.parquet as pq

            # Rows from the footers; bytes per row from the first 2,000 rows (the column's
            # stored size says little: dictionary encoding and compression).
            rows = sum(pq.ParquetFile(i.path, filesystem=fs).metadata.num_rows for i in infos)
            first = pq.ParquetFile(infos[0].path, filesystem=fs)
            batch = next(first.iter_batches(batch_size=2000, columns=[text_column]), None)
            sample = tuple(t or "" for t in batch.column(0).to_pylist()) if batch is not None else ()
            per_row = sum(len(t.encode()) + 1 for t in sample) / max(1, len(sample))
            return int(per_row * rows), sample
        total = sum(i.size or 0 for i in infos)
        sample = tuple(_head_lines(infos[0].path)) if fmt == "text" and "://" not in data else ()
        return total, sample
    except Exception:  # noqa: BLE001 - an estimate only; the loop learns the real figure
        return None, ()


def _head_lines(path: str, limit: int = SAMPLE_BYTES) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(limit).splitlines()[:-1] or [""]


def _guess_format(data: str) -> str:
    names = [data]
    if os.path.isdir(data):
        names = sorted(os.listdir(data))
    for name in names:
        low = name.lower()
        if low.endswith(".parquet"):
            return "parquet"
        if low.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
            return "jsonl"
    return "text"


def _hub_corpus(dataset: str, config: Optional[str], text_column: str,
                limit_rows: Optional[int] = None) -> Corpus:
    import datasets

    dd = datasets.load_dataset(dataset, config)
    return hub_corpus(dd, text_column, f"{dataset} {config or ''}".strip(), limit_rows)


def hub_block_count(rows: int, text_bytes: int, cpus: int) -> int:
    """Slices of a Hub table: at least one per CPU (every core tokenizes), more for big
    tables (each at most HUB_BLOCK_BYTES), never more than rows."""
    wanted = max(cpus, -(-text_bytes // HUB_BLOCK_BYTES))
    return max(1, min(rows, wanted))


def _cluster_cpus() -> int:
    import ray

    try:
        return int(ray.cluster_resources().get("CPU", 0)) or (os.cpu_count() or 1)
    except Exception:  # noqa: BLE001 - Ray not started (tests): this machine's
        return os.cpu_count() or 1


def _from_table(table: Any, text_column: str, cpus: int) -> tuple[Any, int]:
    """A Ray dataset of {"text"} from an Arrow table, in `hub_block_count` blocks."""
    import pyarrow.compute as pc
    import ray.data

    table = table.select([text_column])
    if text_column != "text":
        table = table.rename_columns(["text"])
    nbytes = int(pc.sum(pc.binary_length(table.column("text"))).as_py() or 0)
    n = hub_block_count(table.num_rows, nbytes, cpus)
    step = -(-table.num_rows // n) if table.num_rows else 1
    slices = [table.slice(i, step) for i in range(0, max(table.num_rows, 1), step)]
    return ray.data.from_arrow(slices), nbytes


def hub_corpus(dd: Any, text_column: str, name: str, limit_rows: Optional[int] = None) -> Corpus:
    """A Hugging Face DatasetDict (anything with a "train" split of `datasets.Dataset`) as a
    corpus whose blocks use every core. `limit_rows` cuts the table before it is sliced."""
    cpus = _cluster_cpus()
    table = dd["train"].data.table
    if limit_rows:
        table = table.slice(0, limit_rows)
    train, nbytes = _from_table(table, text_column, cpus)
    val = None
    for split in ("validation", "valid", "test"):
        if split in dd:
            val, _ = _from_table(dd[split].data.table, text_column, cpus)
            break
    sample = tuple(t if isinstance(t, str) else "" for t in
                   table.column(text_column).slice(0, 2000).to_pylist())
    return Corpus(train, val, f"data: {name} (Hugging Face, {table.num_rows} train rows, "
                              f"{train.num_blocks()} blocks)", nbytes, sample)


def tokens_per_byte(corpus: Corpus, tokenizer: TokenizerSpec) -> float:
    """Measured on the corpus's sample when it has one (1.0 for the byte tokenizer)."""
    if tokenizer.kind == "byte":
        return 1.0
    text = [t for t in corpus.sample if t]
    nbytes = sum(len(t.encode()) for t in text)
    if nbytes < 1024:
        return DEFAULT_BPE_TOKENS_PER_BYTE
    encoding = get_encoding(tokenizer)
    return sum(len(encoding.encode_ordinary(t)) for t in text) / nbytes


def estimate_blocks(corpus: Corpus, tokenizer: TokenizerSpec, block_size: int,
                    val_percent: float) -> Optional[int]:
    """Training blocks in one epoch, estimated from the text's size (None: unknown)."""
    if corpus.text_bytes is None:
        return None
    tokens = corpus.text_bytes * tokens_per_byte(corpus, tokenizer)
    if corpus.val is None:
        tokens *= 1 - val_percent / 100
    return max(1, int(tokens // block_size))


def steps_per_epoch_estimate(blocks: Optional[int], micro_batch: int, accumulation: int) -> int:
    """Optimizer steps per epoch from a block estimate (1 when nothing is known: the loop
    re-plans after the first epoch)."""
    if not blocks:
        return 1
    return max(1, blocks // (micro_batch * accumulation))


def chunk_batch(batch: dict[str, np.ndarray], tokenizer: TokenizerSpec, block_size: int,
                keep: Optional[str] = None, val_percent: float = 0.0) -> dict[str, np.ndarray]:
    """Ray Data map_batches function: {"text": [...]} -> {"input_ids": [n, block_size]}.

    `keep` selects a side of the hash hold-out: "train", "val", or None (keep all blocks).
    """
    texts = [t if isinstance(t, str) else "" for t in batch["text"]]
    blocks = tokenize_and_chunk(texts, get_encoding(tokenizer), block_size)
    if keep is not None and len(blocks):
        is_val = np.array([is_validation_block(b, val_percent) for b in blocks])
        blocks = blocks[is_val] if keep == "val" else blocks[~is_val]
    return {"input_ids": blocks.reshape(-1, block_size)}


def token_datasets(corpus: Corpus, tokenizer: TokenizerSpec, block_size: int,
                   val_percent: float) -> tuple[Any, Any]:
    """(train, val) datasets of token blocks; lazy and streaming."""
    def blocks(ds: Any, keep: Optional[str]) -> Any:
        return ds.map_batches(chunk_batch, batch_size=ROWS_PER_BATCH, batch_format="numpy",
                              fn_kwargs={"tokenizer": tokenizer, "block_size": block_size,
                                         "keep": keep, "val_percent": val_percent})

    if corpus.val is not None:
        return blocks(corpus.train, None), blocks(corpus.val, None)
    return blocks(corpus.train, "train"), blocks(corpus.train, "val")
