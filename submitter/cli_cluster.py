"""Cluster commands: watch, status, list, logs, stop, delete, resume.

Each takes -n/--namespace, --context, --kubeconfig (in a pod, the in-cluster config is used) and
--request-timeout (every command's API work has a deadline; exit 4 when the API does not answer);
`kubernetes` is imported only inside the command bodies, so `submitter --help` stays fast.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any, Callable

import click

from submitter.cli_help import exit_codes_epilog
from submitter.cli_options import NAMESPACE_HELP, OutputChoice, cluster_options, default_namespace, parse_duration, request_timeout
from submitter.state import STATES


#: `list --state` values (a listed job is never DELETED).
_STATES = tuple(s for s in STATES if s != "DELETED")


def _kube(kube_context: str | None, kubeconfig: str | None) -> Any:
    from submitter.kube import Kube

    return Kube(context=kube_context, kubeconfig=kubeconfig, request_timeout=request_timeout())


def namespace_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """-n/--namespace; without it, the kubeconfig context's namespace (kubectl's rule)."""

    @functools.wraps(func)
    def resolved(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("namespace") is None:
            kwargs["namespace"] = default_namespace(kwargs.get("kube_context"), kwargs.get("kubeconfig"))
        return func(*args, **kwargs)

    return click.option("-n", "--namespace", default=None, metavar="NAMESPACE",
                        help=NAMESPACE_HELP)(resolved)


def job_command(func: Callable[..., Any]) -> Callable[..., Any]:
    """NAME + -n/--namespace + --context/--kubeconfig; the name is validated like submit's and
    completed from the cluster (shell completion)."""
    func = cluster_options(namespace_option(func))
    return click.argument("name", callback=_check_name, shell_complete=complete_job_names)(func)


def complete_job_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of NAME: the submitter RayJobs in the namespace -n/--context/--kubeconfig
    point at (one list request, no retries). Silent on any error: a shell prompt is no place for
    a traceback or a login failure."""
    import os

    try:
        os.environ.setdefault("SUBMITTER_API_RETRIES", "0")
        from submitter.contract.naming import JOB_LABEL
        from submitter.kube import Kube

        p = ctx.params
        kube = Kube(context=p.get("kube_context"), kubeconfig=p.get("kubeconfig"))
        namespace = p.get("namespace") or default_namespace(p.get("kube_context"), p.get("kubeconfig"))
        items = kube.list("RayJob", namespace, selector=JOB_LABEL).get("items") or []
        names = sorted({(i.get("metadata") or {}).get("name", "") for i in items})
        return [n for n in names if n and n.startswith(incomplete)]
    except Exception:
        return []


def _check_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from submitter.contract.spec import JobSpec

    JobSpec.build(name=value)  # raises SpecError (exit 2, one line) for an invalid name
    return value


