"""The cluster side of a job: submit (preflight + apply), status, list, logs, delete, resume.

I/O at the edges: every API call goes through `submitter.kube.Kube`; what to do with the answers
(drift detection, what to delete, what a resumed RayJob looks like) is decided by the pure
functions at the bottom, which the tests exercise directly too.
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator, TextIO

from submitter.contract.errors import ClusterError, Conflict, CrdMissing, Forbidden, NotFound, Preflight
from submitter.kube import KUBERAY_INSTALL, Kube
from submitter.observe import explain
from submitter.plan import Plan, to_yaml
from submitter.contract import naming
from submitter.render import render
from submitter.contract.spec import JobSpec
from submitter.state import JobState, job_state, join

#: Annotations on a resumed RayJob: which attempt it is and how the previous ones ended.
ATTEMPT_ANNOTATION = "submitter.dev/attempt"
PREVIOUS_ANNOTATION = "submitter.dev/previous-attempts"
JOB_LABEL = naming.JOB_LABEL


def job_names(name: str, namespace: str) -> dict[str, str]:
    """The object names of a job, from the same function render uses (name validated)."""
    spec = JobSpec.build(name=name, namespace=namespace)
    return naming.object_names(spec.name)


# --- submit -----------------------------------------------------------------------------------

@dataclass
class ApplyReport:
    """What an apply did, object by object, so a partial failure never leaves users guessing."""

    done: list[tuple[str, str]] = field(default_factory=list)  # (kind/name, created|configured|unchanged)
    pending: list[str] = field(default_factory=list)

    def summary(self) -> str:
        done = ", ".join(f"{ref} {what}" for ref, what in self.done) or "nothing"
        return f"applied: {done}; not applied: {', '.join(self.pending) or 'nothing'}"


def submit_job(spec: JobSpec, *, dry_run: str = "none", watch: bool = False, output: str = "text",
               context: str | None = None, kubeconfig: str | None = None, kube: Kube | None = None,
               out: TextIO | None = None, err: TextIO | None = None) -> int:
    """`submitter submit` against a cluster. Returns the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    plan = render(spec)  # the storage policy refuses before anything touches the cluster
    if dry_run == "client":
        _print_objects(list(plan), "json" if output == "json" else "yaml", out)
        return 0
    kube = kube or Kube(context=context, kubeconfig=kubeconfig)
    live = preflight(kube, spec)
    n = naming.object_names(spec.name, spec.existing_pvc)
    if live is not None:
        refuse_drift(plan.get("RayJob") or {}, live, spec.namespace)
    report, applied = apply(kube, plan, dry_run=dry_run == "server")
    if output in ("json", "yaml"):
        _print_objects(applied, output, out, compact=watch)  # with --watch: JSON lines follow
    else:
        suffix = " (server dry run)" if dry_run == "server" else ""
        for ref, what in report.done:
            out.write(f"{ref} {what}{suffix}\n")
        if dry_run != "server":
            state = job_state(live, None, name=spec.name, namespace=spec.namespace) if live else None
            if state is not None and state.terminal:
                out.write(f"{spec.name} already finished ({state.state}); nothing was re-run. To "
                          f"continue from its last checkpoint: submitter resume {spec.name} -n {spec.namespace}\n")
            out.write(next_steps(spec.name, spec.namespace, n["pvc"] if plan.get("PersistentVolumeClaim")
                                 or spec.existing_pvc else None))
        else:
            err.write(f"server dry run: {len(report.done)} objects validated by the API server; "
                      "nothing changed\n")
    if watch and dry_run == "none":
        return watch_job(kube, spec.namespace, spec.name, output=output, out=out, err=err)
    return 0


def watch_job(kube: Kube, namespace: str, name: str, *, output: str = "text", timeout: float | None = None,
              out: TextIO | None = None, err: TextIO | None = None, stall_timeout: float | None = None) -> int:
    """Watch to the end: 0 succeeded; JobFailed (1) failed/stopped; WatchTimeout (3); Ctrl-C 130.
    Neither a timeout nor Ctrl-C touches the job."""
    from submitter.watch import follow, make_sink

    err = err or sys.stderr
    try:
        final = follow(kube, namespace, name, job_names(name, namespace)["progress"],
                       make_sink(output, out), timeout=timeout, warn=lambda text: err.write(text + "\n"),
                       stall_timeout=stall_timeout)
    except KeyboardInterrupt:
        err.write(f"\nstopped watching; {name} keeps running (submitter delete {name} -n {namespace} "
                  "stops it)\n")
        return 130
    return outcome(final)


