"""Options shared by the `submitter` commands (kept apart so no command module imports another)."""

from __future__ import annotations

from typing import Any, Callable

import click


def cluster_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """`--context` and `--kubeconfig` (in a pod, the in-cluster config is used)."""
    func = click.option("--kubeconfig", type=click.Path(dir_okay=False),
                        help="kubeconfig file [default: $KUBECONFIG or ~/.kube/config]")(func)
    return click.option("--context", "kube_context", help="kubeconfig context to use")(func)
