"""The driver: storage check -> data -> TorchTrainer.fit() -> run_finished / run_failed.

Runs where `python -m training` runs (the RayJob's driver on the head pod) or inside
`submitter submit --local`. It owns the run's emitter actor (events with a monotonic seq) and
polls it to show the events live (`on_event`), while Ray Train restarts worker groups beneath.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from submitter.contract import events as ev
from submitter.contract import naming
from submitter.contract.shutdown import ExitChain, exit_chain
from submitter.contract.spec import JobSpec
from submitter.contract.stack import require_training_stack as _require
from training.gpt2.config import TrainConfig
from training.events.poller import EventPoller, Notice, OnEvent
from training.run.failure import one_line

#: Logical CPUs Ray Data gets on a local Ray beside the training workers: without them, 2
#: workers on a 2-CPU machine take every CPU and Ray Data's read tasks wait forever.
DATA_CPUS = 2


@dataclass
class RunOutcome:
    ok: bool
    state: ev.ProgressState
    events: list[dict[str, Any]] = field(default_factory=list)
    run_dir: str = ""
    error: Optional[str] = None


def require_training_stack(dataset: Optional[str] = None, data: Optional[str] = None) -> None:
    """What this job needs (`datasets` only for a Hub data set), else exit 2 with the pip command."""
    _require("python -m training", dataset, data)


def prepare_run(spec: JobSpec, environ: Any = os.environ) -> tuple[TrainConfig, str]:
    """The run of a job here: its storage checked where it runs (the policy, then the mounted
    filesystem in a pod). Returns the config and a line saying where checkpoints go."""
    from training.gpt2.elastic import cpus_per_worker
    from training.run.mounts import checked_run_root

    root, line = checked_run_root(spec, environ)  # before Ray starts: one line, exit 2
    cpus = cpus_per_worker(spec.elastic, spec.cpus_per_train_worker, 1.0)
    return TrainConfig.from_spec(spec, root, cpus_per_worker=cpus), line


@dataclass
class Claim:
    """What `claim_run_dir` settled before Ray starts: the tokenizer, the run's record, the lock."""
    tokenizer: Any
    tokenizer_line: str
    record: Optional[dict[str, Any]]
    lock: Any = None
    sample_prompt: Optional[str] = None  # the closing sample's prompt, set once the data is read

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


