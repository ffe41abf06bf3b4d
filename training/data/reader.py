"""Read a prepared corpus by position: this rank's micro-batches from (epoch, sequences consumed).

`open_corpus` opens a prepared corpus (training.data.shards): its manifest, optionally the
files checked against it (one header read per shard) and the job's tokenizer against the
corpus's. `CorpusReader` maps a sequence id to (shard, byte offset) with one bisect over the
shards' first ids (O(log shards)) and reads whole spans of consecutive sequences
(training.data.order), so a reader needs no index and no pass over the data:

- on a volume (a local or mounted path) each shard is memory-mapped: a span is a view, only the
  rows a rank takes are touched, the page cache is the cache; the rows of the next
  micro-batches are read ahead (madvise WILLNEED), and a shard truncated under the mapping is
  a one-line CorpusError naming it, not a SIGBUS (MappedSource);
- on a bucket (any other pyarrow filesystem: S3, GCS, Azure) a span is one ranged read, fetched
  ahead in a thread (the spans of the next micro-batches) into a cache bounded in bytes (LRU).
  Each rank fetches the spans its slices fall in whole; its slice of a step is a contiguous run
  of the step's ids sorted (training.data.order.rank_ids), the same few spans for a whole
  window, so the group fetches about one epoch from the bucket between them.

The order is a full permutation on a volume and windows of spans on a bucket (`order`);
`pin(order)` is what a checkpoint records of it (training.data.order.order_pin).

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

from submitter.contract.errors import SubmitterError
from training.data import shards as sh
from training.data.order import (FULL, WINDOW, WINDOW_SPANS, EpochOrder, MixtureOrder,
                                 corpus_fingerprint, order_pin, rank_ids, span_for, step_bases)

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
    """Shards on a volume, memory-mapped on first use: a read is a view (no copy, no cache);
    `advise` asks the kernel to read ahead (MADV_WILLNEED) the rows the next micro-batches take,
    so a step does not wait for their pages one fault at a time.

    A mapping turns an I/O error into a signal, not an exception: touching a page past the end
    of a file truncated after it was mapped raises SIGBUS, and Python cannot recover from it
    (its handlers run between bytecodes, after the faulting instruction), so the worker dies
    without a word. Hence every read first checks the file's size now (`mmap.size()`: one
    fstat on the mapping's own descriptor, so of the very file mapped) and refuses a range past
    it with a CorpusError naming the shard; the caller copies the rows out at once
    (`_Split.rows`). A file deleted or replaced by rename
    (how prepare writes and repairs shards) is no danger: the mapping keeps the old inode. What
    is left is a truncation in place in the microseconds between the check and the copy."""

    def __init__(self, root: str, files: tuple[str, ...]) -> None:
        self.paths = tuple(f"{root.rstrip('/')}/{f}" for f in files)
        self._maps: dict[int, tuple[Any, np.ndarray]] = {}  # the mmap, its bytes

    def _mapped(self, shard: int) -> tuple[Any, np.ndarray]:
        got = self._maps.get(shard)
        if got is None:
            import mmap

            try:
                with open(self.paths[shard], "rb") as f:  # the mapping keeps its own descriptor
                    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as e:  # ValueError: an empty file cannot be mapped
                raise unreadable_shard(self.paths[shard], f"cannot map it ({e})") from None
            got = self._maps[shard] = (mm, np.frombuffer(mm, dtype=np.uint8))
        return got

    def read(self, shard: int, offset: int, nbytes: int) -> np.ndarray:
        mm, data = self._mapped(shard)
        try:
            size = mm.size()  # fstat of the mapped file now
        except OSError as e:  # a volume gone (ESTALE, EIO)
            raise unreadable_shard(self.paths[shard], f"cannot read it ({e})") from None
        if offset + nbytes > min(size, len(data)):
            raise unreadable_shard(self.paths[shard], f"{size} bytes now, the run reads bytes "
                                   f"{offset}..{offset + nbytes} (truncated while the run read it)")
        return data[offset:offset + nbytes]

    def advise(self, shard: int, offset: int, nbytes: int) -> bool:
        """Read ahead bytes [offset, offset + nbytes) of a shard; whether the hint was given
        (a hint only: errors are left to the read, which reports them)."""
        import mmap

        if not hasattr(mmap, "MADV_WILLNEED"):  # not Linux/BSD: the page faults read
            return False
        try:
            mm, data = self._mapped(shard)
            start = offset - offset % mmap.PAGESIZE  # madvise wants a page-aligned start
            length = min(offset + nbytes, len(data)) - start
            if length <= 0:
                return False
            mm.madvise(mmap.MADV_WILLNEED, start, length)
            return True
        except (OSError, ValueError, SubmitterError):
            return False

    def close(self) -> None:
        for shard in list(self._maps):
            mm = self._maps.pop(shard)[0]  # its array goes with the tuple
            try:
                mm.close()
            except BufferError:  # views still held elsewhere: unmapped when they go
                pass


def unreadable_shard(path: str, what: str) -> sh.CorpusError:
    """The one line for a shard that fails under a running reader."""
    return sh.CorpusError(f"{path}: {what}: check the volume, repair the corpus (submitter "
                          f"data prepare of the same name remakes damaged shards), then resume")


def runs(ids: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) runs of consecutive ids in `ids` (sorted, as a rank's slice is)."""
    if not len(ids):
        return []
    ids = np.sort(ids)
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [len(ids)]))
    return [(int(ids[a]), int(ids[b - 1]) + 1) for a, b in zip(starts, stops)]


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
        """Start reading the sequences `ids` ahead: their spans into the cache (a bucket), or
        their rows' pages (a mapped volume: MappedSource.advise)."""
        if self.cache is not None:
            for k in np.unique(ids // self.span):
                self.cache.prefetch(int(k))
            return
        advise = getattr(self.source, "advise", None)
        if advise is not None:
            for start, stop in runs(ids):
                for p in self.layout.pieces(start, stop):
                    advise(p.shard, p.offset, p.nbytes)

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
        """The training order of `epoch` (the same for every group size): a full permutation
        on a volume, windows of whole spans on a bucket."""
        return EpochOrder(self.sequences(), seed, epoch, self.span, WINDOW_SPANS,
                          FULL if self.mapped else WINDOW)

    def pin(self, order: EpochOrder) -> dict[str, Any]:
        """What a checkpoint records of `order` (a resume mid-epoch compares it)."""
        m = self.manifest
        corpus = corpus_fingerprint(m.source.get("fingerprint"),
                                    [(s.file, s.tokens) for s in m.split(sh.TRAIN)])
        return order_pin(order, self.block, corpus)

    def batches(self, order: EpochOrder, position: int, global_batch: int, offset: int,
                share: int, micro: int,
                read_ahead: int = READ_AHEAD_BATCHES) -> Iterator[dict[str, np.ndarray]]:
        """This rank's micro-batches from `position` (sequences consumed in the epoch) to the
        epoch's last whole step: `share // micro` per step, in step order; a step's are its
        run of the step's sorted ids (training.data.order.rank_ids)."""
        if share % micro:
            raise ValueError(f"micro-batch {micro} does not divide the share {share}")
        train = self.splits[sh.TRAIN]

        def ids() -> Iterator[np.ndarray]:
            for base in step_bases(position, order.n, global_batch):
                mine = rank_ids(order, base, global_batch, offset, share)
                for s in range(0, share, micro):
                    yield mine[s:s + micro]

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
        r + world, ..., the same count on every rank (`val_batch_count`): under FSDP a rank
        with one batch more would all-gather while the others wait in the loss's all-reduce."""
        val = self.splits[sh.VAL]
        for k in range(val_batch_count(val.layout.n, micro, world, limit)):
            b = rank + k * world
            ids = np.arange(b * micro, (b + 1) * micro, dtype=np.int64)
            yield {"input_ids": val.rows(ids)}

    def close(self) -> None:
        for split in self.splits.values():
            if split.cache is not None:
                split.cache.close()
            split.source.close()


def val_batch_count(sequences: int, micro: int, world: int, limit: int = 0) -> int:
    """Validation micro-batches each rank evaluates: the whole batches dealt evenly (the
    remainder, fewer than `world`, is left out), at most `limit` (0: no limit)."""
    each = sequences // micro // world if micro > 0 and world > 0 else 0
    return min(each, limit) if limit else each


def filesystem(uri: str) -> tuple[Any, str]:
    """A pyarrow filesystem and the path in it, for a local path or a URI."""
    import pyarrow.fs as pafs

    if "://" not in uri:
        return pafs.LocalFileSystem(), uri.rstrip("/") or "/"
    fs, path = pafs.FileSystem.from_uri(uri)
    if type(fs).__name__ != "LocalFileSystem":  # a bucket: reads retried (training.data.retry)
        from training.data.retry import RetryingFileSystem

        fs = RetryingFileSystem(fs)
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


#: A checkpoint's note of its data order (beside state.pt): the driver reads it, not the state.
ORDER_NOTE = "data_order.json"


def write_order_note(directory: str, state: dict[str, Any]) -> None:
    """Write a checkpoint's order note (its epoch, position and pin) into `directory`."""
    import json
    import os

    note = {k: state.get(k) for k in ("epoch", "epoch_done", "sequences_in_epoch", "data_order")}
    with open(os.path.join(directory, ORDER_NOTE), "w") as f:
        json.dump(note, f, sort_keys=True)


def latest_order_note(run_dir: str) -> Optional[dict[str, Any]]:
    """The order note of the run's latest checkpoint (names sort by epoch and step); None when
    there is no checkpoint, or the latest has no note (the workers check it then)."""
    import json

    import pyarrow.fs as pafs

    try:
        fs, root = filesystem(run_dir)
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        names = sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory
                       and i.base_name.startswith("checkpoint_epoch"))
        if not names:
            return None
        with fs.open_input_stream(f"{root}/{names[-1]}/{ORDER_NOTE}") as f:
            note = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    return note if isinstance(note, dict) else None


