"""Options shared by the `submitter` commands (kept apart so no command module imports another)."""

from __future__ import annotations

import re
from typing import Any, Callable

import click

from submitter.contract.errors import UsageError

#: Where `--request-timeout` leaves its value for the command body (click's per-run meta).
_REQUEST_TIMEOUT_KEY = "submitter.request_timeout"


def cluster_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """`--context`, `--kubeconfig` (in a pod, the in-cluster config is used) and
    `--request-timeout` (read with `request_timeout()`, so command signatures stay as they are)."""
    func = click.option("--request-timeout", metavar="DURATION", expose_value=False,
                        callback=_store_request_timeout,
                        help="give up when the Kubernetes API has not answered for this long, "
                             "retries included (e.g. 10s, 2m) and exit 4 [default: 30s]")(func)
    return kubeconfig_options(func)


def apply_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """What a command that applies a job takes (`submit`, `data prepare`): `--dry-run`,
    `--watch` and `-o`."""
    func = click.option("-o", "--output", type=click.Choice(["text", "yaml", "json"]),
                        default="text", help="output format")(func)
    func = click.option("--watch", "watch_after", is_flag=True,
                        help="watch the job after submitting")(func)
    return click.option("--dry-run", type=click.Choice(["none", "client", "server"]),
                        default="none",
                        help="client: print the objects (GitOps), change nothing; server: let "
                             "the API server validate them without persisting; refused with "
                             "--local (exit 2): a local run applies no objects, so there is "
                             "nothing to dry-run")(func)


def refuse_local_dry_run(command: str, local: bool, dry_run: str) -> None:
    """`--dry-run` with `--local` is meaningless (a local run applies no objects, it trains);
    before this it was ignored and trained for real. One line, exit 2, nothing written."""
    if local and dry_run != "none":
        raise UsageError(f"{command} --local --dry-run={dry_run}: a local run applies no objects, "
                         "so there is nothing to dry-run; drop --local to see the cluster's "
                         "objects, or drop --dry-run to run here")


def subcommand_context(group: click.Group, ctx: click.Context) -> click.Context | None:
    """The context of the subcommand a parse error came from. Why: click raises an option's
    missing value (`--dry-run` with no value) without a context, and the hint must name that
    command's --help (which lists the option), not the group's."""
    name = ctx.invoked_subcommand
    command = group.get_command(ctx, name) if name and name != "*" else None
    return None if command is None else click.Context(command, info_name=name, parent=ctx)


class HintGroup(click.Group):
    """A command group whose subcommands' context-less parse errors get their context (see
    subcommand_context), so the top-level one-line error points at the right --help."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            e.ctx = e.ctx or subcommand_context(self, ctx) or ctx
            raise


def kubeconfig_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """`--context` and `--kubeconfig`: which cluster (and, without -n, which namespace)."""
    func = click.option("--kubeconfig", type=click.Path(dir_okay=False),
                        help="kubeconfig file [default: $KUBECONFIG or ~/.kube/config]")(func)
    return click.option("--context", "kube_context", help="kubeconfig context to use")(func)


def context_namespace_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """What `render` and `init` take to read the namespace from a kubeconfig, which they never
    do unless asked: `--namespace-from-context`, or `--context`/`--kubeconfig` given."""
    func = click.option("--namespace-from-context", is_flag=True,
                        help="without -n, use the kubeconfig context's namespace (as submit does) "
                             "instead of default; --context or --kubeconfig imply it")(func)
    return kubeconfig_options(func)


# --- the namespace: one rule (docs/gitops.md, "Which namespace") --------------------------------

#: The help of every -n/--namespace: the rule in one sentence, the same for every command.
NAMESPACE_HELP = ("Kubernetes namespace [default: for render and init, default (the kubeconfig is "
                  "read only with --namespace-from-context, --context or --kubeconfig); for submit "
                  "and the commands that find a job, the kubeconfig context's namespace, as "
                  "kubectl; see GitOps and Helm > Which namespace in the docs]")


def spec_namespace(given: bool, from_context: bool, context: str | None = None,
                   kubeconfig: str | None = None) -> str | None:
    """The namespace a job gets when neither -n nor its file gave one (None: when one was
    given, or JobSpec's `default`). `from_context`: a cluster command (`submit`), or render and
    init asked with --namespace-from-context, --context or --kubeconfig; so a GitOps render's
    output depends on its input alone, never on the machine's kubeconfig."""
    if given or not (from_context or context or kubeconfig):
        return None
    return default_namespace(context, kubeconfig)

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
def _store_request_timeout(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta[_REQUEST_TIMEOUT_KEY] = parse_duration(value, "--request-timeout")


def request_timeout() -> float | None:
    """The `--request-timeout` of the running command in seconds (None: the default)."""
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get(_REQUEST_TIMEOUT_KEY)


def parse_duration(text: str, flag: str = "--timeout") -> float:
    """90 / 90s / 30m / 2h / 1h30m -> seconds; anything else is a usage error."""
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?", text.strip(), re.ASCII)
    if not text.strip() or not match or not any(match.groups()):
        raise UsageError(f"{flag} {text!r} is not a duration; use e.g. 90s, 30m, 2h or 1h30m")
    h, m, s = match.groups()
    seconds = int(h or 0) * 3600 + int(m or 0) * 60 + float(s or 0)
    if seconds <= 0:
        raise UsageError(f"{flag} {text!r} must be positive")
    return seconds


def shown_default(default: Any) -> str:
    """` [default: X]` for a flag's help, or nothing when the default is empty."""
    return "" if default in (None, "", {}, []) else f" [default: {default}]"


def job_option(f: Any, shown: str = "",
               help: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The click option of one JobSpec field: its flag, its help (or `help`) with `shown` (the
    default it names), and no click default ("not given", so a job file sets what the flags
    leave alone). Every command that takes job settings (render, submit, init, data prepare)
    builds its flags here."""
    from submitter.contract.spec import field_types, flag_name

    meta, kind = f.metadata, field_types()[f.name]
    text = help or meta["help"]
    decls = [flag_name(f.name)] + ([meta["short"]] if meta["short"] else [])
    if kind is bool:
        return click.option(f"{flag_name(f.name)}/--no-{flag_name(f.name)[2:]}", f.name,
                            default=None, help=text + shown)
    if kind in (dict, list):
        return click.option(*decls, f.name, multiple=True, metavar=meta["metavar"], help=text)
    # text: JobSpec coerces and checks it (ASCII digits, ranges) with one message
    return click.option(*decls, f.name, default=None, metavar=meta["metavar"] or kind.__name__.upper(),
                        help=text + shown)


def add_params(func: Callable[..., Any], params: tuple[click.Parameter, ...]) -> Callable[..., Any]:
    """Add options built once (and shared: an Option holds no per-command state) to a command."""
    existing = getattr(func, "__click_params__", None)
    if existing is None:
        existing = func.__click_params__ = []  # type: ignore[attr-defined]
    existing.extend(params)
    return func


def given_settings(options: dict[str, Any], names: Any) -> dict[str, Any]:
    """Pop the job settings `names` from a command's options: those given, as JobSpec takes
    them (KEY=VALUE pairs as a dict, repeated flags as a list)."""
    from submitter.contract.spec import field_types, flag_name, parse_pairs

    types = field_types()
    flags: dict[str, Any] = {}
    for name in names:
        value = options.pop(name, None)
        if types[name] in (dict, list):
            value = (parse_pairs(flag_name(name), value) if types[name] is dict
                     else list(value)) if value else None
        if value is not None:
            flags[name] = value
    return flags