def claim_run_dir(cfg: TrainConfig, notice: Notice, environ: Any = os.environ) -> Claim:
    """Before anything starts or is written: take the run's lock, refuse a run directory that
    holds another run (model/data/tokenizer differ) or a finished run with no new epochs, and
    record a new run's settings (run.json). Raises UsageError subclasses (exit 2)."""
    from training.events.emitter import events_sink
    from training.gpt2.model import PRESETS
    from training.run.identity import (RUN_FILE, check_not_finished, claim_run, estimate_extra,
                                       identity, join, lock_run_dir, read_json)
    from training.data.tokens import get_encoding, resolve_tokenizer

    run_dir = run_dir_of(cfg)
    lock = lock_run_dir(run_dir, environ, notice)
    try:
        tok_spec, tok_line = resolve_tokenizer(cfg.tokenizer, cfg.bpe_file)
        encoding = get_encoding(tok_spec)
        block = cfg.block_size or PRESETS[cfg.model].block_size
        ident = identity(cfg.job.to_dict(), tok_spec.kind, encoding.n_vocab, block)
        # the ranks file the tokenizer really came from (an image's baked-in one too): export
        # copies it beside the model
        job = {**cfg.job.to_dict(), "bpe_file": tok_spec.bpe_file or cfg.bpe_file}
        notice(claim_run(run_dir, job, ident, extra=estimate_extra(environ)))
        history = events_sink(run_dir).read()  # events.jsonl: a file, or an object
        check_not_finished(ev.fold(history), cfg.epochs, run_dir, cfg.run_name)
        return Claim(tok_spec, tok_line, read_json(join(run_dir, RUN_FILE)), lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


@dataclass(frozen=True)
class Prepared:
    """A prepared corpus the job trains on, checked before Ray starts (training.data.shards)."""
    uri: str
    sequences: int     # whole training sequences of the job's block
    line: str          # what the run says about its data
    why: str           # why this path (the run's first lines)
    parts: tuple = ()  # a mixture's corpora: ({"name", "uri", "weight"}, ...)
    no_val: Optional[str] = None  # the line saying it validates nothing (run_plan.no_validation)


def check_prepared(cfg: TrainConfig) -> Optional[Prepared]:
    """The job's prepared corpus, checked before anything starts or is written: where it is
    (a NAME under the storage, a path or a bucket URI, which the storage policy must allow),
    its manifest and every shard's header and size, the job's tokenizer against the
    corpus's, and at least one optimizer step of sequences. CorpusError (exit 2, one line)
    otherwise; None when the job's data is read on the fly."""
    from submitter.contract.data_path import PREPARED
    from submitter.contract.storage import check_pod_file
    from training.data import shards as sh
    from training.data.reader import corpus_uri, open_manifest
    from training.data.tokens import get_encoding, resolve_tokenizer

    if cfg.job.data_path.mixture:  # prepared corpora by NAME, mixed by weight
        from training.data.reader import check_mixture

        if cfg.val_data is not None:
            raise sh.CorpusError(f"--val-data {cfg.val_data}: a mixture validates on its "
                                 f"corpora's own validation shards; leave --val-data out")
        tok_spec, _ = resolve_tokenizer(cfg.tokenizer, cfg.bpe_file)
        parts, sequences, line = check_mixture(
            cfg.job.data_path.mixture, cfg.storage_path,
            sh.tokenizer_identity(get_encoding(tok_spec)), cfg.job.block,
            cfg.job.batch_plan().global_batch, run_dir_of(cfg), cfg.job.restart_epoch)
        return Prepared(parts[0]["uri"], sequences, line, cfg.job.data_path.why, tuple(parts))
    if cfg.data is not None and not cfg.job.data_path.name:
        check_pod_file("--data", cfg.data, cfg.storage_mount)  # the policy: one line, exit 2
    uri = corpus_uri(cfg.data, cfg.dataset, cfg.storage_path)
    if uri is None:
        return None
    if cfg.val_data is not None:
        raise sh.CorpusError(f"--val-data {cfg.val_data}: a prepared corpus validates on its "
                             f"own validation shard(s); leave --val-data out (or prepare the "
                             f"validation text into the corpus)")
    tok_spec, _ = resolve_tokenizer(cfg.tokenizer, cfg.bpe_file)
    label = f"--data {cfg.data}" + (f" ({uri})" if uri != cfg.data else "")
    _, _, manifest = open_manifest(uri, check=True, label=label,
                                   identity=sh.tokenizer_identity(get_encoding(tok_spec)))
    block, step = cfg.job.block, cfg.job.batch_plan().global_batch
    sequences = sum(s.tokens // block for s in manifest.split(sh.TRAIN))
    if sequences < step:
        raise sh.CorpusError(
            f"--data {cfg.data}: {sequences} training sequences of {block} tokens, fewer than "
            f"one optimizer step ({step}): prepare more data, or lower --global-batch-size "
            f"(or --block-size)")
    # a resume mid-epoch in an order this corpus and block no longer give: refused here
    from training.data.reader import check_resumed_order

    check_resumed_order(uri, manifest, block, run_dir_of(cfg), cfg.job.restart_epoch)
    chosen = cfg.job.data_path
    why = (chosen.why if chosen.kind == PREPARED else
           f"{uri} holds {sh.MANIFEST}: its shards are read by position in the workers, "
           "nothing tokenized, no Ray Data")
    from training.run_plan import no_validation

    val = sum(s.tokens // block for s in manifest.split(sh.VAL))
    return Prepared(uri, sequences, (
        f"data: prepared corpus {manifest.name} at {uri}: {manifest.tokens(sh.TRAIN):,} training "
        f"tokens in {len(manifest.split(sh.TRAIN))} shard(s) ({manifest.dtype}, "
        f"{manifest.tokenizer.get('encoding')}), {sequences:,} sequences of {block}"), why,
        no_val=no_validation(val, f"corpus {manifest.name} holds "
                                  f"{manifest.tokens(sh.VAL):,} validation tokens, "
                                  f"no sequence of {block}"))


def check_on_the_fly(cfg: TrainConfig) -> None:
    """--data / --val-data read on the fly: what Ray Data's readers would fail on inside Ray (a
    traceback per task, exit 1) is refused before Ray starts, in one line naming the file
    (training.data.pipeline.check_files)."""
    from training.data.pipeline import check_files

    for flag, data in (("--data", cfg.data), ("--val-data", cfg.val_data)):
        if data:
            check_files(data, cfg.data_format, cfg.text_column, flag)


def run_dir_of(cfg: TrainConfig) -> str:
    """`<storage_path>/<run_name>`, where events.jsonl lives beside the checkpoints: a local
    path, or a URI for an object store."""
    from training.run.identity import join

    return join(cfg.storage_path, cfg.run_name)


def local_num_cpus(cfg: TrainConfig) -> int:
    """Logical CPUs for an embedded Ray: the workers' share plus room for Ray Data."""
    return max(os.cpu_count() or 1, math.ceil(cfg.num_workers * cfg.cpus_per_worker) + DATA_CPUS)


#: Loggers whose INFO chatter buries the events; the controller's PlacementGroupCleaner warns
#: every few seconds when the State API (dashboard) is absent, which is harmless; Ray Data
#: warns once per dataset that the progress bars we turned off are off.
_NOISY = {"ray.data": logging.WARNING, "ray.train": logging.WARNING, "ray.tune": logging.WARNING,
          "transformers": logging.WARNING, "ray.data._internal.progress": logging.ERROR,
          "ray.train.v2._internal.execution.controller.placement_group_cleaner": logging.ERROR}
#: Ray Train logs every `report` at INFO through a logger named after its file path (relative
#: to the `ray` package here).
_NOISY_FILE_LOGGERS = ("train/v2/_internal/execution/context.py",)
#: Ray Train's own use of a deprecated Ray Data option (not ours to fix) warns in every run.
_NOISY_WARNINGS = r"`ExecutionOptions\.exclude_resources` is deprecated"
#: An embedded Ray has no nodes a cloud can drain, so Ray Train's preemption watcher only
#: costs an actor per worker group (and logs an E-level line about its max_restarts).
LOCAL_RAY_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


def quiet_logs() -> None:
    """Silence Ray's per-run chatter, here and (as a setup hook) in every Ray process."""
    import importlib.util
    import warnings

    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name, level in _NOISY.items():
        logging.getLogger(name).setLevel(level)
    # The top-level spec only: find_spec("ray.train...") would import ray.train (~0.8 s) in
    # every Ray process this hook runs in.
    ray_spec = importlib.util.find_spec("ray")
    if ray_spec is not None and ray_spec.origin:
        for relative in _NOISY_FILE_LOGGERS:
            path = os.path.join(os.path.dirname(ray_spec.origin), relative)
            logging.getLogger(path).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=_NOISY_WARNINGS)


def worker_setup() -> None:
    """Every Ray process's setup hook: quiet logs, its own Ray's address (training.run.own_ray),
    and SIGTERM as a preemption request while a training loop runs (training.run.preempt)."""
    from training.run.own_ray import pin_address
    from training.run.preempt import install_in_ray_worker

    quiet_logs()
    pin_address()
    install_in_ray_worker()


def train_resources(cfg: TrainConfig) -> dict[str, float]:
    """What each Ray Train worker reserves (ScalingConfig resources_per_worker): its CPUs, its
    GPU, and one train slot, of which each worker pod offers exactly the workers it was
    rendered for (naming.TRAIN_SLOT_RESOURCE). CPUs alone do not bound it: an elastic group
    that lost a pod would fit every worker it can on the pods left, Ray Data's CPU included."""
    return {"CPU": cfg.cpus_per_worker, naming.TRAIN_SLOT_RESOURCE: 1, **({"GPU": 1} if cfg.use_gpu else {})}


def ensure_ray(cfg: TrainConfig, **init_kwargs: Any) -> None:
    """Connect to the cluster (RAY_ADDRESS, as in a RayJob) or start an embedded Ray whose
    own output stays in its log files (the events are what a person reads)."""
    import ray

    if ray.is_initialized():
        return
    env_vars = {"RAY_DATA_LOG_LEVEL": "WARNING"}
    if init_kwargs.get("address") == "local" or not os.environ.get("RAY_ADDRESS"):
        init_kwargs.update(address="local")
        init_kwargs.setdefault("num_cpus", local_num_cpus(cfg))
        # the train slots each Ray Train worker reserves (train_resources); a pod has its own
        init_kwargs.setdefault("resources", {naming.TRAIN_SLOT_RESOURCE: cfg.num_workers})
        init_kwargs.setdefault("include_dashboard", False)
        init_kwargs.setdefault("log_to_driver", False)
        init_kwargs.setdefault("logging_level", logging.ERROR)
        env_vars.update(LOCAL_RAY_ENV)
    init_kwargs.setdefault("runtime_env", {"worker_process_setup_hook": "training.driver.worker_setup",
                                           "env_vars": env_vars})
    ray.init(**init_kwargs)


def run(cfg: TrainConfig, *, on_event: OnEvent, notice: Notice = print,
        poll_seconds: float = 0.5) -> RunOutcome:
    """Train; every event goes to the sinks and to `on_event`. Never raises for a training
    failure (the outcome says it). The storage was checked by `prepare_run`; a run directory
    that is locked, holds another run or a finished one raises UsageError before Ray starts."""
    import time

    started_at = time.time()  # the segment's wall-clock counts from here (run_limits)
    quiet_logs()
    from training.events.trackers import check_installed

    check_installed(os.environ)  # MLflow/W&B asked for and not installed: exit 2, nothing started
    prepared = check_prepared(cfg)  # a bad corpus: exit 2, nothing started or written
    if prepared is None:
        check_on_the_fly(cfg)  # files Ray Data would fail on: exit 2, nothing started
    notice(f"data path: prepared: {prepared.why}" if prepared is not None
           else f"data path: on the fly: {cfg.job.data_path.why}")
    claim = claim_run_dir(cfg, notice)
    from training.run.logs import kept_logs

    try:
        limits = segment_limits(cfg, started_at, claim.record, notice)  # spent: exit 2
        with kept_logs(run_dir_of(cfg), cfg.job.to_dict()):  # <run>/logs/: outlives the pods
            return _run_claimed(cfg, claim, on_event, notice, poll_seconds, prepared, limits)
    finally:
        claim.release()


def segment_limits(cfg: TrainConfig, started_at: float, record: Optional[dict[str, Any]] = None,
                   notice: Notice = print) -> Any:
    """This segment's limits (--deadline, --max-cost over the whole run: the earlier segments'
    wall-clock and hours from events.jsonl; the price from the job, else from the estimate
    run.json `record` holds); UsageError (exit 2) when the run's budget is already spent, so a
    retry or a resume with the same limit starts nothing."""
    from submitter.contract.errors import UsageError
    from submitter.contract.naming import RUN_ESTIMATE_KEY
    from submitter.contract.run_limits import limits_of, spent
    from submitter.contract.usage import billed_hours, segments
    from training.events.emitter import events_sink

    history = events_sink(run_dir_of(cfg)).read()
    estimate = (record or {}).get(RUN_ESTIMATE_KEY)
    limits = limits_of(cfg.job, prior_wall_s=sum(s.end - s.start for s in segments(history)),
                       prior_billed_hours=billed_hours(history), started_at=started_at,
                       use_gpu=cfg.use_gpu,
                       estimate_price=estimate.get("gpu_hour_price")
                       if isinstance(estimate, dict) else None)
    refusal = spent(limits, cfg.num_workers)
    if refusal:
        raise UsageError(f"run {cfg.run_name}: {refusal}")
    if limits.max_cost is not None and not limits.price:
        notice(f"--max-cost {limits.max_cost:g} is not checked while the run trains: no price "
               "reached the run (give --gpu-hour-price)")
    return limits


def _run_claimed(cfg: TrainConfig, claim: Claim, on_event: OnEvent, notice: Notice,
                 poll_seconds: float, prepared: Optional[Prepared] = None,
                 limits: Any = None) -> RunOutcome:
    from training.run.preempt import DriverPreemption

    ensure_ray(cfg)
    import ray

    from training.run.usage_file import storage_kind

    # usage.json beside the events (training.run.usage_file): its storage kind and the price
    hub = _start_hub(cfg, {"storage_kind": storage_kind(cfg.storage_path, os.environ),
                           "price": limits.price if limits is not None else None})
    poller = EventPoller(hub, on_event, poll_seconds, notice)
    # every wait on the way out, from the job's grace period (submitter.contract.shutdown)
    chain = exit_chain(cfg.termination_grace_period)
    preemption = DriverPreemption(hub, chain.driver_wait_s)
    try:
        trainer, facts = _prepare(cfg, hub, notice, claim, prepared, limits)
        ray.get(hub.emit.remote("run_started", run_name=cfg.run_name, num_workers=cfg.num_workers,
                                storage_path=cfg.storage_path, run_dir=run_dir_of(cfg),
                                **_started_at(limits), **facts))
        poller.tell_problems()  # a sink that cannot write says so now, not at the first poll
        poller.start()
        preemption.install()
        result = trainer.fit()
        preemption.uninstall()
        if preemption.fired:  # Ray Train's Ctrl-C handler aborted fit() for us
            raise KeyboardInterrupt
        final = _final_fields(cfg, result)
        stop = ray.get(hub.limit_stop.remote())
        if stop is not None:  # a limit passed: its checkpoint is saved, the run ends short
            _wait_for_checkpoint_event(hub, final.get("latest_checkpoint"))
            raise _LimitStopped(_record_limit_stop(hub, limits, stop, final, cfg.num_workers))
        if final.get("step") == 0:  # the plan's size check is an estimate: this one is not
            raise RuntimeError("no optimizer step ran: the training data is shorter than one "
                               "step; add data or lower --global-batch-size (nothing exported)")
        _wait_for_checkpoint_event(hub, final.get("latest_checkpoint"))
        final.update(_export_at_end(cfg, result, claim, notice))
        ray.get(hub.emit.remote("run_finished", **final))
        ok, error = True, None
    except _LimitStopped as e:
        ok, error = False, str(e)
    except Exception as e:  # noqa: BLE001 - training failures become run_failed
        if preemption.fired:
            _preempted(hub, preemption, poller, chain)
        error = one_line(e)  # a worker group's failure: the first worker's own error
        ray.get(hub.emit.remote("run_failed", error=error))
        ok = False
    except KeyboardInterrupt:
        if preemption.fired:  # SIGTERM: the checkpoint is registered, a retry resumes from it
            _preempted(hub, preemption, poller, chain)
        ray.get(hub.emit.remote("run_failed", error="interrupted (Ctrl-C); resubmit with the "
                                "same storage path and name to continue"))
        raise
    finally:
        preemption.uninstall()
        if preemption.fired:  # on the way out (Preempted): nothing more to wait for
            state, session = ev.ProgressState(), []
        else:
            poller.stop()
            state = ev.ProgressState.from_dict(ray.get(hub.snapshot.remote()))
            session = ray.get(hub.since.remote(0))
        ray.kill(hub)
    return RunOutcome(ok, state, session, run_dir_of(cfg), error)


class _LimitStopped(Exception):
    """fit() returned because a limit passed (run_stopped is recorded): not a failure."""


def _started_at(limits: Any) -> dict[str, Any]:
    from datetime import datetime, timezone

    if limits is None or not limits.started_at:
        return {}
    when = datetime.fromtimestamp(limits.started_at, timezone.utc)
    return {"started_at": when.isoformat(timespec="milliseconds").replace("+00:00", "Z")}


def _record_limit_stop(hub: Any, limits: Any, stop: dict[str, Any], final: dict[str, Any],
                       workers: int) -> str:
    """run_stopped: which limit, what was measured against it, where the checkpoint is."""
    import time

    import ray

    from submitter.contract.run_limits import DEADLINE, continue_hint, stop_text

    reason = stop["reason"]
    message = f"{stop_text(reason, limits, time.time(), workers)}; {continue_hint(reason)}"
    ray.get(hub.emit.remote("run_stopped", reason=reason, message=message, step=stop["step"],
                            checkpoint=final.get("latest_checkpoint"),
                            limit=limits.deadline_s if reason == DEADLINE else limits.max_cost))
    return message


def _preempted(hub: Any, preemption: Any, poller: Any, chain: ExitChain) -> None:
    """The driver's SIGTERM ended fit(): run_failed with reason preemption, then Preempted
    (exit 143: retryable). The emitter actor writes the event to events.jsonl and the ConfigMap
    first, then closes the trackers: the driver waits for that at most the chain's
    `tracker_close_s`, and all of its exit takes at most `driver_exit_s`, so a slow tracker never holds exit 143 (its last points are sent again by
    the next attempt: trackers resume from the events)."""
    import ray

    from training.run.preempt import Preempted

    error = preemption.message()
    # the poller's 3 waits (join, events, problems), twice, share what the trackers leave
    poll = max(chain.driver_exit_s - chain.tracker_close_s, 0.0) / 6
    poller.stop(timeout=poll)  # the events so far, to the log
    try:
        ray.get(hub.emit.remote("run_failed", error=error, reason="preemption"),
                timeout=max(chain.tracker_close_s, 0.001))
    except Exception:  # noqa: BLE001
        # A tracker still closing, or the emitter actor lost: it is pinned (hard affinity) to
        # the driver's node, which is the one being drained. Neither turns a preemption into
        # exit 1, nor holds it.
        pass
    poller.stop(timeout=poll)  # run_failed too, when it is there
    raise Preempted(error) from None


def _wait_for_checkpoint_event(hub: Any, path: Optional[str], timeout: float = 10.0) -> None:
    """The controller sends checkpoint_saved for the last checkpoint as fit() returns; let it
    land before run_finished so the story stays in order."""
    import time

    import ray

    if not path:
        return
    name = os.path.basename(path.rstrip("/"))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e["type"] == "checkpoint_saved" and str(e.get("path", "")).endswith(name)
               for e in ray.get(hub.since.remote(0))):
            return
        time.sleep(0.1)


def _export_at_end(cfg: TrainConfig, result: Any, claim: Claim, notice: Notice) -> dict[str, Any]:
    """`<run>/model` as a Hugging Face directory, and a sample of its text for run_finished.
    A failed export costs the export, not the run (its checkpoints are safe)."""
    from training.gpt2.export import EXPORT_DIR, SAMPLE_PROMPT, export_run_end
    from training.run.identity import join

    if result.checkpoint is None:
        return {}
    try:
        out = export_run_end(result.checkpoint, join(run_dir_of(cfg), EXPORT_DIR), claim.record,
                             claim.sample_prompt or SAMPLE_PROMPT)
    except Exception as e:  # noqa: BLE001
        notice(f"export failed ({one_line(e)}); the checkpoints are intact: submitter export "
               f"{cfg.run_name} ... -o DIR retries it")
        return {"export_error": one_line(e)}
    return {"export_dir": out["export_dir"], "sample_prompt": out["sample_prompt"],
            "sample": out["sample"]}


def _start_hub(cfg: TrainConfig, usage: Optional[dict[str, Any]] = None) -> Any:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from training.events.emitter import RunEmitter

    env = {k: os.environ[k] for k in (naming.ENV_PROGRESS_CONFIGMAP, naming.ENV_NAMESPACE)
           if os.environ.get(k)}
    # hard affinity: the ConfigMap sink needs the driver pod's service-account token (only the
    # head mounts it); a soft one put the actor on a worker pod in 2 of 5 runs (issue 19)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    actor = ray.remote(RunEmitter).options(num_cpus=0, scheduling_strategy=here,
                                           max_concurrency=1)
    return actor.remote(run_dir_of(cfg), env, *([usage] if usage is not None else []))


