"""NCCL settings for GPU worker pods on a pod network (TCP, no RDMA).

Between pods, NCCL falls back to its socket transport, whose defaults (one helper thread, one
socket per peer connection) are tuned for neither a cloud VPC nor an overlay network: one TCP
stream rarely fills more than 10-30 Gb/s. NCCL's own guide suggests 4 threads x 4 sockets for
generic 100 Gb/s networks (their product may not exceed 64; AWS and GCP builds already default
higher). The GPU worker pods get those; a user's `--env` (or `--secret-env`) of the same name
wins, and CPU pods (gloo) and the head (no training) get nothing. The Helm chart's
`submitter.workerEnv` renders the same list (tests/submitter/test_helm_chart.py holds them equal).
"""

from __future__ import annotations

from typing import Mapping

#: NCCL's socket transport: helper threads per connection, sockets per thread.
NCCL_SOCKET_ENV = {"NCCL_NSOCKS_PERTHREAD": "4", "NCCL_SOCKET_NTHREADS": "4"}


def worker_env(gpu_per_pod: int, env: Mapping[str, str],
               secret_env: Mapping[str, str] = {}) -> dict[str, str]:
    """The plain environment of a worker pod: the user's `--env`, and on GPU pods the NCCL
    socket settings the user did not set (as plain or secret variables)."""
    defaults = NCCL_SOCKET_ENV if gpu_per_pod > 0 else {}
    out = {k: v for k, v in defaults.items() if k not in env and k not in secret_env}
    return {**out, **env}
