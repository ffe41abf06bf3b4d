"""Whose object is it? The job's identity on objects, and what a RayJob mounts. Pure functions.

Every object a job creates carries its labels and the job-uid annotation
(`submitter.contract.naming`); submit refuses to adopt, and delete/stop/resume refuse to touch,
an object of a derived name that lacks them. The PVC and progress ConfigMap also carry the job
document, which outlives the RayJob (resume after delete).
"""

from __future__ import annotations

import copy

from submitter.contract import naming
from submitter.contract.spec import JobSpec
from submitter.plan import Plan

JOB_LABEL = naming.JOB_LABEL
#: Set by `submitter stop` on the RayJob it suspends, so resume and watch can tell our suspend
#: from Kueue's (which suspends a job while it waits in a queue).
STOPPED_ANNOTATION = "submitter.dev/stopped"


def stopped_by_us(rayjob: dict | None) -> bool:
    """Suspended by `submitter stop` (not by Kueue or by hand)."""
    meta = (rayjob or {}).get("metadata") or {}
    return bool((rayjob or {}).get("spec", {}).get("suspend")) and \
        STOPPED_ANNOTATION in (meta.get("annotations") or {})


def owned_objects(plan: Plan | list[dict], spec: JobSpec) -> list[dict]:
    """The plan's objects, each carrying the job's identity (labels + job-uid annotation), and
    the checkpoint PVC and progress ConfigMap the job document (resume after delete needs no
    flags). Render may already set the identity; this makes sure, and adds nothing else."""
    document = spec.document()
    objects = []
    for obj in plan:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta["labels"] = {**(meta.get("labels") or {}), **naming.labels(spec.name)}
        annotations = {**(meta.get("annotations") or {}), **naming.annotations(spec.namespace, spec.name)}
        if obj["kind"] in ("PersistentVolumeClaim", "ConfigMap"):
            annotations[naming.JOB_DOCUMENT_ANNOTATION] = document
        meta["annotations"] = annotations
        objects.append(obj)
    return objects


def not_ours(obj: dict, namespace: str, name: str) -> str | None:
    """Why a live object is not job `namespace/name`'s, or None when it is.

    Ours: the job-uid annotation of this job. Objects made by submitter versions before the
    annotation existed carry only the labels; the job label together with
    `app.kubernetes.io/managed-by: submitter` is accepted for them (nothing else sets both),
    and the next submit adds the annotation."""
    meta = obj.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    uid = annotations.get(naming.JOB_UID_ANNOTATION)
    if uid is not None:
        if uid == naming.job_uid(namespace, name):
            return None
        owner = labels.get(JOB_LABEL)
        return f"it belongs to another job ({naming.JOB_UID_ANNOTATION}={uid}" + \
            (f", {JOB_LABEL}={owner})" if owner else ")")
    if labels.get(JOB_LABEL) == name and labels.get(naming.MANAGED_BY_LABEL) == naming.APP:
        return None
    return f"it was not created by submitter for job {name} (no {naming.JOB_UID_ANNOTATION} annotation)"


def claim_name(rayjob: dict) -> str | None:
    """The checkpoint PVC a RayJob mounts (from its head pod template)."""
    spec = ((rayjob.get("spec") or {}).get("rayClusterSpec") or {}).get("headGroupSpec") or {}
    for volume in ((spec.get("template") or {}).get("spec") or {}).get("volumes") or []:
        claim = volume.get("persistentVolumeClaim")
        if claim:
            return claim.get("claimName")
    return None


def claim_names(rayjob: dict) -> set[str]:
    """Every PVC any pod of a RayJob mounts: head, worker groups, submitter pod."""
    spec = rayjob.get("spec") or {}
    cluster = spec.get("rayClusterSpec") or {}
    templates = [(cluster.get("headGroupSpec") or {}).get("template") or {},
                 spec.get("submitterPodTemplate") or {}]
    templates += [(g or {}).get("template") or {} for g in cluster.get("workerGroupSpecs") or []]
    return set().union(*(pod_claims(t.get("spec") or {}) for t in templates))


def pod_claims(pod_spec: dict) -> set[str]:
    """The PVCs a pod spec mounts."""
    return {(v.get("persistentVolumeClaim") or {}).get("claimName") for v in pod_spec.get("volumes") or []
            if v.get("persistentVolumeClaim")}


def rayjob_document(rayjob: dict) -> str | None:
    """The job document a RayJob's driver gets (env SUBMITTER_JOB on the head container)."""
    head = (((rayjob.get("spec") or {}).get("rayClusterSpec") or {}).get("headGroupSpec") or {})
    for container in ((head.get("template") or {}).get("spec") or {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == naming.ENV_JOB and env.get("value"):
                return env["value"]
    return None
