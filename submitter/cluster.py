"""The cluster side of a job: submit (preflight, server dry run, create), status, list, logs.
Stop, delete and resume live in `submitter.lifecycle`; whose object is what, in `submitter.ownership`.

I/O at the edges: every API call goes through `submitter.kube.Kube`; what to do with the answers
(drift detection, what to delete, what a resumed RayJob looks like) is decided by the pure
functions at the bottom, which the tests exercise directly too.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator, TextIO

from submitter.contract.errors import ClusterError, Conflict, CrdMissing, Forbidden, NotFound, Preflight
from submitter.kube import KUBERAY_AUTH_VERSION, KUBERAY_INSTALL, Kube
from submitter.observe import explain
from submitter.ownership import not_ours, owned_objects
from submitter.plan import Plan, to_yaml
from submitter.contract import naming
from submitter.render import render
from submitter.contract.spec import JobSpec
from submitter.state import JobState, job_state, join, progress_from_configmap

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


def submit_job(spec: JobSpec, *, plan: Plan | None = None, dry_run: str = "none",
               watch: bool = False, output: str = "text",
               context: str | None = None, kubeconfig: str | None = None, kube: Kube | None = None,
               request_timeout: float | None = None, out: TextIO | None = None,
               err: TextIO | None = None) -> int:
    """`submitter submit` against a cluster. Returns the exit code.

    Order: render (the storage policy), preflight reads (CRD, namespace, --existing-pvc, and
    that no object of a derived name belongs to someone else), a server dry run of every
    object, and only then the writes: a rejection at any step leaves nothing behind."""
    out, err = out or sys.stdout, err or sys.stderr
    if plan is None:  # api.submit passes the plan it rendered: one render per submit
        plan = render(spec)  # the storage policy refuses before anything touches the cluster
    note = default_image_note(spec)
    if dry_run == "client":
        if note:
            err.write(note + "\n")
        _print_objects(list(plan), "json" if output == "json" else "yaml", out)
        return 0
    kube = kube or Kube(context=context, kubeconfig=kubeconfig, request_timeout=request_timeout)
    objects = owned_objects(plan, spec)
    live = preflight(kube, spec, objects)
    n = naming.object_names(spec.name, spec.existing_pvc)
    rayjob = live.get(f"rayjob/{spec.name}")
    if rayjob is not None:
        refuse_drift(plan.get("RayJob") or {}, rayjob, spec.namespace)
    if dry_run == "none":  # a --script job's large code bundle goes to the run's bucket first
        from submitter.code_plan import code_plan, upload

        code = code_plan(spec)
        line = upload(code) if code is not None else None
        if line:
            err.write(line + "\n")
    report, applied = install(kube, objects, live, dry_run_only=dry_run == "server")
    if note:  # once it applied: a refusal or a failure stays one line
        err.write(note + "\n")
    if output in ("json", "yaml"):
        _print_objects(applied, output, out, compact=watch)  # with --watch: JSON lines follow
    else:
        suffix = " (server dry run)" if dry_run == "server" else ""
        for ref, what in report.done:
            out.write(f"{ref} {what}{suffix}\n")
        if dry_run != "server":
            state = job_state(rayjob, None, name=spec.name, namespace=spec.namespace) if rayjob else None
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


def default_image_note(spec: JobSpec) -> str | None:
    """The line `submit` prints when the job runs the project's default image (no --image):
    which one, and how to run your own. The default exists only once the release workflow has
    pushed that version; a cluster that cannot pull it leaves the pods in ErrImagePull."""
    if spec.image is not None:
        return None
    return (f"image: {spec.resolved_image} (the project's default, pushed by its release "
            "workflow); to run your own build, push it and pass --image REGISTRY/NAME:TAG")


def watch_job(kube: Kube, namespace: str, name: str, *, output: str = "text", timeout: float | None = None,
              out: TextIO | None = None, err: TextIO | None = None, stall_timeout: float | None = None) -> int:
    """Watch to the end: 0 succeeded; JobFailed (1) failed/stopped; WatchTimeout (3);
    Unobservable (4) the API could not be asked; StallTimeout (5); Ctrl-C 130. Nothing here
    touches the job."""
    from submitter.watch import follow, make_sink

    err = err or sys.stderr
    try:
        final = follow(kube, namespace, name, job_names(name, namespace)["progress"],
                       make_sink(output, out), timeout=timeout, warn=lambda text: err.write(text + "\n"),
                       stall_timeout=stall_timeout)
    except KeyboardInterrupt:
        err.write(f"\nstopped watching; {name} keeps running (submitter stop {name} -n {namespace} "
                  "stops it)\n")
        return 130
    if final.state == "SUCCEEDED" and final.note:
        err.write(f"{name}: {final.note}\n")
    if final.exit_code and final.progress.error is None:
        final = with_latest_progress(kube, final)
    return outcome(final)


def with_latest_progress(kube: Kube, state: JobState) -> JobState:
    """The state with the progress ConfigMap read once more: the RayJob's end and the run's
    last event (run_failed, with the error) come through two watches, in no set order."""
    from dataclasses import replace

    try:
        configmap = kube.find("ConfigMap", state.namespace, job_names(state.name, state.namespace)["progress"])
    except ClusterError:
        return state  # best effort: the failure is reported either way
    return replace(state, progress=progress_from_configmap(configmap)) if configmap else state


def next_steps(name: str, namespace: str, pvc: str | None) -> str:
    ns = f" -n {namespace}"
    lines = ["", "next:", f"  submitter watch {name}{ns}       # live progress; exit code = outcome",
             f"  submitter logs {name}{ns} -f      # driver output",
             f"  submitter status {name}{ns}",
             f"  submitter stop {name}{ns}        # suspend; submitter resume continues it",
             f"  submitter delete {name}{ns}       # keeps the checkpoints"
             + (f" (PVC {pvc})" if pvc else "")]
    return "\n".join(lines) + "\n"


def preflight(kube: Kube, spec: JobSpec, objects: list[dict] | None = None) -> dict[str, dict | None]:
    """Checks before any write. Returns every planned object's live version (None: absent),
    keyed `kind/name`; raises Preflight when one exists that is not this job's."""
    resources = kube.api_resources("ray.io/v1")
    if resources is None or "rayjobs" not in resources:
        raise CrdMissing(f"the RayJob CRD (rayjobs.ray.io) is not installed on {kube.host}; {KUBERAY_INSTALL}")
    check_crd(kube, spec)
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
    if objects is None:
        objects = owned_objects(render(spec), spec)
    live: dict[str, dict | None] = {}
    foreign: list[tuple[str, str, dict]] = []
    going: list[str] = []
    for obj in objects:
        ref = _ref(obj)
        found = kube.find(obj["kind"], spec.namespace, obj["metadata"]["name"])
        live[ref] = found
        if found is not None:
            why = not_ours(found, spec.namespace, spec.name)
            if why:
                foreign.append((ref, why, obj))
            elif (found.get("metadata") or {}).get("deletionTimestamp"):
                going.append(_being_deleted(ref, found))
    if foreign:
        refuse_foreign(foreign, spec)
    if going:
        # an object on its way out (a PVC a pod still holds, a RayJob the operator is still
        # cleaning up) would be "updated" and then vanish under the new job, or, worse, a
        # deleted run's checkpoints would be trained on: wait for it instead
        raise Conflict(f"{'; '.join(going)}: wait until it is gone (submitter list shows it), or "
                       f"submit under another --name; nothing was written")
    return live