def next_steps(name: str, namespace: str, pvc: str | None) -> str:
    ns = f" -n {namespace}"
    lines = ["", "next:", f"  submitter watch {name}{ns}       # live progress; exit code = outcome",
             f"  submitter logs {name}{ns} -f      # driver output",
             f"  submitter status {name}{ns}",
             f"  submitter delete {name}{ns}       # keeps the checkpoints"
             + (f" (PVC {pvc})" if pvc else "")]
    return "\n".join(lines) + "\n"


def preflight(kube: Kube, spec: JobSpec) -> dict | None:
    """Checks before any write. Returns the live RayJob of this name, if there is one."""
    resources = kube.api_resources("ray.io/v1")
    if resources is None or "rayjobs" not in resources:
        raise CrdMissing(f"the RayJob CRD (rayjobs.ray.io) is not installed on {kube.host}; {KUBERAY_INSTALL}")
    try:
        if kube.find("Namespace", None, spec.namespace) is None:
            raise Preflight(f"namespace {spec.namespace} does not exist; create it (kubectl create "
                            f"namespace {spec.namespace}) or pick another with -n")
    except Forbidden:
        pass  # may not read namespaces (cluster-scoped); the apply will say if it is missing
    if spec.existing_pvc:
        pvc = kube.find("PersistentVolumeClaim", spec.namespace, spec.existing_pvc)
        if pvc is None:
            raise Preflight(f"--existing-pvc {spec.existing_pvc} does not exist in namespace "
                            f"{spec.namespace}; create a ReadWriteMany PVC first or leave the flag "
                            "out to let submitter create one")
        modes = (pvc.get("spec") or {}).get("accessModes") or []
        if "ReadWriteMany" not in modes:
            raise Preflight(f"--existing-pvc {spec.existing_pvc} is {'/'.join(modes) or 'without access modes'}, "
                            "not ReadWriteMany: the Ray head and every worker must write checkpoints "
                            "to it at once; use a ReadWriteMany PVC (NFS, EFS, Filestore, CephFS)")
    return kube.find("RayJob", spec.namespace, spec.name)


def refuse_drift(wanted: dict, live: dict, namespace: str) -> None:
    """A RayJob that exists with another spec is never changed under a running job."""
    diffs = list(differences(wanted.get("spec") or {}, live.get("spec") or {}, "spec"))
    if not diffs:
        return
    name = live["metadata"]["name"]
    state = job_state(live, None, name=name, namespace=namespace)
    shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
    way_out = (f"submitter resume {name} -n {namespace} continues the finished run with its stored spec"
               if state.terminal else f"wait for it (submitter watch {name} -n {namespace})")
    raise Conflict(f"RayJob {name} already exists ({state.state}) with a different spec ({shown}); "
                   f"nothing was changed. Use another --name, or submitter delete {name} -n {namespace} "
                   f"first (checkpoints are kept), or {way_out}")


def differences(wanted: Any, live: Any, path: str) -> Iterator[str]:
    """Paths where `wanted` is not contained in `live` (fields the server added are fine)."""
    if isinstance(wanted, dict) and isinstance(live, dict):
        for key, value in wanted.items():
            yield from differences(value, live.get(key), f"{path}.{key}")
    elif isinstance(wanted, list) and isinstance(live, list) and len(wanted) == len(live):
        for i, (w, v) in enumerate(zip(wanted, live)):
            yield from differences(w, v, f"{path}[{i}]")
    elif wanted != live:
        if isinstance(wanted, str) and isinstance(live, str):
            start = next((i for i, (a, b) in enumerate(zip(wanted, live)) if a != b),
                         min(len(wanted), len(live)))
            wanted, live = wanted[max(0, start - 10):], live[max(0, start - 10):]
        yield f"{path}: {_short(live)} -> {_short(wanted)}"


