"""Prepare throughput: a source -> token shards (training.data.prepare), in tokens/s (not a test).

WikiText-2 text from ../shared/data repeated into one ~200 MB file (the size issue 32 measures
the on-the-fly path at), GPT-2's BPE from ../shared/data/gpt2.tiktoken, and:

  (a) in this process, no Ray (`use_ray=False`) on a slice: one core's rate, the unit a
      cluster multiplies;
  (b) on Ray Data with every CPU of this machine (`ray.init(num_cpus=os.cpu_count())`, started
      before the clock: Ray's start-up is a fixed cost of the job, not of the data): the whole
      prepare, from listing the source to the manifest written, its tokens over its wall time,
      in all and per CPU.

  (c) a ~1 GB `.jsonl.gz` (the same text as JSONL articles, gzip level 1, one member, built
      in the scratch directory at run time): the peak memory (RSS) of each kind of worker,
      each in a fresh process (a feeder decompressing the file once for every piece, a
      tokenizer on one piece, a piece read alone at the end of the file), against what one
      worker held before (the whole decompressed text, tokens as Python ints); and the whole
      prepare on Ray with every CPU: tokens/s in all and per CPU.

The prepared corpus goes to a scratch directory removed at the end. Run:

    python benchmarks/bench_prepare.py                 # ~2 minutes on 2 cores, + (c)
    python benchmarks/bench_prepare.py --mb 50 --no-ray --gz-gb 0
    python benchmarks/bench_prepare.py --only-gz --gz-gb 1   # (c) alone
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: ../shared/data beside the project, or /work/shared/data (worktrees live deeper).
DATA = next((p for p in (ROOT.parent / "shared" / "data", Path("/work/shared/data"))
             if (p / "gpt2.tiktoken").exists()), ROOT.parent / "shared" / "data")
#: One H200 trains gpt2-small at ~0.55 M tokens/s (FACTS: the nanoGPT-style reference step).
GPU_TOKENS_PER_S = 0.55e6


def corpus_file(directory: Path, mb: int) -> Path:
    """WikiText-2 (valid + test) repeated to ~mb MB, one file."""
    text = "".join((DATA / "wikitext-2" / name).read_text(encoding="utf-8")
                   for name in ("valid.txt", "test.txt"))
    path = directory / f"wikitext-{mb}mb.txt"
    repeats = max(1, round(mb * 1e6 / len(text.encode("utf-8"))))
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(repeats):
            f.write(text)
    return path


def run(source_path: Path, out: Path, use_ray: bool, fmt: str = "text") -> tuple[float, int, int]:
    """(seconds, tokens, CPUs) of one prepare into `out`."""
    import pyarrow.fs as pafs

    from training.data import prepare as prep
    from training.data.tokens import TokenizerSpec

    tokenizer = TokenizerSpec("bpe-file", str(DATA / "gpt2.tiktoken"))
    start = time.perf_counter()
    source = prep.files_source(str(source_path), fmt, "text")
    outcome = prep.prepare(source, pafs.LocalFileSystem(), str(out), tokenizer, name="bench",
                           val_percent=0.5, use_ray=use_ray)
    seconds = time.perf_counter() - start
    tokens = sum(s.tokens for s in outcome.manifest.shards)
    return seconds, tokens, outcome.facts["cpus"]


def jsonl_gz(directory: Path, gigabytes: float) -> tuple[Path, int]:
    """WikiText-2's articles as JSONL, repeated and gzipped (level 1, one member) to
    ~`gigabytes` GB compressed; (the file, its text bytes)."""
    import json
    import zlib

    text = "".join((DATA / "wikitext-2" / name).read_text(encoding="utf-8")
                   for name in ("valid.txt", "test.txt"))
    block = "".join(json.dumps({"text": " = " + a}) + "\n" for a in text.split("\n = ")).encode()
    path = directory / "corpus.jsonl.gz"
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    written = text_bytes = 0
    with open(path, "wb") as f:
        while written < gigabytes * 1e9:
            out = packer.compress(block)
            f.write(out)
            written += len(out)
            text_bytes += len(block)
        f.write(packer.flush())
    return path, text_bytes


def _peak(role: str, path: str, tokenizer_file: str, conn) -> None:  # type: ignore[no-untyped-def]
    """In a fresh process: one worker's work, then (baseline RSS, peak RSS, seconds, tokens,
    text bytes) sent back. Baseline: after imports and a warm tokenizer."""
    import resource

    import pyarrow.fs as pafs

    from training.data import prepare as prep
    from training.data.tokens import TokenizerSpec, get_encoding

    tokenizer = TokenizerSpec("bpe-file", tokenizer_file)
    get_encoding(tokenizer).encode_ordinary("warm " * 1000)
    fs = pafs.LocalFileSystem()
    source = prep.files_source(path, "auto", "text")
    ranges = [r for p in prep.make_pieces(source, prep.PIECE_BYTES) for r in p["ranges"]]
    work = {"fs": fs, "fmt": "jsonl", "text_column": "text", "tokenizer": tokenizer,
            "dtype": "uint16", "val_percent": 0.0, "hold_out": False, "shuffle_seed": 1}
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    tokens = nbytes = 0
    if role == "feed":
        for _, text in prep.feed_ranges(fs, path, [r[1:] for r in ranges]):
            nbytes += len(text)
    else:
        rng = ranges[0] if role == "tokenize" else ranges[max(len(ranges) - 2, 0)]
        piece = {"split": "train", "bytes": 0, "ranges": [rng]}
        fed = ({tuple(rng): next(prep.feed_ranges(fs, path, [rng[1:]]))}
               if role == "tokenize" else None)
        nbytes = len(fed[tuple(rng)][1]) if fed else 0
        start = time.perf_counter()
        tokens = len(prep.tokenize_piece(piece, **work, fed=fed)["train"])
    seconds = time.perf_counter() - start
    conn.send((base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, seconds, tokens,
               nbytes))


def worker_peak(role: str, path: Path) -> tuple[int, int, float, int, int]:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_peak, args=(role, str(path), str(DATA / "gpt2.tiktoken"), there))
    proc.start()
    result = here.recv()
    proc.join()
    return result


def gz_report(scratch: Path, gigabytes: float, use_ray: bool) -> None:
    """(c): peak memory per worker and tokens/s per CPU on a ~`gigabytes` GB .jsonl.gz."""
    began = time.perf_counter()
    path, text_bytes = jsonl_gz(scratch, gigabytes)
    size = path.stat().st_size
    print(f"\n(c) {path.name}: {size / 1e9:.2f} GB gzip, {text_bytes / 1e9:.2f} GB of JSONL text "
          f"(built in {time.perf_counter() - began:.0f} s)")
    mib = 2**20
    print(f"{'worker':<44} {'peak RSS':>10} {'above base':>11} {'seconds':>8} {'rate':>16}")
    rows = (("feeder: decompress once, every piece", "feed"),
            ("tokenizer: one piece, fed", "tokenize"),
            ("one piece read alone (near the end)", "alone"))
    tokens_per_text_byte = 0.0
    for label, role in rows:
        base, peak, seconds, tokens, nbytes = worker_peak(role, path)
        if role == "tokenize":
            tokens_per_text_byte = tokens / max(nbytes, 1)
        rate = (f"{nbytes / seconds / 1e6:,.0f} MB/s" if role == "feed" else
                f"{tokens / seconds:,.0f} tok/s")
        print(f"{label:<44} {peak / mib:>8,.0f} M {(peak - base) / mib:>9,.0f} M {seconds:>8.1f} "
              f"{rate:>16}")
    tokens = text_bytes * tokens_per_text_byte
    print(f"{'before: one worker held the file whole':<44} {'':>10} "
          f"{(text_bytes * 2 + tokens * 36) / mib:>9,.0f} M  (text read, then split, + ~36 B a "
          "token as Python ints: an estimate, at least)")
    if not use_ray:
        return
    import ray

    cpus = os.cpu_count() or 1
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    try:
        seconds, tokens, cpus = run(path, scratch / "gz-ray", use_ray=True, fmt="auto")
    finally:
        ray.shutdown()
    rate = tokens / seconds
    print(f"Ray, all CPUs: {cpus} CPUs, {tokens:,} tokens in {seconds:.1f} s: {rate:,.0f} tokens/s, "
          f"{rate / cpus:,.0f} per CPU")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=200, help="size of the source text in MB")
    p.add_argument("--slice-mb", type=int, default=20, help="the in-process run's source size")
    p.add_argument("--no-ray", action="store_true", help="no Ray run: (a), and (c)'s workers")
    p.add_argument("--gz-gb", type=float, default=1.0, help="(c)'s .jsonl.gz size in GB (0: no (c))")
    p.add_argument("--only-gz", action="store_true", help="(c) only")
    args = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-prepare-", dir=Path.home()))
    rows = []
    try:
        if args.gz_gb > 0:
            gz_report(scratch, args.gz_gb, use_ray=not args.no_ray)
        if args.only_gz:
            return
        small = corpus_file(scratch, args.slice_mb)
        seconds, tokens, cpus = run(small, scratch / "one-core", use_ray=False)
        rows.append(("in process, no Ray", f"{args.slice_mb} MB", cpus, tokens, seconds))
        if not args.no_ray:
            import ray

            cpus = os.cpu_count() or 1
            ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
            big = corpus_file(scratch, args.mb)
            seconds, tokens, cpus = run(big, scratch / "ray", use_ray=True)
            rows.append(("Ray Data, all CPUs", f"{args.mb} MB", cpus, tokens, seconds))
            ray.shutdown()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{'how':<22} {'source':>8} {'CPUs':>5} {'tokens':>12} {'seconds':>8} "
          f"{'tokens/s':>11} {'per CPU':>10} {'H200s fed':>9}")
    for how, size, cpus, tokens, seconds in rows:
        rate = tokens / seconds
        print(f"{how:<22} {size:>8} {cpus:>5} {tokens:>12,} {seconds:>8.1f} {rate:>11,.0f} "
              f"{rate / cpus:>10,.0f} {rate / GPU_TOKENS_PER_S:>9.2f}")
    print("H200s fed: how many H200s training gpt2-small (0.55 M tokens/s) this rate keeps busy "
          "if prepared while training; prepared once, it is paid once per corpus.")


if __name__ == "__main__":
    main()
