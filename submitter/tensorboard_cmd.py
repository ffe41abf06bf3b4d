"""`submitter tensorboard NAME`: where a run's TensorBoard files are, and the command that
serves them.

Every run writes `<run>/tensorboard/` (training.events.trackers): a `submit --local` run under
`./runs/NAME`, a cluster run under `<storage>/<namespace>/NAME` in its bucket or on its PVC.
A local directory or a bucket is served from here (`tensorboard --logdir ...`); a PVC is
mounted only in the job's pods, so TensorBoard runs in the head pod (the image carries it) and
`kubectl port-forward` brings it here. Pure: it returns the commands; the CLI runs or prints them.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Optional

from submitter.contract.errors import NotFound, UsageError
from submitter.contract.naming import JOB_LABEL
from submitter.contract.storage import scheme_of

TENSORBOARD_DIR = "tensorboard"
HEAD_SELECTOR = "ray.io/node-type=head"
PIP_LINE = "pip install tensorboard (plus boto3 to read s3://)"


@dataclass(frozen=True)
class Board:
    logdir: str
    #: argv to run here (None: the run is on a PVC; `lines` are for a shell)
    argv: Optional[list[str]]
    lines: list[str]


def board(name: str, storage_path: Optional[str], namespace: Optional[str], port: int,
          cwd: str, exists=os.path.isdir) -> Board:
    """Where NAME's event files are and how to serve them (raises NotFound, exit 6, for a run
    that does not exist; UsageError, exit 2, for one without TensorBoard files)."""
    if storage_path is None:
        storage_path = os.path.join(cwd, "runs")
        if not exists(os.path.join(storage_path, name)):
            raise NotFound(f"no local run {name} under {storage_path}; for a cluster run pass "
                             "its --storage-path (the bucket URI, or the PVC path) and -n")
    base = storage_path.rstrip("/")
    parts = [base, namespace, name, TENSORBOARD_DIR] if namespace else [base, name, TENSORBOARD_DIR]
    remote = scheme_of(storage_path) not in ("", "file")
    logdir = "/".join(parts) if remote else os.path.join(*parts)
    argv = ["tensorboard", "--logdir", logdir, "--port", str(port)]
    if remote or exists(logdir):
        return Board(logdir, argv, [shlex.join(argv)])
    if namespace is None:
        if not exists(os.path.join(base, name)):  # no such run: exit 6, as report and logs
            raise NotFound(f"no run {name} under {storage_path} (no {os.path.join(base, name)}); "
                           "check the name and --storage-path (a cluster run on a PVC: add -n "
                           "NAMESPACE)")
        raise UsageError(f"no TensorBoard files at {logdir}: is {name} a run under "
                         f"{storage_path}? (a cluster run on a PVC: add -n NAMESPACE)")
    pod = f"$(kubectl -n {shlex.quote(namespace)} get pod -l {JOB_LABEL}={name},{HEAD_SELECTOR} -o name)"
    serve = (f"kubectl -n {shlex.quote(namespace)} exec {pod} -- tensorboard --logdir "
             f"{shlex.quote(logdir)} --port {port} --bind_all &")
    forward = f"kubectl -n {shlex.quote(namespace)} port-forward {pod} {port}:{port}"
    return Board(logdir, None, [serve, forward])