def _prepare(cfg: TrainConfig, hub: Any, notice: Notice, claim: Claim,
             prepared: Optional[Prepared] = None, limits: Any = None) -> tuple[Any, dict[str, Any]]:
    """Tokenizer, data, model size and the TorchTrainer; returns it and facts for run_started.
    A prepared corpus is read by the workers themselves: no Ray Data pipeline, no datasets."""
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    from training.data.pipeline import load_corpus, token_datasets
    from training.gpt2.export import prompt_from
    from training.gpt2.loop import train_func
    from training.run.checkpoint_events import CheckpointEvents
    from training.gpt2.model import PRESETS, expected_parameters
    from training.gpt2.elastic import scaling_options
    from training.run.logs import keeping_own_error, worker_error_logs
    from training.run_plan import data_config, no_validation, plan_run
    from training.data.tokens import get_encoding

    tok_spec, tok_line = claim.tokenizer, claim.tokenizer_line
    notice(tok_line)
    encoding = get_encoding(tok_spec)
    block = cfg.block_size or PRESETS[cfg.model].block_size
    if prepared is not None:  # the workers read the shards by position (training.data.reader)
        notice(prepared.line)
        if prepared.no_val:
            notice(prepared.no_val)
        description, data_kwargs = prepared.line, {}
        corpus_loop = {"corpus": {"uri": prepared.uri, "block": block,
                                  **({"mixture": list(prepared.parts)} if prepared.parts else {})}}
        plan = plan_run(cfg, None, tok_spec, block, notice, sequences=prepared.sequences)
    else:
        from ray.data import DataContext

        ctx = DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.execution_options.preserve_order = True  # same data order on every (re)start
        corpus = load_corpus(cfg.dataset, cfg.dataset_config, cfg.data, cfg.data_format,
                             cfg.text_column, cfg.val_data, cfg.limit_rows)
        notice(corpus.description)
        none = no_validation(0 if corpus.val is None and not cfg.val_percent else None,
                             "no validation split and --val-percent 0")
        if none:
            notice(none)
        claim.sample_prompt = prompt_from(corpus.sample)
        train_ds, val_ds = token_datasets(corpus, tok_spec, block, cfg.val_percent)
        description, corpus_loop = corpus.description, {}
        data_kwargs = {"datasets": {"train": train_ds, "val": val_ds},
                       "dataset_config": data_config()}
        plan = plan_run(cfg, corpus, tok_spec, block, notice)  # GPU checks, precision, steps
    steps_per_epoch = plan.steps_per_epoch
    params = expected_parameters(cfg.model, encoding.n_vocab, cfg.block_size)
    notice(f"model: {cfg.model}, {params / 1e6:.2f}M parameters, block {block}, "
           f"{cfg.num_workers} worker(s) x batch {cfg.micro_batch_size}, "
           f"{cfg.epochs} epoch(s) x {steps_per_epoch} steps")
    resources = train_resources(cfg)
    trainer = TorchTrainer(
        keeping_own_error(train_func, run_dir_of(cfg), cfg.job.to_dict()),
        train_loop_config={"config": cfg.to_dict(), "hub": hub, **plan.loop_config(),
                           "vocab_size": encoding.n_vocab, "eot_id": encoding.eot_token,
                           **({"limits": limits.to_dict()} if limits is not None and limits.active
                              else {}),
                           **corpus_loop},
        scaling_config=ray.train.ScalingConfig(
            use_gpu=cfg.use_gpu, resources_per_worker=resources,
            **scaling_options(cfg.job.min_train_workers, cfg.num_workers)),
        run_config=ray.train.RunConfig(
            name=cfg.run_name, storage_path=cfg.storage_path,
            checkpoint_config=ray.train.CheckpointConfig(
                num_to_keep=cfg.num_to_keep, checkpoint_score_attribute="val_loss",
                checkpoint_score_order="min"),
            failure_config=ray.train.FailureConfig(max_failures=cfg.max_failures),
            callbacks=[worker_error_logs(run_dir_of(cfg), cfg.job.to_dict()),
                       CheckpointEvents(hub, run_dir_of(cfg))],
            logging_config=ray.LoggingConfig(log_level="WARNING")),
        **data_kwargs,
    )
    facts = {"model": cfg.model, "params": params, "tokenizer": tok_spec.describe(),
             "data": description.removeprefix("data: "), "epochs": cfg.epochs,
             "data_path": "prepared" if prepared is not None else "on-the-fly",
             "steps_per_epoch": steps_per_epoch, "block_size": block,
             "batch_size_per_worker": cfg.micro_batch_size, **plan.facts,
             **({"min_workers": cfg.job.min_train_workers} if cfg.job.elastic else {})}
    return trainer, facts


def _final_fields(cfg: TrainConfig, result: Any) -> dict[str, Any]:
    """run_finished: the final metrics and where the checkpoints are."""
    from training.run.checkpoint_events import validated

    metrics = {k: v for k, v in (result.metrics or {}).items()
               if k in ("epoch", "step", "train_loss", "val_loss", "tokens_per_sec")}
    if "val_loss" in metrics:  # None when nothing was validated (no validation split)
        metrics["val_loss"] = validated(metrics["val_loss"])
    best = result.best_checkpoints or []
    out: dict[str, Any] = dict(metrics)
    out["checkpoint_dir"] = run_dir_of(cfg)
    out["latest_checkpoint"] = result.checkpoint.path if result.checkpoint else None
    # only a validated checkpoint can be best (unvalidated ones are kept by recency)
    scored = [cm for cm in best if validated(cm[1].get("val_loss")) is not None]
    if scored:
        ranked = sorted(scored, key=lambda cm: _score(cm[1]))
        out["best_checkpoint"] = ranked[0][0].path
    return out


def _score(metrics: dict[str, Any]) -> float:
    v = metrics.get("val_loss")
    return v if isinstance(v, (int, float)) else float("inf")
