"""Prepared corpora made directly with training.data.shards (no prepare job): shards of
known tokens, so a test can tell which sequence a batch holds."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from training.data import shards as sh

GPT2 = {"encoding": "gpt2", "vocab_size": 50257, "eot_id": 50256}
BYTE = {"encoding": "bytes", "vocab_size": 257, "eot_id": 256}


def make_corpus(fs: Any, root: str, train: Sequence[int], val: int = 0, block: int = 8,
                tokenizer: Optional[dict[str, Any]] = None, name: str = "c",
                tokens: Optional[Any] = None) -> sh.Manifest:
    """Train shards of `train` tokens each (and a val shard of `val`), manifest last. Unless
    `tokens` (a function of the split, the shard index and the count) says otherwise, token t
    of the train stream is `t // block % vocab`: a sequence's first token names it."""
    tok = tokenizer or BYTE
    dtype = sh.dtype_for(tok["vocab_size"])
    fs.create_dir(root, recursive=True)
    files, seen = [], 0
    for split, counts in ((sh.VAL, [val] if val else []), (sh.TRAIN, list(train))):
        for i, n in enumerate(counts):
            name_i = sh.shard_name(split, i)
            if tokens is not None:
                data = tokens(split, i, n)
            elif split == sh.TRAIN:
                # the sequence id (of the whole split) is the block's first token
                data = np.repeat(np.arange(seen // block, seen // block + -(-n // block)),
                                 block)[:n] % tok["vocab_size"]
                seen += n // block * block
            else:
                data = np.arange(n) % tok["vocab_size"]
            sh.write_shard(fs, f"{root}/{name_i}", data, dtype)
            files.append(sh.Shard(name_i, split, n))
    manifest = sh.Manifest(name=name, source={"kind": "test", "what": "t", "fingerprint": "f"},
                           tokenizer=dict(tok), dtype=dtype, shards=tuple(files))
    sh.write_manifest(fs, root, manifest)
    return manifest


def counting_source(fs: Any, root: str, counter: list[int]) -> Any:
    """A reader `source` (training.data.reader.open_corpus) for a corpus in a bucket that adds
    every byte it fetches to `counter[0]`: what the bucket serves the readers."""
    from training.data.reader import RangedSource

    def source(files: Any) -> Any:
        inner = RangedSource(fs, root, files)

        class Counting:
            def read(self, shard: Any, offset: int, nbytes: int) -> Any:
                counter[0] += nbytes
                return inner.read(shard, offset, nbytes)

            def close(self) -> None:
                inner.close()
        return Counting()
    return source
