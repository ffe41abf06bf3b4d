"""A container's first process: set up its mount namespace, then exec the container's command.

Run by the kubelet as `ip netns exec NS unshare -m -u --propagation private python enter.py
SPEC.json`: the network namespace is the pod's, the mount and UTS namespaces are new and
private, so every mount below is invisible outside. Stdlib only (it runs before the image).

SPEC: hostname, mounts [{source, target, readOnly, tmpfs}], cwd, env, argv, created (a file
that lists the mountpoints this made on the host's disk, for the kubelet to remove)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def mount(args: list[str], fds: tuple[int, ...] = ()) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, pass_fds=fds)
    if done.returncode:
        sys.exit(f"kubelet: mount {' '.join(args)}: {done.stderr.strip()}")


def make_target(target: str, is_file: bool, created) -> None:
    """mkdir -p the mountpoint, remembering the top-most directory this created."""
    parent = os.path.dirname(target) if is_file else target
    missing = parent
    while missing != "/" and not os.path.exists(os.path.dirname(missing)):
        missing = os.path.dirname(missing)
    if not os.path.exists(parent):
        os.makedirs(parent, exist_ok=True)
        created.write(missing + "\n")
    if is_file and not os.path.exists(target):
        open(target, "a").close()
        created.write(target + "\n")


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    subprocess.run(["hostname", spec["hostname"]], check=True)
    # Every source is opened before anything is mounted: a mount over /tmp must not hide a
    # source that lives under /tmp (the kubelet's own directory may).
    sources = {i: os.open(m["source"], os.O_PATH) for i, m in enumerate(spec["mounts"]) if not m.get("tmpfs")}
    created = open(spec["created"], "a", buffering=1)
    order = sorted(range(len(spec["mounts"])), key=lambda i: spec["mounts"][i]["target"].rstrip("/").count("/"))
    for i in order:
        m = spec["mounts"][i]
        target = m["target"]
        if m.get("tmpfs"):
            make_target(target, False, created)
            mount(["-t", "tmpfs", "-o", "mode=1777", "tmpfs", target])
            continue
        make_target(target, not os.path.isdir(f"/proc/self/fd/{sources[i]}"), created)
        mount(["--bind", f"/proc/self/fd/{sources[i]}", target], (sources[i],))
        if m.get("readOnly"):
            mount(["-o", "remount,bind,ro", target])
    created.close()
    for fd in sources.values():
        os.close(fd)
    os.chdir(spec["cwd"])
    argv = spec["argv"]
    os.execvpe(argv[0], argv, spec["env"])


if __name__ == "__main__":
    main(sys.argv[1])
