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
  checkpoint at the next step boundary (training.run.preempt), and the driver then exits 143, which
  the RayJob retries (backoffLimit) from that checkpoint;
- on a worker pod, first drains the pod's Ray node (GCS `DrainNode`, reason preemption, with the
  pod's deadline): Ray schedules nothing new there, so Ray Train restarts the group on the
  nodes that stay (or waits for the replacement pod) instead of on this one, where the group
  would train until kubelet's SIGKILL and lose it all to a second restart (measured in the
  stand-in: ~500 steps trained and thrown away, one more restart). The head is not drained:
  the driver and the run's hub live there until the RayJob's retry;
- waits until every process it signalled has exited (the checkpoint is registered by then), at
  most `--timeout` seconds (rendered from the grace period by submitter.contract.shutdown: less
  a margin for `ray start`'s own shutdown, and longer than the driver's own wait and exit),
  then returns so kubelet goes on with its SIGTERM.

"This pod": the processes that share the hook's HOSTNAME (kubelet sets it to the pod's name in
every container process, and Ray's processes inherit it); without one, every process the hook
can see (a container's own PID namespace). No torch, and Ray only for the drain's one call
(`ray._raylet`, about 0.3 s, bounded): the signals go out within a second.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Iterable, Optional, Sequence

from submitter.contract.shutdown import exit_chain
from training.run.identity import pid_alive

#: Ray Train's worker actor, as its process title shows it (setproctitle).
TRAIN_WORKER_TITLE = "ray::RayTrainWorker"
#: The drivers' modules: the GPT-2 job's and a --script job's (submitter.code_plan).
DRIVER_MODULES = ("training", "training.run_script")
#: How long the hook gives the drain before it signals anyway (a GCS that does not answer).
DRAIN_WAIT_S = 5.0


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


def _pod_processes(proc: Path, hostname: Optional[str], me: int) -> Iterable[tuple[int, list[str]]]:
    """(pid, argv) of this pod's processes: those with the hook's HOSTNAME, if it has one."""
    mark = f"HOSTNAME={hostname}".encode() if hostname else None
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        cmdline = _read(entry / "cmdline")
        if not cmdline:
            continue
        argv = [a.decode(errors="replace") for a in cmdline.rstrip(b"\0").split(b"\0")]
        if len(argv) == 1 and " " in argv[0]:  # a process title set over the whole argv area
            argv = argv[0].split(" ")
        if mark is not None and mark not in (_read(entry / "environ") or b"").split(b"\0"):
            continue
        yield int(entry.name), argv


def targets(proc: Path = Path("/proc"), hostname: Optional[str] = None,
            me: int = 0) -> list[int]:
    """PIDs of this pod's training processes (see the module's docstring)."""
    return sorted(pid for pid, argv in _pod_processes(proc, hostname, me) if is_target(argv))


def worker_node(proc: Path = Path("/proc"), hostname: Optional[str] = None,
                me: int = 0) -> Optional[tuple[str, str]]:
    """(node id, GCS address) of this pod's raylet, from its command line; None on the head
    (its GCS server runs in this pod) or where no raylet runs."""
    found = None
    for _, argv in _pod_processes(proc, hostname, me):
        program = os.path.basename(argv[0]) if argv else ""
        if program == "gcs_server":
            return None
        if program == "raylet":
            flags = dict(a[2:].split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a)
            if flags.get("node_id") and flags.get("gcs-address"):
                found = (flags["node_id"], flags["gcs-address"])
    return found


def drain(node_id: str, gcs_address: str, deadline_s: float) -> str:
    """Ask the GCS to drain the node for a preemption (nothing new is scheduled on it; it goes
    at `deadline_s` from now). Returns a line for the hook's output; never raises."""
    try:
        from ray._raylet import GcsClient
        from ray.core.generated import autoscaler_pb2

        reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
        deadline_ms = int((time.time() + deadline_s) * 1000)
        accepted, why = GcsClient(address=gcs_address).drain_node(
            node_id, reason, "pod terminating (preStop)", deadline_ms)
    except Exception as e:  # noqa: BLE001 - the signals matter more than the drain
        return f"not drained ({type(e).__name__}: {e})"
    return "drained" if accepted else f"not drained ({why})"


def drain_in_time(node: Optional[tuple[str, str]], deadline_s: float,
                  wait_s: float = DRAIN_WAIT_S) -> str:
    """`drain`, given at most `wait_s` (a thread: a GCS that does not answer cannot hold the
    signals back)."""
    if node is None:
        return "not drained (the head pod, or no raylet here)"
    result = ["not drained (no answer from the GCS in time)"]
    thread = threading.Thread(target=lambda: result.__setitem__(0, drain(*node, deadline_s)),
                              daemon=True, name="drain")
    thread.start()
    thread.join(wait_s)
    return result[0]


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
    hostname = os.environ.get("HOSTNAME") or None
    node = worker_node(hostname=hostname, me=os.getpid())
    print(f"preStop: Ray node {drain_in_time(node, args.timeout)}", flush=True)
    pids = targets(hostname=hostname, me=os.getpid())
    print(f"preStop: SIGTERM to {len(pids)} training process(es) {pids}; waiting up to "
          f"{args.timeout:.0f}s for their preemption checkpoint", flush=True)
    left = stop(pids, args.timeout)
    if left:
        print(f"preStop: still running after {args.timeout:.0f}s: {left}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
