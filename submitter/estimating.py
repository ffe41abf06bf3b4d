"""The estimate's inputs that need I/O, then the pure estimate (submitter.contract.estimate).

Read here, at the edge: a prepared corpus's manifest (its exact token count), the size of
files read on the fly, this user's finished runs on the job's storage (usage.json, written by
the run: submitter.contract.usage), and the price (submitter.prices). Nothing here imports
torch, ray or kubernetes: `submitter estimate` answers in well under a second.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from submitter.contract import estimate as E
from submitter.contract.data_path import AT_START, MANIFEST, ON_THE_FLY, corpus_dir, data_path
from submitter.contract.errors import UsageError
from submitter.contract.naming import OFFLINE_DATASET
from submitter.contract.storage import OBJECT_STORE_SCHEMES, corpus_root, local_path, scheme_of


def storage_kind(spec: Any, local: bool) -> str:
    """The run's storage as usage.json names it (submitter.contract.usage.STORAGE_KINDS)."""
    if local:
        return "local"
    return "object-store" if scheme_of(spec.resolved_storage_path) in OBJECT_STORE_SCHEMES \
        else "shared-mount"


def _readable(path: str) -> bool:
    """A path this machine can read without a cluster (a local or object-store path)."""
    return scheme_of(path) in OBJECT_STORE_SCHEMES or os.path.exists(local_path(path))


def _read_text(path: str) -> Optional[str]:
    """A file's text, or None when it is not there (or not reachable from here)."""
    if scheme_of(path) in OBJECT_STORE_SCHEMES:
        try:
            import pyarrow.fs as pafs

            fs, p = pafs.FileSystem.from_uri(path)
            with fs.open_input_stream(p) as f:
                return f.read().decode("utf-8")
        except Exception:  # noqa: BLE001  (no credentials, no network: the estimate says unknown)
            return None
    try:
        with open(local_path(path), encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def manifest_tokens(text: str, where: str) -> list[int]:
    """The training shards' token counts of a manifest (training.data.shards.Manifest)."""
    try:
        doc = json.loads(text)
        return [int(s["tokens"]) for s in doc["shards"] if s.get("split") == "train"]
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"{where}: not a prepared corpus manifest; prepare the corpus again "
                         "(submitter data prepare)") from None


def _file_bytes(path: str) -> Optional[int]:
    path = local_path(path)
    if os.path.isfile(path):
        return os.path.getsize(path)
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path)
                   for n in names)
    return None


def job_tokens(spec: Any, local: bool) -> E.Tokens:
    """The training tokens of one epoch: exact from a prepared corpus's manifest, estimated from
    the size of local files, else unknown (a Hugging Face dataset, files out of reach)."""
    chosen = data_path(spec.data, spec.dataset)
    if chosen.mixture:  # an epoch: as many sequences as the corpora hold together
        return mixture_tokens(spec, local, [name for name, _ in chosen.mixture])
    if spec.data is not None and chosen.kind != ON_THE_FLY:
        where = (corpus_root(spec.resolved_storage_path, None if local else spec.namespace, chosen.name)
                 if chosen.name else corpus_dir(spec.data))
        text = _read_text(f"{where}/{MANIFEST}")
        if text is not None:
            return E.corpus_tokens(manifest_tokens(text, f"{where}/{MANIFEST}"), spec.block, where)
        if chosen.kind != AT_START:
            return E.Tokens(None, False, f"unknown: the prepared corpus {where} is not readable "
                                         "from here (a volume only the pods mount?)")
    if spec.data is not None:
        size = _file_bytes(spec.data) if scheme_of(spec.data) in ("", "file") else None
        if size is not None:
            return E.file_tokens(size, spec.tokenizer, spec.val_percent, spec.block,
                                 f"--data {spec.data}")
        return E.Tokens(None, False, f"unknown: --data {spec.data} is not readable from here; "
                                     "prepare it (submitter data prepare) for an exact count")
    what = "the offline corpus" if spec.dataset == OFFLINE_DATASET else \
        f"Hugging Face dataset {spec.dataset}"
    return E.Tokens(None, False, f"unknown: {what} is tokenized on the fly and its size is not "
                                 "known here; prepare it (submitter data prepare) for an exact "
                                 "count")


def mixture_tokens(spec: Any, local: bool, names: list[str]) -> E.Tokens:
    """A mixture's epoch: every corpus's training shards together (training.data.order's
    MixtureOrder draws an epoch of as many sequences as the corpora hold), exact when every
    manifest is readable from here."""
    counts: list[int] = []
    for name in names:
        where = corpus_root(spec.resolved_storage_path, None if local else spec.namespace, name)
        text = _read_text(f"{where}/{MANIFEST}")
        if text is None:
            return E.Tokens(None, False, f"unknown: the mixture's corpus {where} is not "
                                         "readable from here (a volume only the pods mount?)")
        counts += manifest_tokens(text, f"{where}/{MANIFEST}")
    return E.corpus_tokens(counts, spec.block, f"the mixture's {len(names)} corpora "
                                               f"({', '.join(names)})")