def _being_deleted(ref: str, obj: dict) -> str:
    finalizers = ", ".join((obj.get("metadata") or {}).get("finalizers") or []) or "none"
    return f"{ref} is being deleted (finalizers: {finalizers})"


def check_crd(kube: Kube, spec: JobSpec) -> None:
    """Token auth asked for (--ray-auth token, the default) on a KubeRay whose RayJob CRD has
    no `rayClusterSpec.authOptions` (before 1.5.1): refuse before the first write. Without this
    the API server would prune the unknown field and the dashboard would listen on 0.0.0.0
    without a token. Who may not read CRDs (they are cluster-scoped) still gets a refusal:
    every write asks for `fieldValidation=Strict`, and the server dry run fails on the field."""
    if spec.ray_auth != "token":
        return
    try:
        crd = kube.find("CustomResourceDefinition", None, "rayjobs.ray.io")
    except Forbidden:
        return
    if crd is None or crd_has_auth_options(crd):
        return
    raise Preflight(f"the RayJob CRD installed on {kube.host} has no rayClusterSpec.authOptions: Ray "
                    f"token authentication needs KubeRay >= {KUBERAY_AUTH_VERSION}, and an older operator "
                    "would leave the dashboard open without a token. Upgrade the KubeRay operator and "
                    "its CRDs (helm upgrade leaves CRDs as they were: kubectl apply --server-side the "
                    "new ones), or pass --ray-auth disabled to run without token auth; nothing was written")


def crd_has_auth_options(crd: dict) -> bool:
    """Does the RayJob CRD's served v1 schema know `spec.rayClusterSpec.authOptions`? (pure)"""
    for version in (crd.get("spec") or {}).get("versions") or []:
        if version.get("name") != "v1":
            continue
        node = ((version.get("schema") or {}).get("openAPIV3Schema") or {})
        for key in ("spec", "rayClusterSpec"):
            node = (node.get("properties") or {}).get(key) or {}
        if node.get("x-kubernetes-preserve-unknown-fields"):
            return True
        return "authOptions" in (node.get("properties") or {})
    return False