def _objects_output(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("-o", "--output", type=OutputChoice(["table", "json", "yaml"]), default="table",
                        show_default=True, help="table, or the normalized state as json/yaml")(func)


def _print_states(states: list, output: str, single: bool, *, namespaces: bool = False) -> None:
    from submitter.event_text import eta_text
    from submitter.plan import to_yaml
    from submitter.state import table, utcnow

    data = [s.to_dict() for s in states]
    if output == "json":
        click.echo(json.dumps(data[0] if single else data, indent=2))
    elif output == "yaml":
        click.echo(to_yaml(data[0] if single else data, stream=False), nl=False)
    else:
        rows = table(states, utcnow(), namespaces=namespaces, wide=output == "wide")
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            click.echo("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
        notes = [f"{s.name}: {s.note}" for s in states if s.note]
        for note in notes:
            click.echo(f"note: {note}", err=True)
        if single:
            for s in states:
                if s.progress.data:  # what it trains on (a mixture: each corpus's share)
                    click.echo(f"data: {s.progress.data}")
                if s.diagnosis:
                    click.echo(f"blocked: {s.diagnosis}")
                if s.stalled:
                    click.echo(f"warning: {s.stalled}")
                if s.no_progress:
                    click.echo(f"warning: {s.no_progress}")
                eta = None if s.terminal else eta_text(s.progress, utcnow())
                if eta:
                    click.echo(eta)
                _print_pace(s)


def _print_pace(state: Any) -> None:
    """Measured against the estimate recorded with the job, and a warning when far off (#38)."""
    from submitter.pace import off_pace
    from submitter.state import utcnow

    lines = state.pace_lines(utcnow())
    if lines:
        click.echo("measured vs estimated: " + "; ".join(lines))
        warning = off_pace(state.estimate, state.measured(utcnow()))
        if warning:
            click.echo(warning)


@click.command(epilog=exit_codes_epilog())
@job_command
@click.option("--timeout", default=None, metavar="DURATION",
              help="stop watching after this long (e.g. 90s, 30m, 2h) and exit 3; the job keeps running")
@click.option("--stall-timeout", default=None, metavar="DURATION",
              help="exit 5 when the job shows no training progress and no state change for this "
                   "long (e.g. 30m); the job keeps running")
@click.option("-o", "--output", type=OutputChoice(["text", "json"]), default="text", show_default=True,
              help="text (a live table in a terminal) or JSON lines")
def watch(name: str, namespace: str, timeout: str | None, stall_timeout: str | None, output: str,
          kube_context: str | None, kubeconfig: str | None) -> None:
    """Watch a job until it ends; the exit code is the outcome (0 succeeded, 1 failed or stopped,
    3 and 5 the timeouts; every code: below, and Reliability > Exit codes in the docs).

    Ctrl-C stops watching and leaves the job running. While the job cannot start, the first blocking reason (image pull, Unschedulable, OOMKilled,
    CrashLoopBackOff, evicted/preempted pods, an unbound claim) is shown with its state; a
    running job that stops reporting progress for far longer than its own cadence gets a
    warning.

    \b
    Examples:
      submitter watch gpt2-demo
      submitter watch gpt2-demo -n team-a --timeout 2h
      submitter watch gpt2-demo -o json | jq 'select(.kind=="event")'
    """
    from submitter import api

    seconds = parse_duration(timeout) if timeout else None
    stall = parse_duration(stall_timeout, "--stall-timeout") if stall_timeout else None
    sys.exit(api.follow(name, namespace, output=output, timeout=seconds, stall_timeout=stall,
                        kube=_kube(kube_context, kubeconfig)))


@click.command()
@job_command
@_objects_output
def status(name: str, namespace: str, output: str, kube_context: str | None, kubeconfig: str | None) -> None:
    """Show one job's normalized state, KubeRay's raw statuses and its training progress.

    A job that cannot start or run shows the first blocking reason from its pods, their events
    and the RayCluster (e.g. "blocked: Unschedulable: pod/...: 0/3 nodes are available: 3
    Insufficient nvidia.com/gpu"); a running job without progress for far longer than its own
    cadence shows a warning.

    \b
    Examples:
      submitter status gpt2-demo
      submitter status gpt2-demo -n team-a -o json
    """
    from submitter import api

    _print_states([api.status(name, namespace, kube=_kube(kube_context, kubeconfig))], output,
                  single=True)


@click.command(name="list")
@namespace_option
@cluster_options
@click.option("-A", "--all-namespaces", is_flag=True, help="jobs of every namespace (adds a NAMESPACE column)")
@click.option("-l", "--selector", metavar="SELECTOR",
              help="only jobs whose labels match, as kubectl: key=value, key!=value, key, !key")
@click.option("--state", "states", multiple=True, metavar="STATE",
              type=click.Choice(list(_STATES), case_sensitive=False),
              help=f"only jobs in this state (repeatable): {', '.join(_STATES)}")
@click.option("-o", "--output", type=OutputChoice(["table", "wide", "json", "yaml"]), default="table",
              show_default=True, help="table, wide (also the RayCluster and KubeRay's reason), json or yaml")
def list_command(namespace: str, all_namespaces: bool, selector: str | None, states: tuple[str, ...],
                 output: str, kube_context: str | None, kubeconfig: str | None) -> None:
    """List the jobs submitter manages, one row each.

    \b
    Examples:
      submitter list
      submitter list -A
      submitter list -l team=nlp --state RUNNING --state STARTING -o wide
      submitter list -A -o json
    """
    from submitter import api

    found = api.jobs(namespace, all_namespaces=all_namespaces, selector=selector, states=states,
                     kube=_kube(kube_context, kubeconfig))
    wanted = {s.upper() for s in states}
    if not found and output in ("table", "wide"):
        where = "any namespace" if all_namespaces else f"namespace {namespace}"
        filters = "".join([f" matching {selector}" if selector else "",
                           f" in state {'/'.join(sorted(wanted))}" if wanted else ""])
        click.echo(f"no submitter jobs{filters} in {where}", err=True)
        return
    _print_states(found, output, single=False, namespaces=all_namespaces)


@click.command()
@job_command
@click.option("-f", "--follow", is_flag=True, help="keep streaming new output until the driver exits")
@click.option("--storage-path", metavar="PATH",
              help="where the run is kept (s3://, gs://, abfss://..., or a mounted path): its "
                   "stored logs, for a job whose pods and RayJob are gone")
def logs(name: str, namespace: str, follow: bool, storage_path: str | None, kube_context: str | None,
         kubeconfig: str | None) -> None:
    """Print the driver's output: the submitter Job's pod (K8sJobMode) while it exists, else the
    run's stored logs (<run>/logs/: each driver session, each failed worker's error), after
    the cluster is torn down or the job deleted. A line on stderr says which.

    \b
    Examples:
      submitter logs gpt2-demo
      submitter logs gpt2-demo -f | grep SUBMITTER_EVENT
      submitter logs gpt2-demo --storage-path s3://bucket/runs   # after submitter delete
    """
    from submitter.stored_logs import job_logs

    try:
        job_logs(lambda: _kube(kube_context, kubeconfig), namespace, name, storage_path=storage_path,
                 follow=follow, out=sys.stdout, err=sys.stderr)
    except KeyboardInterrupt:
        sys.exit(130)


@click.command()
@job_command
def stop(name: str, namespace: str, kube_context: str | None, kubeconfig: str | None) -> None:
    """Stop (suspend) a running job: KubeRay's spec.suspend, the Ray cluster is deleted.

    The RayJob, its checkpoints and progress stay; `submitter resume NAME` continues the run
    from its last checkpoint. A queued job (Kueue) is stopped through its Workload too
    (spec.active: false), so Kueue neither restarts it nor holds its quota.

    \b
    Examples:
      submitter stop gpt2-demo
      submitter stop gpt2-demo -n team-a && submitter resume gpt2-demo -n team-a
    """
    from submitter import api

    api.stop(name, namespace, kube=_kube(kube_context, kubeconfig), out=sys.stdout)


@click.command()
@job_command
@click.option("--delete-pvc", metavar="PVC",
              help="also delete this checkpoint PVC (must be the one submitter created for the job, "
                   "and no other job or pod may mount it); without it the PVC and its checkpoints "
                   "are always kept")
def delete(name: str, namespace: str, delete_pvc: str | None, kube_context: str | None,
           kubeconfig: str | None) -> None:
    """Delete a job: its RayJob (with the Ray cluster), RBAC objects and progress ConfigMap.

    Only objects that carry this job's identity are deleted. The checkpoint PVC is kept
    (with the job's settings: `submitter resume NAME` recreates the job) unless you name it
    with --delete-pvc.

    \b
    Examples:
      submitter delete gpt2-demo
      submitter delete gpt2-demo --delete-pvc gpt2-demo-checkpoints
    """
    from submitter import api

    api.delete(name, namespace, delete_pvc=delete_pvc, kube=_kube(kube_context, kubeconfig),
               out=sys.stdout)


@click.command()
@job_command
@click.option("--watch", "watch_after", is_flag=True, help="watch the new attempt")
def resume(name: str, namespace: str, watch_after: bool, kube_context: str | None,
           kubeconfig: str | None) -> None:
    """Continue a FAILED, STOPPED, SUSPENDED or deleted job from its last checkpoint.

    A suspended job (submitter stop) is unsuspended. A finished RayJob is replaced by one with
    the same name, spec, run name and storage, after a server dry run and with its settings
    saved on its PVC first, so a resume that fails halfway can simply be run again. A deleted
    job is recreated from those saved settings: no flags to retype. The PVC and the progress
    ConfigMap are left alone.

    \b
    Examples:
      submitter resume gpt2-demo
      submitter resume gpt2-demo -n team-a --watch
      submitter delete gpt2-demo && submitter resume gpt2-demo   # same settings, same run
    """
    from submitter import api

    kube = _kube(kube_context, kubeconfig)
    api.resume(name, namespace, kube=kube, out=sys.stdout)
    if watch_after:
        sys.exit(api.follow(name, namespace, kube=kube))


COMMANDS: list = [watch, status, list_command, logs, stop, delete, resume]
