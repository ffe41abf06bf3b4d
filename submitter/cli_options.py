"""Options shared by the `submitter` commands (kept apart so no command module imports another)."""

from __future__ import annotations

from typing import Any, Callable

import click


def cluster_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """`--context` and `--kubeconfig` (in a pod, the in-cluster config is used)."""
    func = click.option("--kubeconfig", type=click.Path(dir_okay=False),
                        help="kubeconfig file [default: $KUBECONFIG or ~/.kube/config]")(func)
    return click.option("--context", "kube_context", help="kubeconfig context to use")(func)


# --- the namespace, as kubectl chooses it -------------------------------------------------------

#: Where a pod's service account namespace lives (kubectl uses it in a pod without a kubeconfig).
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def default_namespace(context: str | None = None, kubeconfig: str | None = None) -> str:
    """The namespace a command uses when -n is not given: the kubeconfig context's namespace
    (`--context`, else the current context), like kubectl; in a pod without a kubeconfig, the
    service account's; else "default".

    Why parse the file here instead of asking `kubernetes.config`: `render` and `--help` must
    not import `kubernetes`. A missing or broken kubeconfig is not an error here (render needs
    no cluster); cluster commands report it when they connect."""
    import os

    paths = [kubeconfig] if kubeconfig else \
        [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p] or \
        [os.path.expanduser("~/.kube/config")]
    docs = [_load_yaml(p) for p in paths]
    docs = [d for d in docs if isinstance(d, dict)]
    if not docs:
        if "KUBERNETES_SERVICE_HOST" in os.environ and not context:
            try:
                with open(SERVICE_ACCOUNT_NAMESPACE) as f:
                    return f.read().strip() or "default"
            except OSError:
                pass
        return "default"
    # kubectl's merge rule for a $KUBECONFIG list: the first file to set a value wins.
    name = context or next((d["current-context"] for d in docs if d.get("current-context")), None)
    for doc in docs:
        for entry in doc.get("contexts") or []:
            if isinstance(entry, dict) and entry.get("name") == name:
                namespace = (entry.get("context") or {}).get("namespace")
                return str(namespace) if namespace else "default"
    return "default"


def _load_yaml(path: str) -> object:
    import yaml

    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return None


# --- -o values ------------------------------------------------------------------------------------

class OutputChoice(click.Choice):
    """`-o` with only its documented values, case-sensitive: `-o JSON` or `-o yml` is one line
    saying what is accepted (exit 2), never a directory or a silent fallback."""

    def __init__(self, choices: list[str]) -> None:
        super().__init__(choices, case_sensitive=True)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value in self.choices:
            return value
        from submitter.contract.errors import UsageError

        raise UsageError(f"-o {value}: not an output format here; use one of "
                         f"{', '.join(map(str, self.choices))} (lower case)")
