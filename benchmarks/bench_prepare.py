"""Prepare throughput: a source -> token shards (training.data.prepare), in tokens/s (not a test).

WikiText-2 text from ../shared/data repeated into one ~200 MB file (the size issue 32 measures
the on-the-fly path at), GPT-2's BPE from ../shared/data/gpt2.tiktoken, and:

  (a) in this process, no Ray (`use_ray=False`) on a slice: one core's rate, the unit a
      cluster multiplies;
  (b) on Ray Data with every CPU of this machine (`ray.init(num_cpus=os.cpu_count())`, started
      before the clock: Ray's start-up is a fixed cost of the job, not of the data): the whole
      prepare, from listing the source to the manifest written, its tokens over its wall time,
      in all and per CPU.

The prepared corpus goes to a scratch directory removed at the end. Run:

    python benchmarks/bench_prepare.py                 # ~2 minutes on 2 cores
    python benchmarks/bench_prepare.py --mb 50 --no-ray
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


def run(source_path: Path, out: Path, use_ray: bool) -> tuple[float, int, int]:
    """(seconds, tokens, CPUs) of one prepare into `out`."""
    import pyarrow.fs as pafs

    from training.data import prepare as prep
    from training.data.tokens import TokenizerSpec

    tokenizer = TokenizerSpec("bpe-file", str(DATA / "gpt2.tiktoken"))
    start = time.perf_counter()
    source = prep.files_source(str(source_path), "text", "text")
    outcome = prep.prepare(source, pafs.LocalFileSystem(), str(out), tokenizer, name="bench",
                           val_percent=0.5, use_ray=use_ray)
    seconds = time.perf_counter() - start
    tokens = sum(s.tokens for s in outcome.manifest.shards)
    return seconds, tokens, outcome.facts["cpus"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=200, help="size of the source text in MB")
    p.add_argument("--slice-mb", type=int, default=20, help="the in-process run's source size")
    p.add_argument("--no-ray", action="store_true", help="(a) only")
    args = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-prepare-", dir=Path.home()))
    rows = []
    try:
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