def own_runs(spec: Any, local: bool) -> list[Any]:
    """This user's runs on the job's storage, newest first (usage.json; [] when none or when the
    storage is out of reach from here). read_usages looks two levels down: local runs
    (`<storage>/<name>`) and cluster runs (`<storage>/<namespace>/<name>`)."""
    root = spec.resolved_storage_path
    if not _readable(root):
        return []
    try:
        from submitter.contract.usage import read_usages
    except ImportError:  # the run side that writes usage.json is not installed
        return []
    try:
        return list(read_usages(root))
    except Exception:  # noqa: BLE001  (an unreadable store: no own runs, the next source is used)
        return []


def estimate_for(spec: Any, *, local: bool, kubeconfig: Optional[str] = None,
                 environ: Any = os.environ) -> E.Estimate:
    """The job's estimate. A GPU job whose card is missing or unknown is a UsageError naming the
    known cards (the caller decides whether that refuses or is a note)."""
    from submitter.prices import price_for

    problem = E.card_problem(spec.gpu_type, spec.gpu_per_pod)
    if problem:
        raise UsageError(problem)
    job = E.job_of(spec, local)
    runs = own_runs(spec, local)
    kind = storage_kind(spec, local)
    if job.gpus:
        from submitter.contract.flops import peak_for

        peak = peak_for(spec.gpu_type)
        assert peak is not None
        settings = E.scaling_settings(spec.model, job.block, job.global_batch * job.block,
                                      job.micro_batch * job.block, peak, E.ASSUMED_MFU, spec.gpu_type)

        def normalize(mfu: float, gpus: int) -> float:
            return E.one_gpu_mfu(spec.model, job.block, job.global_batch * job.block,
                                 job.micro_batch * job.block, peak, mfu, gpus)

        pace: Optional[E.Pace] = E.choose_mfu(spec.model, peak.label, kind, runs,
                                              settings.per_token, peak.tflops, normalize)
    else:
        pace = E.choose_cpu_pace(spec.model, kind, runs)
    price = price_for(spec.gpu_hour_price, spec.gpu_type, local, kubeconfig, environ)
    return E.estimate(job, job_tokens(spec, local), pace, price)


def shown_block(spec: Any, *, local: bool, kubeconfig: Optional[str] = None) -> Optional[str]:
    """The estimate's block for render's and submit --dry-run's stderr, when it is complete
    (hours known); None otherwise: those commands do not need it, and `submitter estimate` says
    what is missing (a card, the corpus size, a measured pace)."""
    try:
        est = estimate_for(spec, local=local, kubeconfig=kubeconfig)
    except UsageError:
        return None
    return E.text_block(est) if est.likely.hours is not None else None


# --- before a submit: the guards, the dry run's block, the record ------------------------------

def checked_estimate(spec: Any, *, local: bool, kubeconfig: Optional[str] = None,
                     err: Any = None, show: bool = False) -> Optional[E.Estimate]:
    """The estimate `submit` records with the job, after its guards: OverBudget (exit 2, before
    anything is applied or written) when the likely figure passes --max-cost or --deadline, or
    --max-cost has no price; a UsageError when a limit is set and no estimate can be made (the
    card). `show`: write a complete estimate's block to `err` (submit --dry-run). None when no
    estimate can be made and no limit asks for one."""
    from submitter.contract.errors import OverBudget

    limited = spec.max_cost is not None or spec.deadline is not None
    if spec.script is not None:  # the user's own program: GPT-2's figures would mislead (and
        return None             # JobSpec refuses limits on it)
    try:
        est = estimate_for(spec, local=local, kubeconfig=kubeconfig)
    except UsageError as e:
        if limited:
            raise UsageError(f"--max-cost and --deadline are checked against the estimate, which "
                             f"needs it: {e}") from None
        return None
    problem = E.guard_problem(spec.max_cost, spec.deadline, est)
    if problem:
        raise OverBudget(problem)
    if err is not None:
        if show and est.likely.hours is not None:  # a complete estimate (as render shows it)
            err.write(E.text_block(est) + "\n")
        note = E.unchecked_guards(spec.max_cost, spec.deadline_seconds, est)
        if note:
            err.write(note + "\n")
    return est


def price_carried(spec: Any, est: Optional[E.Estimate]) -> Any:
    """`spec` with the price the estimate found (the table beside the kubeconfig) as its
    gpu_hour_price, when --max-cost needs one in the run: the pod has no kubeconfig and no
    table, and without a price it could not stop at the limit. `spec` itself otherwise."""
    import dataclasses

    if (spec.max_cost is None or spec.gpu_hour_price is not None or est is None
            or est.price is None):
        return spec
    return dataclasses.replace(spec, gpu_hour_price=est.price.per_hour)


def compact(est: E.Estimate) -> str:
    """The estimate as the RayJob annotation and the local run's env carry it."""
    return json.dumps(est.to_dict(), sort_keys=True, separators=(",", ":"))


def with_estimate(plan: Any, est: Optional[E.Estimate]) -> Any:
    """The plan with the estimate on its RayJob (annotation ESTIMATE_ANNOTATION); the plan as it
    is without one. A copy: render's objects stay as render made them."""
    import copy

    from submitter.contract.naming import ESTIMATE_ANNOTATION
    from submitter.plan import Plan

    if est is None or plan.get("RayJob") is None:
        return plan
    objects = []
    for obj in plan:
        if obj["kind"] == "RayJob":
            obj = copy.deepcopy(obj)
            obj["metadata"].setdefault("annotations", {})[ESTIMATE_ANNOTATION] = compact(est)
        objects.append(obj)
    return Plan(tuple(objects))