def check_resumed_order(uri: str, manifest: sh.Manifest, block: int, run_dir: str,
                        restart: bool) -> None:
    """Before Ray starts: OrderChanged (one line, exit 2) when the run's latest checkpoint is
    mid-epoch in an order the corpus at `uri` and `block` no longer give
    (training.data.order.resume_order); nothing when there is none, or `restart`."""
    fs, root = filesystem(uri)
    reader = CorpusReader(fs, root, manifest, block)
    try:
        check_resumed_pin(reader.pin(reader.order(0, 0)), run_dir, restart)
    finally:
        reader.close()


def check_resumed_pin(pin: dict[str, Any], run_dir: str, restart: bool) -> None:
    """check_resumed_order for the order pinned as `pin` (a corpus's or a mixture's)."""
    from training.data.order import resume_order

    note = latest_order_note(run_dir)
    if not note or note.get("epoch_done"):
        return
    resume_order(note.get("data_order"), pin, int(note.get("sequences_in_epoch") or 0),
                 int(note.get("epoch") or 0), restart)


# --- mixtures ---------------------------------------------------------------------------------

class _LayoutN:
    """What a joined split shows of a layout: its sequence count."""

    def __init__(self, n: int) -> None:
        self.n = n


class _Joined:
    """Several corpora's splits as one id space: corpus c's sequence j is `bases[c] + j`."""

    def __init__(self, parts: list[_Split]) -> None:
        self.parts = parts
        self.bases = [0]
        for p in parts:
            self.bases.append(self.bases[-1] + p.layout.n)
        self.layout = _LayoutN(self.bases[-1])
        self.cache = None

    def _each(self, ids: np.ndarray) -> Iterator[tuple[_Split, np.ndarray, np.ndarray]]:
        which = np.searchsorted(self.bases, ids, side="right") - 1
        for c in np.unique(which):
            mask = which == c
            yield self.parts[int(c)], mask, ids[mask] - self.bases[int(c)]

    def prefetch(self, ids: np.ndarray) -> None:
        for part, _, local in self._each(ids):
            part.prefetch(local)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        out = np.empty((len(ids), self.parts[0].layout.block), dtype=np.int64)
        for part, mask, local in self._each(ids):
            out[mask] = part.rows(local)
        return out


