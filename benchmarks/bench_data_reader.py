"""A prepared corpus read by position: does one worker's reader keep up, and what does a
resume cost? (not a test; prints a table)

- **read**: tokens/s one worker's reader (training.data.reader) yields from a volume (local
  disk, memory-mapped) and from a bucket (moto's S3 server on 127.0.0.1, ranged reads with
  read-ahead and the bounded cache), as rank 0 of 8 at gpt2-small's step (512 x 1024 tokens,
  micro-batches of 16), against the 0.55 M tokens/s one H200 trains gpt2-small at
  (FACTS: the nanoGPT-style reference step);
- **resume**: seconds from opening the reader (manifest, layout) to its first micro-batch at 1%
  and at 90% of a >= 1 GB prepared corpus (WikiText-2 GPT-2 tokens repeated into shards of
  10^8 tokens with training.data.shards.write_shard; the page cache dropped for the shards
  first, POSIX_FADV_DONTNEED), and the same pair on the on-the-fly path (today's Ray Data
  pipeline, training.data.pipeline, whose resume replays the epoch up to its position:
  benchmarks/bench_data_pipeline.py measures its steady rate);
- **head's disk**: bytes a local run on a prepared corpus writes outside its storage and Ray's
  logs (Ray's temp dir, the Hugging Face caches), with `--head-disk` (one Ray run, ~1-2 min).

    python benchmarks/bench_data_reader.py                 # ~3-5 minutes, writes ~1.1 GB
    python benchmarks/bench_data_reader.py --gb 0.2 --no-fly
    python benchmarks/bench_data_reader.py --head-disk     # adds a tiny training run

The bucket needs moto's server: $SUBMITTER_MOTO_PYTHON or this interpreter with moto[server].
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = next((p for p in (ROOT.parent / "shared" / "data", Path("/work/shared/data"))
             if (p / "gpt2.tiktoken").exists()), ROOT.parent / "shared" / "data")
#: One H200, gpt2-small, the nanoGPT-style reference step (FACTS, fifth round).
H200_TOKENS_PER_S = 0.55e6
BLOCK, GLOBAL, WORLD, MICRO = 1024, 512, 8, 16
SHARD_TOKENS = 100_000_000


def gpt2_tokens():
    import numpy as np

    from training.data.tokens import get_encoding, resolve_tokenizer

    spec, _ = resolve_tokenizer("gpt2", str(DATA / "gpt2.tiktoken"))
    enc = get_encoding(spec)
    ids = []
    for name in ("valid.txt", "test.txt"):
        for line in (DATA / "wikitext-2" / name).read_text().split("\n \n"):
            ids.append(enc.eot_token)
            ids.extend(enc.encode_ordinary(line))
    return np.asarray(ids, dtype=np.uint16), enc


def make_prepared(fs, root: str, total_tokens: int, tokens, enc, val_tokens: int = 1_000_000):
    """Shards of SHARD_TOKENS (the last shorter) of `tokens` repeated, a val shard, manifest."""
    import numpy as np

    from training.data import shards as sh

    fs.create_dir(root, recursive=True)
    reps = -(-SHARD_TOKENS // len(tokens))
    big = np.tile(tokens, reps)[:SHARD_TOKENS]
    files = [sh.Shard("val-000000.bin", sh.VAL, val_tokens)]
    sh.write_shard(fs, f"{root}/val-000000.bin", big[:val_tokens], "uint16")
    left, i = total_tokens, 0
    while left > 0:
        n = min(SHARD_TOKENS, left)
        name = sh.shard_name(sh.TRAIN, i)
        sh.write_shard(fs, f"{root}/{name}", np.roll(big, i * 7919)[:n], "uint16")
        files.append(sh.Shard(name, sh.TRAIN, n))
        left, i = left - n, i + 1
    manifest = sh.Manifest(name="bench", source={"kind": "bench", "what": "wikitext-2 x N",
                                                 "fingerprint": "-"},
                           tokenizer=sh.tokenizer_identity(enc), dtype="uint16",
                           shards=tuple(files))
    sh.write_manifest(fs, root, manifest)
    return manifest


def drop_page_cache(root: str) -> None:
    for path in Path(root).glob("*.bin"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def rank0_batches(uri: str, position: int, **options):
    """Open the corpus as a worker does and return (reader, rank 0's micro-batches)."""
    from submitter.contract.batch import shares
    from training.data.order import offsets
    from training.data.reader import open_corpus

    reader = open_corpus(uri, BLOCK, **options)
    split = shares(GLOBAL, WORLD)
    order = reader.order(seed=1337, epoch=0)
    return reader, reader.batches(order, position, GLOBAL, offsets(split)[0], split[0], MICRO)


def read_rate(uri: str, seconds: float = 8.0) -> float:
    """Tokens/s rank 0's reader yields over `seconds` (from the start of the epoch)."""
    reader, batches = rank0_batches(uri, 0)
    next(batches)  # open and first fetch out of the rate
    t0, tokens = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        b = next(batches, None)
        if b is None:
            break
        tokens += b["input_ids"].size
    rate = tokens / (time.perf_counter() - t0)
    reader.close()
    return rate


def time_to_first(uri: str, fraction: float, local_root: str | None) -> float:
    """Seconds from opening the reader to rank 0's first micro-batch at `fraction`."""
    from training.data.reader import open_corpus

    n = open_corpus(uri, BLOCK).sequences()
    position = int(n * fraction) // GLOBAL * GLOBAL
    if local_root:
        drop_page_cache(local_root)
    t0 = time.perf_counter()
    reader, batches = rank0_batches(uri, position)
    next(batches)
    took = time.perf_counter() - t0
    reader.close()
    return took


def resume_pair(uri: str, local_root: str | None, repeats: int = 5) -> tuple[float, float]:
    """Median seconds to the first micro-batch at 1% and at 90% (alternated, after a warm-up
    that pays the imports and the first connection)."""
    import statistics

    time_to_first(uri, 0.5, local_root)
    early, late = [], []
    for _ in range(repeats):
        early.append(time_to_first(uri, 0.01, local_root))
        late.append(time_to_first(uri, 0.90, local_root))
    return statistics.median(early), statistics.median(late)


def on_the_fly_pair(text_mb: int, tmp: str) -> tuple[float, float, int]:
    """Today's path: load_corpus + token_datasets on a text file, one consumer; seconds to the
    batch at 1% and at 90% of the epoch (the replay a mid-epoch resume does), and its tokens."""
    import ray

    from training.data.pipeline import load_corpus, token_datasets
    from training.data.tokens import resolve_tokenizer

    src = "".join((DATA / "wikitext-2" / n).read_text() for n in ("valid.txt", "test.txt"))
    path = Path(tmp) / "fly.txt"
    with open(path, "w") as f:
        for _ in range(max(1, text_mb * 1_000_000 // len(src))):
            f.write(src)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = False
    DataContext.get_current().execution_options.preserve_order = True
    spec, _ = resolve_tokenizer("gpt2", str(DATA / "gpt2.tiktoken"))

    def epoch():
        corpus = load_corpus("x", None, str(path), "text", "text")
        train, _ = token_datasets(corpus, spec, BLOCK, 5.0)
        return train.iter_batches(batch_size=MICRO, batch_format="numpy")

    total = sum(len(b["input_ids"]) for b in epoch())  # the epoch's micro-batches' rows
    out = []
    for fraction in (0.01, 0.9):
        skip = int(total * fraction) // MICRO
        t0 = time.perf_counter()
        it = iter(epoch())
        for _ in range(skip):  # what training.gpt2.loop's resume does on this path
            next(it)
        next(it)
        out.append(time.perf_counter() - t0)
    ray.shutdown()
    return out[0], out[1], total * BLOCK


def head_disk(tmp: str) -> tuple[int, int, int]:
    """A tiny local run on a prepared corpus (2 workers, byte tokenizer): bytes under Ray's
    temp dir outside logs, bytes of its logs, and bytes added to the HF caches."""
    import numpy as np
    import pyarrow.fs as pafs

    from training.data import shards as sh

    storage = Path(os.path.expanduser("~/.cache/submitter-bench")) / f"hd-{os.getpid()}"
    root = storage / "corpora" / "c"
    rng = np.random.default_rng(0)
    fs = pafs.LocalFileSystem()
    fs.create_dir(str(root), recursive=True)
    files = []
    for split, n in ((sh.VAL, 64 * 64), (sh.TRAIN, 64 * 640)):
        name = sh.shard_name(split, 0)
        sh.write_shard(fs, f"{root}/{name}", rng.integers(0, 257, n), "uint16")
        files.append(sh.Shard(name, split, n))
    sh.write_manifest(fs, str(root), sh.Manifest(
        name="c", source={}, tokenizer={"encoding": "bytes", "vocab_size": 257, "eot_id": 256},
        dtype="uint16", shards=tuple(files)))
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt"))  # short: Ray's socket paths < 108 bytes
    hf = Path(os.path.expanduser("~/.cache/huggingface"))
    hf_before = _du(hf)
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp)}
    proc = subprocess.run([sys.executable, "-m", "training", "--name", "hd", "--storage-path",
                           str(storage), "--model", "tiny", "--data", "c", "--tokenizer", "byte",
                           "--block-size", "64", "--replicas", "2", "--epochs", "1",
                           "--val-steps", "2"], env=env, cwd=tmp, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-2000:])
    logs = sum(_du(p) for p in ray_tmp.rglob("logs") if p.is_dir())
    other = _du(ray_tmp) - logs
    shutil.rmtree(storage, ignore_errors=True)
    shutil.rmtree(ray_tmp, ignore_errors=True)
    return other, logs, _du(hf) - hf_before