def refuse_foreign(foreign: list[tuple[str, str, dict]], spec: JobSpec) -> None:
    """One line: which objects are someone else's, and the two ways out."""
    refs = [ref for ref, _, _ in foreign]
    shown = " and ".join([", ".join(refs[:-1]), refs[-1]] if len(refs) > 1 else refs)
    verb = "exist" if len(refs) > 1 else "exists"
    fixes = [f"use another --name (object names derive from it: {spec.name}-checkpoints, "
             f"{spec.name}-progress)"]
    pvc = next((obj["metadata"]["name"] for _, _, obj in foreign if obj["kind"] == "PersistentVolumeClaim"), None)
    if pvc:
        fixes.append(f"--existing-pvc {pvc} if you mean to train on that PVC")
    raise Preflight(f"{shown} already {verb} in namespace {spec.namespace} and "
                    f"{'are' if len(refs) > 1 else 'is'} not job {spec.name}'s: {foreign[0][1]}; "
                    f"submitter never adopts or changes another's objects, nothing was changed. "
                    f"Fix: {', or '.join(fixes)}")


def refuse_drift(wanted: dict, live: dict, namespace: str) -> None:
    """A RayJob that exists with another spec is never changed under a running job."""
    queued = KUEUE_QUEUE_LABEL in ((live.get("metadata") or {}).get("labels") or {})
    diffs = [d for d in differences(wanted.get("spec") or {}, live.get("spec") or {}, "spec")
             if not owned_by_others(d.split(":", 1)[0], queued=queued)]
    if not diffs:
        return
    name = live["metadata"]["name"]
    state = job_state(live, None, name=name, namespace=namespace)
    shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
    if state.state == "SUCCEEDED":  # the run is complete: the pod refuses to re-run it as is
        way_out = "to train it further, delete it and submit again with more --epochs"
    elif state.terminal:
        way_out = f"submitter resume {name} -n {namespace} continues the run with its stored spec"
    else:
        way_out = f"wait for it (submitter watch {name} -n {namespace})"
    raise Conflict(f"RayJob {name} already exists ({state.state}) with a different spec ({shown}); "
                   f"nothing was changed. Use another --name, or submitter delete {name} -n {namespace} "
                   f"first (checkpoints are kept), or {way_out}")


#: Kueue's label naming the LocalQueue (render.KUEUE_QUEUE_LABEL).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: Lists others may append to: Kueue adds a ResourceFlavor's tolerations to the pod templates
#: of an admitted job (as it merges its nodeSelector keys, which containment already allows).
_APPENDED_LISTS = ("tolerations",)
_SUSPEND = re.compile(r"spec\.suspend")
_GROUP_REPLICAS = re.compile(r"spec\.rayClusterSpec\.workerGroupSpecs\[\d+\]\.replicas")


def owned_by_others(path: str, *, queued: bool) -> bool:
    """A RayJob field that Kueue or submitter's own lifecycle sets, not the job's spec: a
    re-submit of the same flags must say "unchanged" whatever they did to it. `spec.suspend`
    (Kueue admits by unsuspending, `submitter stop` suspends); under a queue, a worker group's
    `replicas` (Kueue's partial admission and workload slices set it; min and max still count)."""
    if _SUSPEND.fullmatch(path):
        return True
    return queued and bool(_GROUP_REPLICAS.fullmatch(path))


def differences(wanted: Any, live: Any, path: str) -> Iterator[str]:
    """Paths where `wanted` is not contained in `live` (fields the server added are fine, and
    items others appended to a pod template's tolerations)."""
    if isinstance(wanted, dict) and isinstance(live, dict):
        for key, value in wanted.items():
            yield from differences(value, live.get(key), f"{path}.{key}")
    elif isinstance(wanted, list) and isinstance(live, list) and path.rsplit(".", 1)[-1] in _APPENDED_LISTS:
        for i, item in enumerate(wanted):
            if item not in live:
                yield f"{path}[{i}]: absent -> {_short(item)}"
    elif isinstance(wanted, list) and isinstance(live, list) and len(wanted) == len(live):
        for i, (w, v) in enumerate(zip(wanted, live)):
            yield from differences(w, v, f"{path}[{i}]")
    elif wanted != live:
        if isinstance(wanted, str) and isinstance(live, str):
            start = next((i for i, (a, b) in enumerate(zip(wanted, live)) if a != b),
                         min(len(wanted), len(live)))
            wanted, live = wanted[max(0, start - 10):], live[max(0, start - 10):]
        yield f"{path}: {_short(live)} -> {_short(wanted)}"


# --- writing ----------------------------------------------------------------------------------

