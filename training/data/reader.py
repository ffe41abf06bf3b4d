"""Read a prepared corpus by position: this rank's micro-batches from (epoch, sequences consumed).

`open_corpus` opens a prepared corpus (training.data.shards): its manifest, optionally the
files checked against it (one header read per shard) and the job's tokenizer against the
corpus's. `CorpusReader` maps a sequence id to (shard, byte offset) with one bisect over the
shards' first ids (O(log shards)) and reads whole spans of consecutive sequences
(training.data.order), so a reader needs no index and no pass over the data:

- on a volume (a local or mounted path) each shard is memory-mapped: a span is a view, only the
  rows a rank takes are touched, the page cache is the cache;
- on a bucket (any other pyarrow filesystem: S3, GCS, Azure) a span is one ranged read, fetched
  ahead in a thread (the spans of the next micro-batches) into a cache bounded in bytes (LRU).
  Each rank fetches the spans its slices fall in whole, so a bucket serves an epoch's bytes to
  every rank of the group (a few MB/s per GPU at gpt2-small's pace).

`batches(order, position, ...)` yields {"input_ids": int64 [micro, block]} for one rank from a
position: nothing before it is read. `val_batches` reads the validation shard(s) in order,
micro-batches dealt round-robin to the ranks.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import numpy as np

from training.data import shards as sh
from training.data.order import EpochOrder, rank_positions, span_for

#: Bytes of spans a bucket reader keeps (cached and in flight) at most.
CACHE_BYTES = 256 * 1024 * 1024
#: Micro-batches whose spans a bucket reader fetches ahead.
READ_AHEAD_BATCHES = 16
#: Threads fetching spans from a bucket.
FETCH_THREADS = 4


@dataclass(frozen=True)
class Piece:
    """Part of a span inside one shard: whole sequences, contiguous bytes."""

    shard: int
    offset: int    # bytes from the start of the shard file
    nbytes: int


class Layout:
    """Sequence ids of one split -> shard and byte offset (shards in the manifest's order)."""

    def __init__(self, shards: tuple[sh.Shard, ...], block: int, itemsize: int) -> None:
        self.files = tuple(s.file for s in shards)
        self.block, self.itemsize = block, itemsize
        counts = [s.tokens // block for s in shards]  # a shard's tail under a block is dropped
        self.first = [0]
        for c in counts:
            self.first.append(self.first[-1] + c)

    @property
    def n(self) -> int:
        return self.first[-1]

    def locate(self, seq: int) -> tuple[int, int]:
        """(shard index, byte offset of the sequence in it)."""
        if not 0 <= seq < self.n:
            raise IndexError(f"sequence {seq} outside 0..{self.n - 1}")
        shard = bisect.bisect_right(self.first, seq) - 1
        row_bytes = self.block * self.itemsize
        return shard, sh.HEADER_BYTES + (seq - self.first[shard]) * row_bytes

    def pieces(self, start: int, stop: int) -> list[Piece]:
        """The byte ranges holding sequences [start, stop)."""
        out, seq, row_bytes = [], start, self.block * self.itemsize
        while seq < stop:
            shard, offset = self.locate(seq)
            take = min(stop, self.first[shard + 1]) - seq
            out.append(Piece(shard, offset, take * row_bytes))
            seq += take
        return out


class MappedSource:
    """Shards on a volume, memory-mapped on first use: a read is a view (no copy, no cache)."""

    def __init__(self, root: str, files: tuple[str, ...]) -> None:
        self.paths = tuple(f"{root.rstrip('/')}/{f}" for f in files)
        self._maps: dict[int, np.memmap] = {}

    def read(self, shard: int, offset: int, nbytes: int) -> np.ndarray:
        mm = self._maps.get(shard)
        if mm is None:
            mm = self._maps[shard] = np.memmap(self.paths[shard], dtype=np.uint8, mode="r")
        return mm[offset:offset + nbytes]

    def close(self) -> None:
        self._maps.clear()


class RangedSource:
    """Shards in a bucket: one ranged read (`read_at`) per piece, files kept open."""

    def __init__(self, fs: Any, root: str, files: tuple[str, ...]) -> None:
        self.fs = fs
        self.paths = tuple(f"{root.rstrip('/')}/{f}" for f in files)
        self._files: dict[int, Any] = {}
        self._lock = threading.Lock()

    def read(self, shard: int, offset: int, nbytes: int) -> np.ndarray:
        with self._lock:
            f = self._files.get(shard)
            if f is None:
                f = self._files[shard] = self.fs.open_input_file(self.paths[shard])
        return np.frombuffer(f.read_at(nbytes, offset), dtype=np.uint8)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


class SpanCache:
    """Spans by id, fetched in threads ahead of use, LRU-bounded in bytes (cached + in flight)."""

    def __init__(self, fetch: Callable[[int], np.ndarray], span_bytes: int,
                 max_bytes: int = CACHE_BYTES, threads: int = FETCH_THREADS) -> None:
        self.fetch, self.span_bytes, self.max_bytes = fetch, span_bytes, max_bytes
        self._done: OrderedDict[int, np.ndarray] = OrderedDict()
        self._flight: dict[int, Future] = {}
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="corpus-read")

    def _held(self) -> int:
        return sum(a.nbytes for a in self._done.values()) + len(self._flight) * self.span_bytes

    def _evict(self, room: int) -> bool:
        while self._done and self._held() + room > self.max_bytes:
            self._done.popitem(last=False)
        return self._held() + room <= self.max_bytes

    def prefetch(self, span: int) -> None:
        if span in self._done or span in self._flight:
            return
        if self._evict(self.span_bytes):  # never past the bound: a later get fetches it
            self._flight[span] = self._pool.submit(self.fetch, span)

    def get(self, span: int) -> np.ndarray:
        if span in self._done:
            self._done.move_to_end(span)
            return self._done[span]
        future = self._flight.pop(span, None)
        data = future.result() if future is not None else self.fetch(span)
        if self._evict(data.nbytes):  # else used once and dropped: the bound holds
            self._done[span] = data
        return data

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._done.clear()
        self._flight.clear()


class _Split:
    """One split's layout and its span reader (a view or a cached fetch)."""

    def __init__(self, source: Any, layout: Layout, span: int, cached: bool,
                 cache_bytes: int) -> None:
        self.source, self.layout, self.span = source, layout, span
        self.dtype = np.dtype(f"<u{layout.itemsize}")
        span_bytes = span * layout.block * layout.itemsize
        self.cache = SpanCache(self._fetch, span_bytes, cache_bytes) if cached else None

    def _fetch(self, k: int) -> np.ndarray:
        parts = [self.source.read(p.shard, p.offset, p.nbytes) for p in
                 self.layout.pieces(k * self.span, min((k + 1) * self.span, self.layout.n))]
        data = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return data.view(self.dtype).reshape(-1, self.layout.block)

    def span_rows(self, k: int) -> np.ndarray:
        return self.cache.get(k) if self.cache is not None else self._fetch(k)

    def prefetch(self, ids: np.ndarray) -> None:
        if self.cache is not None:
            for k in np.unique(ids // self.span):
                self.cache.prefetch(int(k))

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The sequences `ids` as int64 [len(ids), block]."""
        out = np.empty((len(ids), self.layout.block), dtype=np.int64)
        spans = ids // self.span
        for k in np.unique(spans):
            rows = self.span_rows(int(k))
            mask = spans == k
            out[mask] = rows[ids[mask] - k * self.span]
        return out


class CorpusReader:
    """A prepared corpus's training and validation sequences of `block` tokens."""

    def __init__(self, fs: Any, root: str, manifest: sh.Manifest, block: int,
                 cache_bytes: int = CACHE_BYTES, span: Optional[int] = None,
                 source: Optional[Callable[[tuple[str, ...]], Any]] = None) -> None:
        self.root, self.manifest, self.block = root.rstrip("/"), manifest, block
        size = sh.itemsize(manifest.dtype)
        self.span = span or span_for(block, size)
        self.mapped = type(fs).__name__ == "LocalFileSystem"

        def make(files: tuple[str, ...]) -> Any:
            if source is not None:
                return source(files)
            return (MappedSource(self.root, files) if self.mapped
                    else RangedSource(fs, self.root, files))

        self.splits = {}
        for split in (sh.TRAIN, sh.VAL):
            layout = Layout(manifest.split(split), block, size)
            self.splits[split] = _Split(make(layout.files), layout, self.span,
                                        not self.mapped, cache_bytes)

    def sequences(self, split: str = sh.TRAIN) -> int:
        """Whole sequences of `block` tokens in a split."""
        return self.splits[split].layout.n

    def order(self, seed: int, epoch: int) -> EpochOrder:
        """The training order of `epoch` (the same for every group size)."""
        return EpochOrder(self.sequences(), seed, epoch, self.span)

    def batches(self, order: EpochOrder, position: int, global_batch: int, offset: int,
                share: int, micro: int,
                read_ahead: int = READ_AHEAD_BATCHES) -> Iterator[dict[str, np.ndarray]]:
        """This rank's micro-batches from `position` (sequences consumed in the epoch) to the
        epoch's last whole step: `share // micro` per step, in step order."""
        if share % micro:
            raise ValueError(f"micro-batch {micro} does not divide the share {share}")
        train = self.splits[sh.TRAIN]

        def ids() -> Iterator[np.ndarray]:
            for start, stop in rank_positions(position, order.n, global_batch, offset, share):
                for s in range(start, stop, micro):
                    yield order.ids(s, s + micro)

        upcoming = ids()
        ahead: deque[np.ndarray] = deque()
        while True:
            while len(ahead) <= read_ahead:
                nxt = next(upcoming, None)
                if nxt is None:
                    break
                train.prefetch(nxt)
                ahead.append(nxt)
            if not ahead:
                return
            yield {"input_ids": train.rows(ahead.popleft())}

    def val_batches(self, rank: int, world: int, micro: int,
                    limit: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Validation micro-batches in order, dealt round-robin: rank r takes batches r,
        r + world, ... (`limit` per rank at most; 0: all)."""
        val = self.splits[sh.VAL]
        n, taken = val.layout.n, 0
        for b in range(rank, n // micro, world):
            if limit and taken >= limit:
                return
            ids = np.arange(b * micro, (b + 1) * micro, dtype=np.int64)
            yield {"input_ids": val.rows(ids)}
            taken += 1

    def close(self) -> None:
        for split in self.splits.values():
            if split.cache is not None:
                split.cache.close()
            split.source.close()


def filesystem(uri: str) -> tuple[Any, str]:
    """A pyarrow filesystem and the path in it, for a local path or a URI."""
    import pyarrow.fs as pafs

    if "://" not in uri:
        return pafs.LocalFileSystem(), uri.rstrip("/") or "/"
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path.rstrip("/")


def open_manifest(uri: str, check: bool = True, identity: Optional[dict[str, Any]] = None,
                  label: Optional[str] = None) -> tuple[Any, str, sh.Manifest]:
    """The corpus at `uri`: its filesystem, root and manifest; with `check` its files are
    checked against the manifest, with `identity` the job's tokenizer against the corpus's.
    CorpusError (one line, exit 2, naming it `label`) when it is not a whole prepared corpus."""
    label = label or f"--data {uri}"
    try:
        fs, root = filesystem(uri)
    except (OSError, ValueError) as e:
        raise sh.CorpusError(f"{label}: cannot open it ({e})") from None
    try:
        manifest = sh.read_manifest(fs, root)
    except OSError as e:
        raise sh.CorpusError(f"{label}: cannot read its manifest ({e}): check the path "
                             f"and the credentials") from None
    if manifest is None:
        raise sh.CorpusError(f"{label}: no {sh.MANIFEST} there: not a prepared corpus, or "
                             f"its prepare has not finished (submitter data prepare --name ...)")
    if check:
        sh.check_files(fs, root, manifest)
    if identity is not None:
        sh.check_tokenizer(manifest, identity, label)
    return fs, root, manifest


def open_corpus(uri: str, block: int, check: bool = False,
                identity: Optional[dict[str, Any]] = None, **options: Any) -> CorpusReader:
    """A reader of the prepared corpus at `uri` (a path, or a bucket URI)."""
    fs, root, manifest = open_manifest(uri, check, identity)
    return CorpusReader(fs, root, manifest, block, **options)


def corpus_uri(data: Optional[str], dataset: str, storage_root: str) -> Optional[str]:
    """Where the job's prepared corpus is (None: the data is read on the fly): a NAME under
    `<storage root>/corpora/`, a path or URI that names one, or a directory holding a
    manifest (submitter.contract.data_path says which form is which)."""
    from submitter.contract.data_path import AT_START, ON_THE_FLY, corpus_dir, data_path
    from submitter.contract.storage import corpus_root

    chosen = data_path(data, dataset)
    if chosen.kind == ON_THE_FLY or data is None:
        return None
    if chosen.name:
        return corpus_root(storage_root, None, chosen.name)
    uri = corpus_dir(data)
    if chosen.kind == AT_START:
        import pyarrow.fs as pafs

        try:
            fs, root = filesystem(uri)
            found = fs.get_file_info(f"{root}/{sh.MANIFEST}").type == pafs.FileType.File
        except (OSError, ValueError):
            found = False  # the on-the-fly reader says what is wrong with it
        return uri if found else None
    return uri