class MixedReader(CorpusReader):
    """Prepared corpora mixed by weight (training.data.order.MixtureOrder): the training
    split is the corpora one after the other, the validation split likewise (each corpus's
    validation shards, all of them evaluated)."""

    def __init__(self, readers: list[CorpusReader], weights: list[float],
                 names: list[str]) -> None:
        self.readers, self.weights, self.names = readers, list(weights), list(names)
        self.block, self.span = readers[0].block, readers[0].span
        self.mapped = all(r.mapped for r in readers)  # a bucket among them: windows of spans
        self.splits = {split: _Joined([r.splits[split] for r in readers])
                       for split in (sh.TRAIN, sh.VAL)}

    def order(self, seed: int, epoch: int) -> MixtureOrder:  # type: ignore[override]
        return MixtureOrder(tuple(r.sequences() for r in self.readers), tuple(self.weights),
                            seed, epoch, self.span, WINDOW_SPANS,
                            FULL if self.mapped else WINDOW)

    def pin(self, order: Any) -> dict[str, Any]:
        corpus = "+".join(f"{name}:{w:g}={r.pin(r.order(0, 0))['corpus']}"
                          for name, w, r in zip(self.names, self.weights, self.readers))
        return order_pin(order, self.block, corpus)

    def close(self) -> None:
        for r in self.readers:
            r.close()


