"""Start-up cost of `submitter render` against the floor of importing its two libraries.

Prints `render wall / python -c "import yaml, jinja2"`: the median wall time of a full
`submitter render` process over the median of a process that only imports yaml and jinja2
(target <= 1.5). Runs are interleaved so machine noise hits both sides alike.

    python benchmarks/bench_render.py [--runs 21]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

RENDER = [sys.executable, "-m", "submitter", "render", "--name", "gpt2-demo",
          "--replicas", "8", "--gpu-per-pod", "1"]
FLOOR = [sys.executable, "-c", "import yaml, jinja2"]
TARGET = 1.5


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    runs = parser.parse_args().runs
    wall(RENDER), wall(FLOOR)  # warm the page cache and .pyc files
    render_times, floor_times = [], []
    for _ in range(runs):
        render_times.append(wall(RENDER))
        floor_times.append(wall(FLOOR))
    r, f = statistics.median(render_times), statistics.median(floor_times)
    ratio = r / f
    print(f"submitter render: median {r * 1000:.0f} ms over {runs} runs")
    print(f"import yaml, jinja2: median {f * 1000:.0f} ms over {runs} runs")
    print(f"render wall / import floor = {ratio:.2f} (target <= {TARGET}) "
          f"{'OK' if ratio <= TARGET else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