def _du(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.05, help="corpus size (GB of tokens)")
    parser.add_argument("--bucket-gb", type=float, default=0.25,
                        help="the bucket's corpus (moto keeps it in memory)")
    parser.add_argument("--fly-mb", type=int, default=100, help="on-the-fly text file (MB)")
    parser.add_argument("--no-fly", action="store_true", help="skip the on-the-fly pair")
    parser.add_argument("--no-bucket", action="store_true")
    parser.add_argument("--head-disk", action="store_true", help="add a tiny training run")
    args = parser.parse_args()
    import pyarrow.fs as pafs

    tokens, enc = gpt2_tokens()
    base = Path(os.path.expanduser("~/.cache/submitter-bench"))
    base.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="reader-", dir=base)
    rows = []
    try:
        vol = f"{tmp}/corpus"
        t0 = time.perf_counter()
        m = make_prepared(pafs.LocalFileSystem(), vol, int(args.gb * 1e9 / 2), tokens, enc)
        print(f"volume corpus: {m.tokens() * 2 / 1e9:.2f} GB, {len(m.split('train'))} shards, "
              f"written in {time.perf_counter() - t0:.1f} s", flush=True)
        rate = read_rate(vol)
        rows.append(("read, volume (mmap), rank 0 of 8", f"{rate / 1e6:.2f} M tokens/s",
                     f"{rate / H200_TOKENS_PER_S:.1f}x an H200"))
        a, b = resume_pair(vol, vol)
        rows.append((f"resume, volume, {m.tokens() * 2 / 1e9:.2f} GB: 1% / 90%",
                     f"{a * 1e3:.1f} ms / {b * 1e3:.1f} ms", f"90% is {b / a:.2f}x 1%"))
        if not args.no_bucket:
            rows += bucket_rows(args.bucket_gb, tokens, enc)
        if not args.no_fly:
            a, b, n = on_the_fly_pair(args.fly_mb, tmp)
            rows.append((f"resume, on the fly ({n / 1e6:.1f} M tokens): 1% / 90%",
                         f"{a:.1f} s / {b:.1f} s", f"90% is {b / a:.2f}x 1% (replay)"))
        if args.head_disk:
            other, logs, hf = head_disk(tmp)
            rows.append(("head's disk, prepared run: Ray temp outside logs / logs / HF cache",
                         f"{other:,} / {logs:,} / {hf:,} B", ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"\n{'what':<{width}}  {'measured':<24}  against")
    for what, value, note in rows:
        print(f"{what:<{width}}  {value:<24}  {note}")
    return 0


def bucket_rows(gb: float, tokens, enc) -> list[tuple[str, str, str]]:
    """The same reads from moto's S3 server (started here, stopped after)."""
    import socket

    from tests.support.s3 import CREDENTIALS, S3Server, moto_python

    python = moto_python()
    if python is None:
        return [("bucket", "skipped: no moto[server]", "")]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        server = S3Server(f"127.0.0.1:{port}", {})
        os.environ.update({**CREDENTIALS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"})
        server.make_bucket("bench")
        m = make_prepared(server.filesystem(), "bench/c", int(gb * 1e9 / 2), tokens, enc)
        uri = "s3://bench/c"
        rate = read_rate(uri)
        a, b = resume_pair(uri, None)
        return [("read, bucket (moto, ranged + read-ahead), rank 0 of 8",
                 f"{rate / 1e6:.2f} M tokens/s", f"{rate / H200_TOKENS_PER_S:.1f}x an H200"),
                (f"resume, bucket, {m.tokens() * 2 / 1e9:.2f} GB: 1% / 90%",
                 f"{a * 1e3:.1f} ms / {b * 1e3:.1f} ms", f"90% is {b / a:.2f}x 1%")]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