def open_mixture(parts: list[dict[str, Any]], block: int,
                 **options: Any) -> MixedReader:
    """A reader of the corpora `parts` ([{"uri", "weight", "name"}]) mixed by weight."""
    readers = [open_corpus(p["uri"], block, **options) for p in parts]
    spans = {r.span for r in readers}
    if len(spans) > 1:  # one span for all (a uint32 corpus beside uint16 ones)
        for r in readers:
            r.close()
        readers = [open_corpus(p["uri"], block, **{**options, "span": min(spans)})
                   for p in parts]
    return MixedReader(readers, [float(p["weight"]) for p in parts],
                       [str(p.get("name") or p["uri"]) for p in parts])


def check_mixture(parts: tuple[tuple[str, float], ...], storage_root: str,
                  identity: dict[str, Any], block: int, global_batch: int, run_dir: str,
                  restart: bool) -> tuple[list[dict[str, Any]], int, str]:
    """Before Ray starts, each corpus of a `--data NAME:WEIGHT,...` mixture as a single one is
    checked (manifest, shards, tokenizer), the mixture's epoch against one step, and a resume
    against its pinned order. Returns the workers' parts ([{"name", "uri", "weight"}]), the
    epoch's sequences and the run's data line. CorpusError / OrderChanged: one line, exit 2."""
    from submitter.contract.data_path import mixture_shares
    from submitter.contract.storage import corpus_root

    out, described = [], []
    for name, weight in parts:
        uri = corpus_root(storage_root, None, name)
        _, _, manifest = open_manifest(uri, check=True, identity=identity,
                                       label=f"--data {name} ({uri})")
        n = sum(s.tokens // block for s in manifest.split(sh.TRAIN))
        if n < 1:
            raise sh.CorpusError(f"--data {name} ({uri}): no training sequence of {block} "
                                 f"tokens: prepare more data, or leave it out of the mixture")
        out.append({"name": name, "uri": uri, "weight": weight})
        described.append(f"{name} {n:,}")
    mixed = open_mixture(out, block)
    try:
        sequences = mixed.sequences()
        if sequences < global_batch:
            raise sh.CorpusError(
                f"--data: the mixture holds {sequences} training sequences of {block} tokens, "
                f"fewer than one optimizer step ({global_batch}): prepare more data, or lower "
                f"--global-batch-size")
        check_resumed_pin(mixed.pin(mixed.order(0, 0)), run_dir, restart)
    finally:
        mixed.close()
    line = (f"data: mixture of prepared corpora, every step {mixture_shares(parts)}: "
            f"{', '.join(described)} sequences of {block} ({sequences:,} an epoch)")
    return out, sequences, line
