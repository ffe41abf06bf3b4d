"""A job's lifecycle after submit: stop (suspend), delete, resume (unsuspend, a new attempt, or
a recreation from the settings saved on the PVC). Never loses the job, never touches another's.

- delete: every check (ownership, --delete-pvc not mounted elsewhere) before the first delete;
  only objects carrying the job's identity go; the PVC's job document is updated first so
  `resume` after `delete` needs no flags.
- resume of a finished RayJob must delete it (KubeRay never re-runs one, and the name is the
  run's identity). Before that: a server dry run of the new attempt and the settings saved on
  the PVC and progress ConfigMap; after a failure past the delete, running resume again
  recreates the job from them.
"""

from __future__ import annotations

import copy
import json
from typing import Any, TextIO

from submitter.cluster import existing_rayjob, install, job_names, next_steps, preflight
from submitter.contract import naming
from submitter.contract.errors import ClusterError, Conflict, Forbidden, NotFound, Preflight
from submitter.contract.spec import JobSpec
from submitter.kube import Kube
from submitter.ownership import (
    JOB_LABEL, STOPPED_ANNOTATION, claim_name, claim_names, not_ours, owned_objects, pod_claims, rayjob_document,
    stopped_by_us,
)
from submitter.render import render
from submitter.state import JobState, job_state

#: Annotations on a resumed RayJob: which attempt it is and how the previous ones ended.
ATTEMPT_ANNOTATION = "submitter.dev/attempt"
PREVIOUS_ANNOTATION = "submitter.dev/previous-attempts"


# --- delete -----------------------------------------------------------------------------------

def delete_job(kube: Kube, namespace: str, name: str, *, delete_pvc: str | None = None,
               out: TextIO) -> int:
    """Delete the RayJob and its RBAC/ConfigMap, each only if it is this job's. The PVC only
    when named, only ours, and only while nothing else mounts it. Every check comes before the
    first delete."""
    n = job_names(name, namespace)
    targets = [("RayJob", name), ("NetworkPolicy", name), ("RoleBinding", n["progress"]),
               ("Role", n["progress"]), ("ServiceAccount", n["progress"]), ("ConfigMap", n["progress"]),
               ("ConfigMap", n["code"])]  # a --script job's code bundle
    found = [(kind, obj_name, kube.find(kind, namespace, obj_name)) for kind, obj_name in targets]
    rayjob = found[0][2]
    if rayjob is not None and not_ours(rayjob, namespace, name):
        rayjob = None  # someone else's RayJob of this name: left alone below, tells us nothing
    pvc_name = claim_name(rayjob) if rayjob else None
    pvc = None
    if delete_pvc is not None:
        pvc = kube.find("PersistentVolumeClaim", namespace, delete_pvc)
        check_pvc_deletable(pvc, delete_pvc, name, namespace)
        refuse_mounted(kube, namespace, delete_pvc, name)
    mine = [(kind, obj_name, obj) for kind, obj_name, obj in found
            if obj is not None and not not_ours(obj, namespace, name)]
    foreign = [f"{kind.lower()}/{obj_name}" for kind, obj_name, obj in found
               if obj is not None and not_ours(obj, namespace, name)]
    if rayjob is not None and delete_pvc is None:
        save_settings(kube, namespace, name, rayjob, resumed_rayjob(rayjob)["metadata"]["annotations"],
                      kinds=("PersistentVolumeClaim",))  # the ConfigMap goes too
    if delete_pvc is not None and pvc is not None:
        mine.append(("PersistentVolumeClaim", delete_pvc, pvc))
    deleted = [f"{kind.lower()}/{obj_name}" for kind, obj_name, obj in mine
               if kube.delete(kind, namespace, obj_name, uid=(obj.get("metadata") or {}).get("uid"))]
    note = (f"; left {', '.join(foreign)} alone: not created by submitter for job {name}" if foreign else "")
    if not deleted:
        raise NotFound(f"nothing to delete: no RayJob {name} or its objects in namespace {namespace}{note}")
    out.write("deleted " + ", ".join(deleted) + "\n")
    if foreign:
        out.write(f"left {', '.join(foreign)} alone: not created by submitter for job {name}\n")
    kept = pvc_name or n["pvc"]
    if delete_pvc is None:
        kept_pvc = kube.find("PersistentVolumeClaim", namespace, kept)
        if kept_pvc is not None and not_ours(kept_pvc, namespace, name):
            out.write(f"kept persistentvolumeclaim/{kept} (checkpoints; not this job's PVC, so "
                      "never deleted by submitter)\n")
        elif kept_pvc is not None:
            saved = (kept_pvc["metadata"].get("annotations") or {}).get(naming.JOB_DOCUMENT_ANNOTATION)
            resume = f"; submitter resume {name} -n {namespace} recreates the job from the settings saved on it" \
                if saved else ""
            out.write(f"kept persistentvolumeclaim/{kept} (checkpoints){resume}; to delete it too: "
                      f"submitter delete {name} -n {namespace} --delete-pvc {kept}\n")
    return 0