def apply(kube: Kube, plan: Plan | list[dict], *, dry_run: bool = False) -> tuple[ApplyReport, list[dict]]:
    """Server-side apply every object in order; on failure say what was applied and what not."""
    objects = list(plan)
    report = ApplyReport(pending=[_ref(o) for o in objects])
    applied = []
    for obj in objects:
        ref = _ref(obj)
        try:
            before = kube.find(obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
            result, created = kube.apply(obj, dry_run=dry_run)
        except ClusterError as e:
            if not report.done:
                raise
            raise type(e)(f"{e} — {report.summary()}") from e
        if created:
            what = "created"
        elif before is not None and _version(before) == _version(result):
            what = "unchanged"
        else:
            what = "configured"
        report.done.append((ref, what))
        report.pending.remove(ref)
        applied.append(result)
    return report, applied


# --- status / list / logs -------------------------------------------------------------------------

def existing_rayjob(kube: Kube, namespace: str, name: str) -> dict:
    """The live RayJob, or NotFound pointing at `submitter list`."""
    rayjob = kube.find("RayJob", namespace, name)
    if rayjob is None:
        raise NotFound(f"no RayJob {name} in namespace {namespace}; see submitter list -n {namespace}")
    return rayjob


def status(kube: Kube, namespace: str, name: str) -> JobState:
    rayjob = existing_rayjob(kube, namespace, name)
    configmap = kube.find("ConfigMap", namespace, job_names(name, namespace)["progress"])
    return explain(kube, job_state(rayjob, configmap, name=name, namespace=namespace), configmap)


def list_jobs(kube: Kube, namespace: str | None, *, selector: str | None = None) -> list[JobState]:
    """Every submitter RayJob (two list requests, joined locally); `selector`: `list -l`."""
    managed = {"app.kubernetes.io/managed-by": "submitter"}
    rayjobs = kube.list("RayJob", namespace, labels=managed, selector=selector).get("items") or []
    configmaps = kube.list("ConfigMap", namespace, labels=managed).get("items") or []
    return join(rayjobs, configmaps, lambda job: job_names(job, "default")["progress"])


def submitter_pod(kube: Kube, namespace: str, name: str) -> str:
    """The newest pod of the submitter Job KubeRay K8sJobMode creates (named after the RayJob)."""
    pods = kube.list("Pod", namespace, labels={"batch.kubernetes.io/job-name": name}).get("items") or \
        kube.list("Pod", namespace, labels={"job-name": name}).get("items") or []  # before 1.27
    if not pods:
        rayjob = existing_rayjob(kube, namespace, name)
        state = job_state(rayjob, None, name=name, namespace=namespace)
        raise NotFound(f"{name} has no submitter pod yet ({state.state}); the driver starts once the "
                       f"Ray cluster is up: submitter watch {name} -n {namespace}")
    newest = max(pods, key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
    return newest["metadata"]["name"]


def logs(kube: Kube, namespace: str, name: str, *, follow: bool, out: TextIO) -> int:
    pod = submitter_pod(kube, namespace, name)
    for line in kube.log_lines(namespace, pod, follow=follow):
        out.write(line + "\n")
        out.flush()
    return 0


# --- delete -----------------------------------------------------------------------------------

def delete_job(kube: Kube, namespace: str, name: str, *, delete_pvc: str | None = None,
               out: TextIO) -> int:
    """Delete the RayJob and its RBAC/ConfigMap. The PVC only when named, and only ours."""
    n = job_names(name, namespace)
    rayjob = kube.find("RayJob", namespace, name)
    pvc_name = claim_name(rayjob) if rayjob else None
    if delete_pvc is not None:
        pvc = kube.find("PersistentVolumeClaim", namespace, delete_pvc)
        check_pvc_deletable(pvc, delete_pvc, name, namespace)
    targets = [("RayJob", name), ("NetworkPolicy", name), ("RoleBinding", n["progress"]),
               ("Role", n["progress"]),
               ("ServiceAccount", n["progress"]), ("ConfigMap", n["progress"])]
    if delete_pvc is not None:
        targets.append(("PersistentVolumeClaim", delete_pvc))
    deleted = [f"{kind.lower()}/{obj}" for kind, obj in targets if kube.delete(kind, namespace, obj)]
    if not deleted:
        raise NotFound(f"nothing to delete: no RayJob {name} or its objects in namespace {namespace}")
    out.write("deleted " + ", ".join(deleted) + "\n")
    kept = pvc_name or n["pvc"]
    if delete_pvc is None and kube.find("PersistentVolumeClaim", namespace, kept) is not None:
        out.write(f"kept persistentvolumeclaim/{kept} (checkpoints); to delete it too: "
                  f"submitter delete {name} -n {namespace} --delete-pvc {kept}\n")
    return 0


def check_pvc_deletable(pvc: dict | None, pvc_name: str, job: str, namespace: str) -> None:
    if pvc is None:
        raise Preflight(f"--delete-pvc {pvc_name}: no such PVC in namespace {namespace}; nothing deleted")
    owner = ((pvc.get("metadata") or {}).get("labels") or {}).get(JOB_LABEL)
    if owner != job:
        raise Preflight(f"--delete-pvc {pvc_name}: that PVC was not created by submitter for job {job} "
                        f"(label {JOB_LABEL}={owner or 'absent'}); nothing deleted. Delete it with kubectl "
                        "if you really mean to")


def claim_name(rayjob: dict) -> str | None:
    """The checkpoint PVC a RayJob mounts (from its head pod template)."""
    spec = ((rayjob.get("spec") or {}).get("rayClusterSpec") or {}).get("headGroupSpec") or {}
    for volume in ((spec.get("template") or {}).get("spec") or {}).get("volumes") or []:
        claim = volume.get("persistentVolumeClaim")
        if claim:
            return claim.get("claimName")
    return None


# --- resume -----------------------------------------------------------------------------------

def resume_job(kube: Kube, namespace: str, name: str, *, out: TextIO, wait_seconds: float = 120) -> int:
    """A new attempt of a finished RayJob: same name, spec, run name and storage.

    KubeRay never re-runs a finished RayJob, and the new attempt needs the name (the Ray Train
    run name and checkpoint directory derive from it), so the old object must go first: it is
    deleted in the foreground (its RayCluster and submitter Job go with it), we wait until it is
    gone, then apply the same spec with an attempt counter and the old outcome in annotations.
    The PVC and the progress ConfigMap are not touched: Ray Train resumes from the last
    checkpoint on the PVC, and progress continues where it was.
    """
    old = kube.find("RayJob", namespace, name)
    if old is None:
        raise NotFound(f"no RayJob {name} in namespace {namespace} to resume; submit it again with the "
                       "same --name and storage settings: training continues from its last checkpoint")
    state = job_state(old, None, name=name, namespace=namespace)
    if not state.terminal:
        raise Conflict(f"{name} is {state.state}, not finished; resume is for a FAILED or STOPPED job. "
                       f"Watch it (submitter watch {name} -n {namespace}) or stop it first "
                       f"(submitter delete {name} -n {namespace})")
    if state.state == "SUCCEEDED":
        raise Conflict(f"{name} SUCCEEDED; there is nothing to resume. To train further, submit a new "
                       f"job (e.g. more --epochs) with another --name and the same storage")
    new = resumed_rayjob(old)
    kube.delete("RayJob", namespace, name, uid=old["metadata"].get("uid"), propagation="Foreground")
    wait_deleted(kube, namespace, name, wait_seconds)
    kube.apply(new)
    attempt = new["metadata"]["annotations"][ATTEMPT_ANNOTATION]
    out.write(f"rayjob/{name} resumed as attempt {attempt} (previous: {state.state}); the run "
              f"continues from its last checkpoint\n")
    out.write(next_steps(name, namespace, claim_name(new)))
    return 0


def resumed_rayjob(old: dict) -> dict:
    """The next attempt of a finished RayJob (pure): same spec; status and server fields dropped."""
    meta = old["metadata"]
    annotations = dict(meta.get("annotations") or {})
    attempt = int(annotations.get(ATTEMPT_ANNOTATION, "1")) + 1
    status = old.get("status") or {}
    previous = json.loads(annotations.get(PREVIOUS_ANNOTATION, "[]"))
    previous.append({k: status.get(k) for k in ("jobStatus", "jobDeploymentStatus", "reason", "endTime")
                     if status.get(k)})
    annotations[ATTEMPT_ANNOTATION] = str(attempt)
    annotations[PREVIOUS_ANNOTATION] = json.dumps(previous, separators=(",", ":"))
    spec = copy.deepcopy(old.get("spec") or {})
    spec.pop("jobId", None)  # a fixed submission id would collide with the previous attempt's
    spec["suspend"] = False
    return {"apiVersion": old.get("apiVersion", "ray.io/v1"), "kind": "RayJob",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                         "labels": dict(meta.get("labels") or {}), "annotations": annotations},
            "spec": spec}


def wait_deleted(kube: Kube, namespace: str, name: str, seconds: float) -> None:
    """Block until the RayJob is gone (watch, not polling)."""
    import queue as _queue

    from submitter.watch import Follower

    current = kube.find("RayJob", namespace, name)
    if current is None:
        return
    events: "_queue.Queue[tuple[str, Any]]" = _queue.Queue()
    follower = Follower(kube, "RayJob", namespace, name, current["metadata"].get("resourceVersion"), events)
    follower.start()
    try:
        while True:
            try:
                source, event = events.get(timeout=seconds)
            except _queue.Empty:
                raise ClusterError(f"rayjob/{name} was not deleted within {seconds:g}s (finalizers?); "
                                   "nothing new was created; run resume again once it is gone") from None
            if source == "error":
                raise event
            if event.get("type") == "DELETED":
                return
    finally:
        follower.stop()


# --- helpers ----------------------------------------------------------------------------------

def _print_objects(objects: list[dict], output: str, out: TextIO, compact: bool = False) -> None:
    if output == "json":
        out.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects},
                             indent=None if compact else 2) + "\n")
    else:
        out.write(to_yaml(objects))


def outcome(state: JobState) -> int:
    from submitter.contract.errors import JobFailed

    if state.exit_code:
        detail = ", ".join(x for x in (state.reason, state.message, state.note) if x)
        raise JobFailed(f"{state.name} ended {state.state}{': ' + detail if detail else ''}")
    return 0


def _ref(obj: dict) -> str:
    return f"{obj['kind'].lower()}/{obj['metadata']['name']}"


def _version(obj: dict) -> str | None:
    return (obj.get("metadata") or {}).get("resourceVersion")


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

