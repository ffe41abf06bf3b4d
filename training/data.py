"""The Ray Data pipeline: text rows -> token blocks, streamed to the workers.

Sources: a Hugging Face dataset by name (loaded with `datasets.load_dataset`, handed to Ray
Data with `from_arrow`; `from_huggingface` re-scans the working directory), files
given with `--data` (text, parquet or jsonl through Ray Data's readers), or the offline corpus
`python-stdlib` (this Python's own standard library source). Validation is the dataset's own
validation split when it has one, else a deterministic content-hash hold-out of the blocks.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from submitter.contract.naming import OFFLINE_DATASET
from training.tokens import TokenizerSpec, get_encoding, is_validation_block, tokenize_and_chunk

#: Rows per tokenization task: big enough to amortize, small enough to stream.
ROWS_PER_BATCH = 512
_SKIP_DIRS = {"test", "tests", "site-packages", "dist-packages", "idlelib", "lib2to3",
              "turtledemo", "__pycache__", "ensurepip", "venv"}


@dataclass(frozen=True)
class Corpus:
    train: Any           # ray.data.Dataset of {"text": str}
    val: Optional[Any]   # its validation split, or None: hold out blocks by hash
    description: str     # one line for the output: what was used


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
                data_format: str = "auto", text_column: str = "text") -> Corpus:
    import ray.data

    if data:
        return _files_corpus(data, data_format, text_column)
    if dataset == OFFLINE_DATASET:
        files = stdlib_files()
        size = sum(f.stat().st_size for f in files)
        ds = ray.data.read_text([str(f) for f in files], drop_empty_lines=False)
        return Corpus(ds, None, f"data: {OFFLINE_DATASET}: {len(files)} .py files, "
                                f"{size / 1e6:.1f} MB of this Python's standard library "
                                f"({sysconfig.get_paths()['stdlib']}), offline")
    return _hub_corpus(dataset, dataset_config, text_column)


def _files_corpus(data: str, data_format: str, text_column: str) -> Corpus:
    import ray.data

    fmt = data_format if data_format != "auto" else _guess_format(data)
    if fmt == "parquet":
        ds = ray.data.read_parquet(data).select_columns([text_column])
    elif fmt == "jsonl":
        ds = ray.data.read_json(data, lines=True)
    else:
        ds = ray.data.read_text(data, drop_empty_lines=False)
        text_column = "text"
    if text_column != "text":
        ds = ds.rename_columns({text_column: "text"})
    return Corpus(ds.select_columns(["text"]), None, f"data: {data} ({fmt})")


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


def _hub_corpus(dataset: str, config: Optional[str], text_column: str) -> Corpus:
    import datasets
    import ray.data

    dd = datasets.load_dataset(dataset, config)
    train = ray.data.from_arrow(dd["train"].data.table).select_columns([text_column])
    val = None
    for split in ("validation", "valid", "test"):
        if split in dd:
            val = ray.data.from_arrow(dd[split].data.table).select_columns([text_column])
            break
    if text_column != "text":
        train = train.rename_columns({text_column: "text"})
        val = val.rename_columns({text_column: "text"}) if val is not None else None
    return Corpus(train, val, f"data: {dataset} {config or ''} (Hugging Face, "
                              f"{dd['train'].num_rows} train rows)")


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