def check_pvc_deletable(pvc: dict | None, pvc_name: str, job: str, namespace: str) -> None:
    if pvc is None:
        raise Preflight(f"--delete-pvc {pvc_name}: no such PVC in namespace {namespace}; nothing deleted")
    why = not_ours(pvc, namespace, job)
    if why:
        owner = ((pvc.get("metadata") or {}).get("labels") or {}).get(JOB_LABEL)
        raise Preflight(f"--delete-pvc {pvc_name}: that PVC was not created by submitter for job {job} "
                        f"(label {JOB_LABEL}={owner or 'absent'}; {why}); nothing deleted. Delete it "
                        "with kubectl if you really mean to")


def refuse_mounted(kube: Kube, namespace: str, pvc: str, job: str) -> None:
    """--delete-pvc refuses while another RayJob's pods would mount it, or any pod not of this
    job does (two list requests). Kubernetes' own pvc-protection would only postpone the
    deletion until they stop, and then the other job's checkpoints are gone."""
    users = [f"rayjob/{j['metadata']['name']}" for j in kube.list("RayJob", namespace).get("items") or []
             if j["metadata"].get("name") != job and pvc in claim_names(j)]
    try:
        pods = kube.list("Pod", namespace).get("items") or []
    except Forbidden as e:
        raise Preflight(f"--delete-pvc {pvc}: cannot check which pods mount it ({e}); nothing deleted") from e
    users += [f"pod/{p['metadata']['name']}" for p in pods
              if ((p["metadata"].get("labels") or {}).get(JOB_LABEL) != job
                  and pvc in pod_claims(p.get("spec") or {}))]
    if users:
        shown = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
        raise Preflight(f"--delete-pvc {pvc}: still mounted by {shown}; deleting it would take their "
                        "checkpoints. Nothing deleted; delete or finish those first, then run this again")


# --- the saved settings (they outlive the RayJob) --------------------------------------------

def save_settings(kube: Kube, namespace: str, name: str, rayjob: dict, attempt: dict[str, str], *,
                  kinds: tuple[str, ...] = ("PersistentVolumeClaim", "ConfigMap")) -> list[str]:
    """Before a RayJob is deleted: its job document and the next attempt's annotations onto the
    job's own PVC and progress ConfigMap (merge patches; only objects that are ours). Returns
    where it was saved ([] when nowhere: an --existing-pvc or s3:// job after `delete`)."""
    document = rayjob_document(rayjob)
    if document is None:
        return []
    annotations = {naming.JOB_DOCUMENT_ANNOTATION: document,
                   ATTEMPT_ANNOTATION: attempt.get(ATTEMPT_ANNOTATION),
                   PREVIOUS_ANNOTATION: attempt.get(PREVIOUS_ANNOTATION)}
    saved = []
    for kind, obj_name in (("PersistentVolumeClaim", claim_name(rayjob)),
                           ("ConfigMap", job_names(name, namespace)["progress"])):
        if not obj_name or kind not in kinds:
            continue
        obj = kube.find(kind, namespace, obj_name)
        if obj is None or not_ours(obj, namespace, name):
            continue
        kube.patch(kind, namespace, obj_name, {"metadata": {"annotations": annotations}},
                   uid=obj["metadata"].get("uid"))
        saved.append(f"{kind.lower()}/{obj_name}")
    return saved


def saved_settings(kube: Kube, namespace: str, name: str) -> tuple[str, dict[str, str], str] | None:
    """(document, annotations, where) from the job's PVC, else its progress ConfigMap."""
    n = job_names(name, namespace)
    for kind, obj_name in (("PersistentVolumeClaim", n["pvc"]), ("ConfigMap", n["progress"])):
        obj = kube.find(kind, namespace, obj_name)
        if obj is None or not_ours(obj, namespace, name):
            continue
        annotations = obj["metadata"].get("annotations") or {}
        if annotations.get(naming.JOB_DOCUMENT_ANNOTATION):
            return annotations[naming.JOB_DOCUMENT_ANNOTATION], annotations, f"{kind.lower()}/{obj_name}"
    return None


