"""`python -m training.prestop --timeout S`: the Ray pods' preStop hook (a pod's termination
reaches the training processes).

How kubelet ends a pod (a spot node, a drain, a Kueue preemption): it runs the container's
preStop hook, then sends SIGTERM to the container's PID 1, waits what is left of
terminationGracePeriodSeconds, then SIGKILL. In a KubeRay pod PID 1 is `/bin/bash -lc "ulimit
...; ray start ... --block"`: bash has no SIGTERM handler, so the kernel spares it (PID 1 of a
namespace), and even `ray start` itself only drains the node; the driver and the train workers
never learn of it, and no preemption checkpoint is written. So the hook does it first:

- SIGTERM to the driver (`python -m training`, or `python -m training.run_script` for a
  `--script` job; on the head, where Ray runs the job's entrypoint)
  and to the Ray Train workers (`ray::RayTrainWorker...`) of THIS pod; both save a preemption
  checkpoint at the next step boundary (training.preempt), and the driver then exits 143, which
  the RayJob retries (backoffLimit) from that checkpoint;
- waits until every process it signalled has exited (the checkpoint is registered by then), at
  most `--timeout` seconds (rendered from the grace period by submitter.contract.shutdown: less
  a margin for `ray start`'s own shutdown, and longer than the driver's own wait and exit),
  then returns so kubelet goes on with its SIGTERM.

"This pod": the processes that share the hook's HOSTNAME (kubelet sets it to the pod's name in
every container process, and Ray's processes inherit it); without one, every process the hook
can see (a container's own PID namespace). No Ray, no torch: it starts in well under a second.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Iterable, Optional, Sequence

from submitter.contract.shutdown import exit_chain
from training.run_identity import pid_alive

#: Ray Train's worker actor, as its process title shows it (setproctitle).
TRAIN_WORKER_TITLE = "ray::RayTrainWorker"
#: The drivers' modules: the GPT-2 job's and a --script job's (submitter.code_plan).
DRIVER_MODULES = ("training", "training.run_script")


def is_target(argv: Sequence[str]) -> bool:
    """A training driver (`python -m training ...` or `python -m training.run_script`, not this
    hook nor `export`) or a Ray Train worker process."""
    if argv and argv[0].startswith(TRAIN_WORKER_TITLE):
        return True
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m":
            return argv[i + 1] in DRIVER_MODULES and argv[i + 2:i + 3] != ["export"]
    return False


def _read(path: Path) -> Optional[bytes]:
    try:
        return path.read_bytes()
    except OSError:
        return None


def targets(proc: Path = Path("/proc"), hostname: Optional[str] = None,
            me: int = 0) -> list[int]:
    """PIDs of this pod's training processes (see the module's docstring)."""
    mark = f"HOSTNAME={hostname}".encode() if hostname else None
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        cmdline = _read(entry / "cmdline")
        if not cmdline:
            continue
        argv = [a.decode(errors="replace") for a in cmdline.rstrip(b"\0").split(b"\0")]
        if len(argv) == 1 and " " in argv[0]:  # a process title set over the whole argv area
            argv = argv[0].split(" ")
        if not is_target(argv):
            continue
        if mark is not None and mark not in (_read(entry / "environ") or b"").split(b"\0"):
            continue
        found.append(int(entry.name))
    return sorted(found)


def _alive(pid: int) -> bool:
    stat = _read(Path(f"/proc/{pid}/stat")) or b""
    return pid_alive(pid) and b") Z " not in stat  # a zombie has exited


def stop(pids: Iterable[int], timeout: float, poll: float = 0.2) -> list[int]:
    """SIGTERM each, then wait for them to exit; returns those still alive at the deadline."""
    pids = list(pids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if _alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(poll)
        alive = [p for p in alive if _alive(p)]
    return alive


def default_timeout() -> float:
    """The wait render writes for the default grace period (a hook run by hand gets the same)."""
    import dataclasses

    from submitter.contract.spec import JobSpec

    grace = {f.name: f for f in dataclasses.fields(JobSpec)}["termination_grace_period"].default
    return exit_chain(grace).prestop_s


def main(argv: Optional[Sequence[str]] = None) -> int:
    default = default_timeout()
    parser = argparse.ArgumentParser(
        prog="python -m training.prestop",
        description="The Ray pods' preStop hook: SIGTERM to this pod's training driver and Ray "
                    "Train workers (a preemption checkpoint), then wait for them to exit.",
        epilog=f"example: python -m training.prestop --timeout {default:g}")
    parser.add_argument("--timeout", type=float, default=default, metavar="SECONDS",
                        help="wait at most this long for the signalled processes (default "
                             f"{default:g}: the default grace period's share)")
    args = parser.parse_args(argv)
    if not args.timeout >= 0:
        parser.error("--timeout must be a number of seconds >= 0")
    pids = targets(hostname=os.environ.get("HOSTNAME") or None, me=os.getpid())
    print(f"preStop: SIGTERM to {len(pids)} training process(es) {pids}; waiting up to "
          f"{args.timeout:.0f}s for their preemption checkpoint", flush=True)
    left = stop(pids, args.timeout)
    if left:
        print(f"preStop: still running after {args.timeout:.0f}s: {left}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
