"""Start-up cost of `submitter render` against the floor of importing its two libraries.

Prints `render / python -c "import yaml, jinja2"` hyperfine-style: each command runs --runs
times, interleaved so machine noise hits both sides alike, after warm-up runs; the ratio is of
the medians, for wall time and for CPU time (user + system of the child process). On a busy
shared machine the CPU-time ratio is the steadier one: wall time includes waiting for a core.
Target: <= 1.5 (#19 item 9, #26 item 5). The children run without PYTHONDONTWRITEBYTECODE (the
warm-up writes the .pyc files): an installed package has them (pip compiles them; a checkout
writes them on first run), and compiling the project's modules from source on every run was 30
of render's 110 ms CPU where the variable is set (this VM's shared environment sets it). `--importtime` also lists, from `python -X importtime` (the least
of --runs runs per module), the modules render imports beyond the floor's, heaviest first:
where the difference goes.

    python benchmarks/bench_render.py [--runs 21] [--importtime]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

RENDER = [sys.executable, "-m", "submitter", "render", "--name", "gpt2-demo",
          "--replicas", "8", "--gpu-per-pod", "1"]
FLOOR = [sys.executable, "-c", "import yaml, jinja2"]
TARGET = 1.5
#: What a user's shell has: the .pyc files are read, not recompiled each run (see the docstring).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_once(argv: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one process, CPU from its own rusage."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, env=ENV)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} exited with {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def measure(runs: int, warmup: int = 3) -> dict[str, list[tuple[float, float]]]:
    for _ in range(warmup):  # the page cache, .pyc files and Jinja's bytecode cache
        run_once(RENDER), run_once(FLOOR)
    out: dict[str, list[tuple[float, float]]] = {"render": [], "floor": []}
    for _ in range(runs):
        out["render"].append(run_once(RENDER))
        out["floor"].append(run_once(FLOOR))
    return out


def import_self_times(argv: list[str], runs: int) -> dict[str, int]:
    """Each module's least self time (us) over `runs` runs of `python -X importtime`."""
    best: dict[str, int] = {}
    for _ in range(runs):
        err = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True,
                             text=True, env=ENV).stderr
        for line in err.splitlines():
            if line.startswith("import time:") and "self [us]" not in line:
                us, _, name = line[len("import time:"):].split("|")
                best[name.strip()] = min(best.get(name.strip(), 1 << 40), int(us))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--importtime", action="store_true",
                        help="also list the modules render imports beyond the floor's")
    a = parser.parse_args()
    data = measure(a.runs)
    for kind, index in (("wall", 0), ("CPU", 1)):
        r = statistics.median(x[index] for x in data["render"])
        f = statistics.median(x[index] for x in data["floor"])
        ratio = r / f
        print(f"{kind:4}: submitter render median {r * 1000:.0f} ms (min "
              f"{min(x[index] for x in data['render']) * 1000:.0f}), import yaml, jinja2 median "
              f"{f * 1000:.0f} ms (min {min(x[index] for x in data['floor']) * 1000:.0f}) over "
              f"{a.runs} runs: ratio {ratio:.2f} (target <= {TARGET}) "
              f"{'OK' if ratio <= TARGET else 'MISSED'}")
    if a.importtime:
        render, floor = import_self_times(RENDER, a.runs), import_self_times(FLOOR, a.runs)
        extra = {k: v for k, v in render.items() if k not in floor}
        print(f"imports beyond the floor: {len(extra)} modules, {sum(extra.values()) / 1000:.1f} ms "
              f"(self times; the floor's own: {sum(floor.values()) / 1000:.1f} ms)")
        for name, us in sorted(extra.items(), key=lambda kv: -kv[1])[:15]:
            print(f"  {us / 1000:6.2f} ms  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
