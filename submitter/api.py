"""The Python API: what the CLI does, for notebooks and pipelines (Airflow, Kubeflow Pipelines).

    import submitter
    spec = submitter.JobSpec.build(name="gpt2-demo", replicas=8, gpu_per_pod=1)
    plan = submitter.render(spec)          # objects, str(plan) is YAML, plan.write_dir("out/")
    submitter.submit(spec)                 # preflight + apply
    for state in submitter.watch("gpt2-demo"):
        print(state.state, state.progress.step)

Every function raises the project's errors (`submitter.contract.errors`: `UsageError` for bad
input, `ClusterError` and its subclasses for the API server, `WatchTimeout`), never calls
`sys.exit`, and prints nothing. Thin wrappers over `submitter.cluster`, imported lazily, so
`import submitter` stays as light as `submitter render` (no kubernetes).
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, TextIO

from submitter.contract.spec import JobSpec

if TYPE_CHECKING:
    from submitter.kube import Kube
    from submitter.plan import Plan
    from submitter.state import JobState



def _namespace(namespace: str | None, context: str | None, kubeconfig: str | None) -> str:
    """`namespace`, else the kubeconfig context's (kubectl's rule, as the commands use it)."""
    if namespace is not None:
        return namespace
    from submitter.cli_options import default_namespace

    return default_namespace(context, kubeconfig)


def placed(spec: JobSpec, context: str | None = None, kubeconfig: str | None = None) -> JobSpec:
    """The spec `submit` applies: built without a namespace, it goes to the kubeconfig context's
    namespace, as `submitter submit` and kubectl do (`render` keeps JobSpec's `default`: GitOps
    output depends on its input alone). The rule: docs/gitops.md, "Which namespace"."""
    if "namespace" in spec.given():
        return spec
    namespace = _namespace(None, context, kubeconfig)
    return spec if namespace == spec.namespace else dataclasses.replace(spec, namespace=namespace)


def render(spec: JobSpec) -> "Plan":
    """The job's Kubernetes objects (a `Plan`: iterate it for the objects, `str(plan)` is the YAML
    stream, `plan.to_json()` a List, `plan.write_dir(path)` a kustomize directory). Pure."""
    from submitter.render import render as render_plan

    return render_plan(spec)


@dataclass(frozen=True)
class Submitted:
    """What `submit` did: the rendered plan, the report the CLI prints, and the exit code
    (with watch=True, the job's outcome as `submitter watch` gives it)."""

    name: str
    namespace: str
    plan: "Plan"
    report: str
    exit_code: int = 0


def submit(spec: JobSpec, *, dry_run: str = "none", context: str | None = None,
           kubeconfig: str | None = None, kube: "Kube | None" = None,
           request_timeout: float | None = None, watch: bool = False, output: str = "text",
           out: TextIO | None = None, err: TextIO | None = None) -> Submitted:
    """Preflight and apply the job (dry_run: "none", "client" or "server"); with watch=True,
    follow it to its end. What `submitter submit` runs: the report goes to `out`/`err` when
    given (the CLI's streams), else into `Submitted.report`. The plan is rendered once (a
    --script job's code is packed once, and a bucket bundle uploaded before the apply)."""
    return _apply(spec, None, dry_run=dry_run, context=context, kubeconfig=kubeconfig, kube=kube,
                  request_timeout=request_timeout, watch=watch, output=output, out=out, err=err)


def prepare(spec: JobSpec, *, dry_run: str = "none", context: str | None = None,
            kubeconfig: str | None = None, kube: "Kube | None" = None,
            request_timeout: float | None = None, watch: bool = False, output: str = "text",
            out: TextIO | None = None, err: TextIO | None = None,
            force: bool = False) -> Submitted:
    """`submitter data prepare`: the prepare job (`python -m training.prepare` on CPU workers,
    the same objects, ownership and storage as a training job) applied as `submit` applies a
    job; it writes the prepared corpus `<storage>/<namespace>/corpora/<name>` (`force`: every
    shard made again, whole or not)."""
    return _apply(spec, "prepare-force" if force else "prepare", dry_run=dry_run,
                  context=context, kubeconfig=kubeconfig, kube=kube, request_timeout=request_timeout, watch=watch, output=output,
                  out=out, err=err)


def _apply(spec: JobSpec, program: str | None, *, dry_run: str, context: str | None,
           kubeconfig: str | None, kube: "Kube | None", request_timeout: float | None,
           watch: bool, output: str, out: TextIO | None, err: TextIO | None) -> Submitted:
    from submitter.cluster import submit_job
    from submitter.render import render as render_plan

    spec = placed(spec, context, kubeconfig)
    plan = render_plan(spec, program)
    captured = io.StringIO() if out is None else None
    applied = plan
    if program is None:  # a training job: its estimate's guards first, then recorded on it (#38)
        from submitter.estimating import checked_estimate, price_carried, with_estimate

        est = checked_estimate(spec, local=False, kubeconfig=kubeconfig,
                               err=err or out or captured, show=dry_run != "none")
        priced = price_carried(spec, est)
        if priced is not spec:  # the run checks --max-cost at the price the guard used
            spec, plan = priced, render_plan(priced, program)
        applied = plan if dry_run == "client" else with_estimate(plan, est)  # GitOps: render's
    code = submit_job(spec, plan=applied, dry_run=dry_run, watch=watch, output=output,
                      context=context, kubeconfig=kubeconfig, kube=kube,
                      request_timeout=request_timeout, out=out or captured,
                      err=err or out or captured)
    return Submitted(spec.name, spec.namespace, plan,
                     captured.getvalue() if captured is not None else "", code)


def follow(name: str, namespace: str | None = None, *, output: str = "text",
           timeout: float | None = None, stall_timeout: float | None = None,
           context: str | None = None, kubeconfig: str | None = None,
           kube: "Kube | None" = None, out: TextIO | None = None,
           err: TextIO | None = None) -> int:
    """`submitter watch`: print the job's states and events (text or JSON lines) until it
    ends; returns the exit code (0 succeeded, 1 failed, 3 timeout, 4 unobservable, 5 stalled,
    130 Ctrl-C). `watch()` yields the same states as values."""
    from submitter.cluster import watch_job

    return watch_job(_kube(kube, context, kubeconfig), _namespace(namespace, context, kubeconfig),
                     name, output=output, timeout=timeout, stall_timeout=stall_timeout, out=out,
                     err=err)


def jobs(namespace: str | None = None, *, all_namespaces: bool = False,
         selector: str | None = None, states: tuple[str, ...] = (), context: str | None = None,
         kubeconfig: str | None = None, kube: "Kube | None" = None) -> list["JobState"]:
    """`submitter list`: every job submitter manages in the namespace (all with
    all_namespaces), optionally by label selector and state (e.g. "RUNNING")."""
    from submitter.cluster import list_jobs

    found = list_jobs(_kube(kube, context, kubeconfig),
                      None if all_namespaces else _namespace(namespace, context, kubeconfig),
                      selector=selector)
    wanted = {s.upper() for s in states}
    return [s for s in found if not wanted or s.state in wanted]


def _kube(kube: "Kube | None", context: str | None, kubeconfig: str | None) -> "Kube":
    if kube is not None:
        return kube
    from submitter.kube import Kube

    return Kube(context=context, kubeconfig=kubeconfig)


def status(name: str, namespace: str | None = None, *, context: str | None = None,
           kubeconfig: str | None = None, kube: "Kube | None" = None) -> "JobState":
    """The job's normalized state (`.state`, `.progress`, ...); NotFound when there is none."""
    from submitter.cluster import status as job_status

    return job_status(_kube(kube, context, kubeconfig), _namespace(namespace, context, kubeconfig), name)


def watch(name: str, namespace: str | None = None, *, timeout: float | None = None,
          context: str | None = None, kubeconfig: str | None = None,
          kube: "Kube | None" = None) -> Iterator["JobState"]:
    """Yield the job's state at every change (status or training event) until it is terminal;
    the last state yielded is the final one (`.terminal`, `.exit_code`). A failed job is a state,
    not an exception; `timeout` elapsing raises WatchTimeout (the job keeps running). Closing the
    generator early stops watching."""
    import queue
    import threading

    from submitter.cluster import job_names
    from submitter.watch import follow

    client = _kube(kube, context, kubeconfig)
    namespace = _namespace(namespace, context, kubeconfig)
    states: "queue.Queue[tuple[str, Any]]" = queue.Queue()
    sink = _QueueSink(states)

    def run() -> None:
        try:
            states.put(("final", follow(client, namespace, name, job_names(name, namespace)["progress"],
                                        sink, timeout=timeout, warn=lambda text: None)))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer's thread
            states.put(("error", e))

    threading.Thread(target=run, name=f"submitter-watch-{name}", daemon=True).start()
    last: Any = None
    try:
        while True:
            kind, value = states.get()
            if kind == "error":
                if isinstance(value, _Closed):
                    return
                raise value
            if kind == "final":
                if last is None or value != last:
                    yield value
                return
            if value != last:
                last = value
                yield value
    finally:
        sink.closed = True  # the watching thread stops at its next change (its streams close)


class _Closed(Exception):
    """Raised inside the watching thread once the generator was closed."""


class _QueueSink:
    """A watch sink that hands every state to the generator's thread."""

    def __init__(self, states: Any) -> None:
        self.states = states
        self.closed = False

    def status(self, state: "JobState") -> None:
        if self.closed:
            raise _Closed()
        self.states.put(("state", state))

    def event(self, event: dict[str, Any], state: "JobState") -> None:
        if self.closed:
            raise _Closed()
        self.states.put(("state", state))

    def done(self, state: "JobState") -> None:
        pass  # follow's return value is the final state


def _reported(operation: Any, kube: "Kube", namespace: str, name: str,
              out: "TextIO | None", **options: Any) -> str:
    """Run a lifecycle operation that reports as it goes: into `out` when given (the CLI
    streams to stdout), else into a string that is returned."""
    sink = out or io.StringIO()
    operation(kube, namespace, name, out=sink, **options)
    return "" if out else sink.getvalue()


def delete(name: str, namespace: str | None = None, *, delete_pvc: str | None = None,
           context: str | None = None, kubeconfig: str | None = None,
           kube: "Kube | None" = None, out: "TextIO | None" = None) -> str:
    """Delete the job's RayJob, RBAC and progress ConfigMap (the PVC only when named); returns
    the report (written to `out` as it happens instead, when given: the CLI)."""
    from submitter.lifecycle import delete_job

    return _reported(delete_job, _kube(kube, context, kubeconfig),
                     _namespace(namespace, context, kubeconfig), name, out, delete_pvc=delete_pvc)


def stop(name: str, namespace: str | None = None, *, context: str | None = None,
         kubeconfig: str | None = None, kube: "Kube | None" = None,
         out: "TextIO | None" = None) -> str:
    """Suspend a running job (KubeRay's `suspend`; `resume` continues it); returns the report
    (written to `out` instead, when given)."""
    from submitter.lifecycle import stop_job

    return _reported(stop_job, _kube(kube, context, kubeconfig),
                     _namespace(namespace, context, kubeconfig), name, out)


def resume(name: str, namespace: str | None = None, *, context: str | None = None,
           kubeconfig: str | None = None, kube: "Kube | None" = None,
           out: "TextIO | None" = None) -> str:
    """Continue a STOPPED, SUSPENDED or FAILED job (or one deleted with its PVC kept) from its
    last checkpoint, with the settings it was submitted with; returns the report (written to
    `out` instead, when given)."""
    from submitter.lifecycle import resume_job

    return _reported(resume_job, _kube(kube, context, kubeconfig),
                     _namespace(namespace, context, kubeconfig), name, out)


def report(name: str, *, storage_path: str | None = None, namespace: str | None = None,
           out_dir: str = ".", context: str | None = None, kubeconfig: str | None = None,
           kube: "Kube | None" = None) -> Any:
    """Write `<name>.png` and `<name>.html` (loss curves, tokens/s, restarts, checkpoints,
    settings) from a local run directory or the cluster job's progress ConfigMap."""
    from submitter import report as report_module

    if storage_path is not None:
        run = report_module.from_run_dir(storage_path, name, namespace)
    else:
        run = report_module.from_cluster(_kube(kube, context, kubeconfig),
                                         _namespace(namespace, context, kubeconfig), name)
    return report_module.write(run, out_dir)