def install(kube: Kube, objects: list[dict], live: dict[str, dict | None], *,
            dry_run_only: bool = False) -> tuple[ApplyReport, list[dict]]:
    """Write the objects, after a server dry run of every one of them.

    An absent object is created (POST: never overwrites what appeared meanwhile); one of ours
    is server-side applied; an existing RayJob is left as it is (the caller refused a changed
    spec; KubeRay would not re-run it anyway). The dry run goes first so an API rejection of
    the last object (CRD schema, admission webhook, quota) leaves nothing behind."""
    dry = ApplyReport(pending=[_ref(o) for o in objects])
    dry_results = []
    for obj in objects:
        try:
            result, what = _write(kube, obj, live.get(_ref(obj)), dry_run=True)
        except NotFound as e:
            if not _binds_a_planned_role(obj, objects, live):
                raise type(e)(f"{e} (server dry run; nothing was written)") from e
            result, what = obj, "created"  # its Role is not there yet, see below
        except ClusterError as e:
            raise type(e)(f"{e}{kueue_hint(str(e))} (server dry run; nothing was written)") from e
        dry.done.append((_ref(obj), what))
        dry.pending.remove(_ref(obj))
        dry_results.append(result)
    if dry_run_only:
        return dry, dry_results
    report = ApplyReport(pending=[_ref(o) for o in objects])
    applied = []
    for obj in objects:
        ref = _ref(obj)
        try:
            result, what = _write(kube, obj, live.get(ref), dry_run=False)
        except ClusterError as e:
            if not report.done:
                raise
            raise type(e)(f"{e} — {report.summary()}") from e
        report.done.append((ref, what))
        report.pending.remove(ref)
        applied.append(result)
    return report, applied


def kueue_hint(message: str) -> str:
    """What to do when Kueue's webhook refuses a queued elastic job (the feature gate is off)."""
    if "workload slicing" not in message:
        return ""
    return ("; an elastic --replicas MIN:MAX under --queue needs Kueue >= 0.13 with the feature gate "
            "ElasticJobsViaWorkloadSlices=true (the RayJob carries kueue.x-k8s.io/elastic-job: "
            "\"true\"); or use a fixed --replicas N")


def _binds_a_planned_role(obj: dict, objects: list[dict], live: dict[str, dict | None]) -> bool:
    """A dry run persists nothing, so for a user without the `bind` verb (a namespace admin)
    the API server answers a new RoleBinding's dry run with 404: it resolves the Role to check
    for escalation, and the Role is only being created. That Role passed its own dry run."""
    ref = obj.get("roleRef") or {}
    return obj["kind"] == "RoleBinding" and any(
        o["kind"] == ref.get("kind") == "Role" and o["metadata"]["name"] == ref.get("name")
        and live.get(_ref(o)) is None for o in objects)


def _write(kube: Kube, obj: dict, before: dict | None, *, dry_run: bool) -> tuple[dict, str]:
    meta = obj["metadata"]
    namespace, name = meta.get("namespace"), meta["name"]
    if before is None:
        try:
            return kube.create(obj, dry_run=dry_run), "created"
        except Conflict:
            # 409: it appeared since preflight, or our own create landed and was retried.
            current = kube.find(obj["kind"], namespace, name)
            if current is None:
                raise
            owner = (meta.get("labels") or {}).get(JOB_LABEL, "")
            why = not_ours(current, namespace or "", owner)
            if why:
                raise Conflict(f"{_ref(obj)} was created by someone else while submitting ({why}); "
                               "nothing of theirs was changed") from None
            if obj["kind"] == "RayJob":
                refuse_drift(obj, current, namespace or "")
            return current, "unchanged"
    if obj["kind"] == "RayJob":
        return before, "unchanged"
    result, created = kube.apply(obj, dry_run=dry_run)
    if created:
        return result, "created"
    return result, "unchanged" if _version(before) == _version(result) else "configured"


def apply(kube: Kube, plan: Plan | list[dict], *, dry_run: bool = False) -> tuple[ApplyReport, list[dict]]:
    """Install objects without the ownership preflight (tests and tools that made them)."""
    objects = list(plan)
    live = {_ref(o): kube.find(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
            for o in objects}
    return install(kube, objects, live, dry_run_only=dry_run)


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
        # KubeRay's message ends with the driver's last logs, whose order Ray's log shipping
        # decides (a late "Connected to Ray cluster" line): the run's own error goes last
        error = state.progress.error
        last = f"\n{state.name}: {error}" if error and detail.rstrip().splitlines()[-1:] != [error] else ""
        raise JobFailed(f"{state.name} ended {state.state}{': ' + detail if detail else ''}{last}")
    return 0


def _ref(obj: dict) -> str:
    return f"{obj['kind'].lower()}/{obj['metadata']['name']}"


def _version(obj: dict) -> str | None:
    return (obj.get("metadata") or {}).get("resourceVersion")


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