# --- stop / resume ----------------------------------------------------------------------------

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: The label Kueue puts on a job's Workload: the job's uid (Kueue's constants.JobUIDLabel).
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def job_workloads(kube: Kube, rayjob: dict) -> list[dict] | None:
    """Kueue's Workloads of a RayJob (one, or two while a workload slice replaces another): by
    Kueue's `kueue.x-k8s.io/job-uid` label, else by an ownerReference to the RayJob's uid.
    None when Kueue's API is not served (no Kueue: `suspend` alone holds the job)."""
    meta = rayjob["metadata"]
    uid, namespace = meta.get("uid"), meta["namespace"]
    try:
        found = kube.list("Workload", namespace, labels={KUEUE_JOB_UID_LABEL: uid}).get("items") or [] \
            if uid else []
        if not found:
            found = [w for w in kube.list("Workload", namespace).get("items") or []
                     if any(ref.get("uid") == uid and ref.get("kind") == "RayJob"
                            for ref in (w.get("metadata") or {}).get("ownerReferences") or [])]
    except NotFound:
        return None
    return sorted(found, key=lambda w: w["metadata"]["name"])


def set_workloads_active(kube: Kube, workloads: list[dict], active: bool) -> list[str]:
    """`spec.active` on each Workload that is not so already; returns their names. Kueue's way
    to stop a job: an inactive Workload is evicted (the job suspended, its quota released) and
    never admitted again until it is active; a suspend alone is undone by Kueue while the
    Workload is admitted."""
    changed = []
    for workload in workloads:
        meta = workload["metadata"]
        if (workload.get("spec") or {}).get("active", True) is active:
            continue
        kube.patch("Workload", meta["namespace"], meta["name"], {"spec": {"active": active}},
                   uid=meta.get("uid"))
        changed.append(meta["name"])
    return changed


def stop_job(kube: Kube, namespace: str, name: str, *, out: TextIO) -> int:
    """Suspend a job (KubeRay `spec.suspend: true`): the operator deletes the Ray cluster and
    the submitter Job; the RayJob, PVC and progress stay. `resume` continues it. A queued job
    (Kueue) is stopped through its Workload (`spec.active: false`) as well, before the suspend."""
    rayjob = existing_rayjob(kube, namespace, name)
    why = not_ours(rayjob, namespace, name)
    if why:
        raise Conflict(f"rayjob/{name} is not this submitter job's ({why}); nothing was changed")
    state = job_state(rayjob, None, name=name, namespace=namespace)
    if state.terminal:
        out.write(f"{name} already ended ({state.state}); nothing to stop\n")
        return 0
    queue = (rayjob["metadata"].get("labels") or {}).get(KUEUE_QUEUE_LABEL)
    workloads = job_workloads(kube, rayjob) if queue else None
    active = [w for w in workloads or [] if (w.get("spec") or {}).get("active", True)]
    suspended = bool((rayjob.get("spec") or {}).get("suspend"))
    if suspended and not active and (queue is None or stopped_by_us(rayjob)):
        out.write(f"{name} is already stopped ({state.state}); submitter resume {name} -n {namespace} "
                  "continues it\n")
        return 0
    deactivated = set_workloads_active(kube, active, False)
    kube.patch("RayJob", namespace, name, {"spec": {"suspend": True},
                                           "metadata": {"annotations": {STOPPED_ANNOTATION: "true"}}},
               uid=rayjob["metadata"].get("uid"))
    via = (f" and its Kueue Workload {', '.join(deactivated)} deactivated (spec.active: false; Kueue "
           "releases its quota and does not admit it again)" if deactivated else "")
    out.write(f"rayjob/{name} stopped (spec.suspend: true){via}: KubeRay deletes its Ray cluster; the "
              f"checkpoints and progress are kept. Continue with: submitter resume {name} -n {namespace}\n")
    return 0


def resume_job(kube: Kube, namespace: str, name: str, *, out: TextIO, wait_seconds: float = 120) -> int:
    """Continue a job from its last checkpoint: a SUSPENDED one is unsuspended; a FAILED or
    STOPPED one gets a new attempt (same name, settings, run name and storage); a deleted one
    is recreated from the settings saved on its PVC.

    KubeRay never re-runs a finished RayJob, and the new attempt needs the name (the Ray Train
    run name and checkpoint directory derive from it), so the old object must go first. Before
    it goes: the new object passes a server dry run, and the job document is saved on the
    job's PVC and progress ConfigMap. If anything fails after the delete (an API error, a
    finalizer outlasting the wait), running `resume` again recreates the job from what was
    saved. The PVC and the progress ConfigMap are never deleted here."""
    old = kube.find("RayJob", namespace, name)
    if old is None:
        return recreate(kube, namespace, name, out=out)
    why = not_ours(old, namespace, name)
    if why:
        raise Conflict(f"rayjob/{name} is not this submitter job's ({why}); nothing was changed")
    if old["metadata"].get("deletionTimestamp"):
        raise Conflict(f"rayjob/{name} is still being deleted (finalizers: "
                       f"{', '.join(old['metadata'].get('finalizers') or []) or 'none'}); run "
                       f"submitter resume {name} -n {namespace} again once it is gone: the job is "
                       "recreated from its saved settings")
    state = job_state(old, None, name=name, namespace=namespace)
    if state.state == "SUSPENDED" or (old.get("spec") or {}).get("suspend") and not state.terminal:
        return unsuspend(kube, old, state, out=out)
    if not state.terminal:
        raise Conflict(f"{name} is {state.state}, not finished; resume is for a FAILED, STOPPED or "
                       f"SUSPENDED job. Watch it (submitter watch {name} -n {namespace}) or stop it "
                       f"first (submitter stop {name} -n {namespace})")
    if state.state == "SUCCEEDED":
        raise Conflict(f"{name} SUCCEEDED; there is nothing to resume. To train further, submit a new "
                       f"job (e.g. more --epochs) with another --name and the same storage")
    new = resumed_rayjob(old)
    probe = copy.deepcopy(new)
    probe["metadata"].pop("name")
    # as long as the real name (admission webhooks check name lengths), starting like it
    probe["metadata"]["generateName"] = name[:max(1, len(name) - 6)] + "-"
    try:
        kube.create(probe, dry_run=True)  # the API validates the new attempt before the old goes
    except ClusterError as e:
        raise type(e)(f"{e} (server dry run of the new attempt; {name} was left as it was)") from e
    saved = save_settings(kube, namespace, name, old, new["metadata"]["annotations"])
    if not saved:
        raise Conflict(f"cannot save {name}'s settings before replacing its RayJob: neither "
                       f"persistentvolumeclaim/{claim_name(old) or name + '-checkpoints'} nor "
                       f"configmap/{job_names(name, namespace)['progress']} is this job's (or the RayJob "
                       "has no job document); nothing was changed. Submitting it again with the "
                       "same flags recreates the progress ConfigMap and leaves the RayJob as it is")
    again = (f"its settings are saved on {' and '.join(saved)}: run submitter resume {name} -n "
             f"{namespace} again to recreate it")
    kube.delete("RayJob", namespace, name, uid=old["metadata"].get("uid"), propagation="Foreground")
    try:
        wait_deleted(kube, namespace, name, wait_seconds)
        kube.renew()
        _create_attempt(kube, new)
    except ClusterError as e:
        raise type(e)(f"{e}; rayjob/{name} was deleted and not recreated; {again}") from e
    attempt = new["metadata"]["annotations"][ATTEMPT_ANNOTATION]
    out.write(f"rayjob/{name} resumed as attempt {attempt} (previous: {state.state}); the run "
              f"continues from its last checkpoint\n")
    out.write(next_steps(name, namespace, claim_name(new)))
    return 0


def _create_attempt(kube: Kube, new: dict) -> None:
    meta = new["metadata"]
    try:
        kube.create(new)
    except Conflict:  # our retried POST landed, or someone was faster: only ours is fine
        current = kube.find("RayJob", meta["namespace"], meta["name"])
        if current is None or not_ours(current, meta["namespace"], meta["name"]) or \
                (current["metadata"].get("annotations") or {}).get(ATTEMPT_ANNOTATION) != \
                meta["annotations"][ATTEMPT_ANNOTATION]:
            raise


def unsuspend(kube: Kube, rayjob: dict, state: JobState, *, out: TextIO) -> int:
    """SUSPENDED: ours (submitter stop) -> `suspend: false`; held by Kueue -> say how it starts."""
    meta = rayjob["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    annotations = meta.get("annotations") or {}
    queue = (meta.get("labels") or {}).get(KUEUE_QUEUE_LABEL)
    if queue and STOPPED_ANNOTATION not in annotations:
        raise Conflict(f"{name} is SUSPENDED by Kueue (queue {queue}): it starts when Kueue admits it, "
                       "and resume does not override the queue. See why it waits: kubectl get "
                       f"workloads -n {namespace} (and the ClusterQueue's quota); nothing was changed")
    workloads = job_workloads(kube, rayjob) if queue else None
    if workloads is not None:
        # Kueue admits the reactivated Workload and unsuspends the job itself; a suspend: false
        # from us would only start it around the queue.
        activated = set_workloads_active(kube, workloads, True)
        kube.patch("RayJob", namespace, name, {"metadata": {"annotations": {STOPPED_ANNOTATION: None}}},
                   uid=meta.get("uid"))
        which = f" (Workload {', '.join(activated)} active again)" if activated else ""
        out.write(f"rayjob/{name} resumed{which}: Kueue (queue {queue}) starts it when it admits it, "
                  "and the run continues from its last checkpoint\n")
        out.write(next_steps(name, namespace, claim_name(rayjob)))
        return 0
    kube.patch("RayJob", namespace, name, {"spec": {"suspend": False},
                                           "metadata": {"annotations": {STOPPED_ANNOTATION: None}}},
               uid=meta.get("uid"))
    queued = f"; Kueue (queue {queue}) starts it when it is admitted" if queue else ""
    out.write(f"rayjob/{name} resumed (spec.suspend: false): KubeRay recreates its Ray cluster and the "
              f"run continues from its last checkpoint{queued}\n")
    out.write(next_steps(name, namespace, claim_name(rayjob)))
    return 0


def recreate(kube: Kube, namespace: str, name: str, *, out: TextIO) -> int:
    """`resume` of a job whose RayJob is gone (deleted, or a resume that failed after the
    delete): submit the saved job document again, with the next attempt number."""
    saved = saved_settings(kube, namespace, name)
    if saved is None:
        raise NotFound(f"no RayJob {name} in namespace {namespace} to resume, and no saved settings "
                       f"(on persistentvolumeclaim/{name}-checkpoints or configmap/{name}-progress); "
                       "submit it again with the same --name and storage settings: training "
                       "continues from its last checkpoint")
    document, annotations, where = saved
    spec = JobSpec.from_document(document)
    if (spec.name, spec.namespace) != (name, namespace):
        raise Conflict(f"the settings saved on {where} are for job {spec.namespace}/{spec.name}, not "
                       f"{namespace}/{name}; nothing was changed")
    objects = owned_objects(render(spec), spec)
    attempt = {k: annotations[k] for k in (ATTEMPT_ANNOTATION, PREVIOUS_ANNOTATION) if annotations.get(k)}
    attempt.setdefault(ATTEMPT_ANNOTATION, "2")
    for obj in objects:
        if obj["kind"] == "RayJob":
            obj["metadata"]["annotations"].update(attempt)
    live = preflight(kube, spec, objects)
    report, _ = install(kube, objects, live)
    created = [ref for ref, what in report.done if what == "created"]
    out.write(f"rayjob/{name} recreated from the settings saved on {where} as attempt "
              f"{attempt[ATTEMPT_ANNOTATION]} ({', '.join(created)} created); the run continues from "
              "its last checkpoint\n")
    out.write(next_steps(name, namespace, claim_name(next(o for o in objects if o["kind"] == "RayJob"))))
    return 0


def resumed_rayjob(old: dict) -> dict:
    """The next attempt of a finished RayJob (pure): same spec; status and server fields dropped."""
    meta = old["metadata"]
    annotations = dict(meta.get("annotations") or {})
    annotations.pop(STOPPED_ANNOTATION, None)
    attempt = int(annotations.get(ATTEMPT_ANNOTATION, "1")) + 1
    status = old.get("status") or {}
    previous = json.loads(annotations.get(PREVIOUS_ANNOTATION, "[]"))
    previous.append({k: status.get(k) for k in ("jobStatus", "jobDeploymentStatus", "reason", "endTime")
                     if status.get(k)})
    annotations[ATTEMPT_ANNOTATION] = str(attempt)
    annotations[PREVIOUS_ANNOTATION] = json.dumps(previous, separators=(",", ":"))
    spec = copy.deepcopy(old.get("spec") or {})
    spec.pop("jobId", None)  # a fixed submission id would collide with the previous attempt's
    # a queued job starts suspended again, for Kueue to admit (its webhook would suspend it anyway)
    spec["suspend"] = KUEUE_QUEUE_LABEL in (meta.get("labels") or {})
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
                raise ClusterError(f"rayjob/{name} was not deleted within {seconds:g}s (finalizers?)") from None
            if source == "error":
                raise event
            if event.get("type") == "DELETED":
                return
    finally:
        follower.stop()
