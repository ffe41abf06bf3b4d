"""`python -m training.prepare`: the prepare job's program (`submitter data prepare`).

Given the job as data like `python -m training` (the JSON document in `$SUBMITTER_JOB`, or
`--job`, flags override), it turns the job's data settings (--data / --dataset /
--dataset-config / --data-format / --text-column, --tokenizer / --bpe-file, --val-percent) into
the prepared corpus `--name` at `<storage>/corpora/<name>` (`<storage>/<namespace>/corpora/<name>`
in a cluster), on Ray Data across the cluster's CPUs (training.data.prepare). The storage is
checked as for a run first. Events (stdout, `<corpus>/events.jsonl`, the job's progress
ConfigMap) say each shard written; the driver's output is kept in `<corpus>/logs/`.

Exit codes as the training job's: 0 prepared (or already prepared: nothing written), 1 failed,
2 bad input (a name that holds another corpus, a source that is not there, a storage path the
policy refuses), 8 another prepare of the corpus holds its lease and still beats
(training.data.lease), 130 Ctrl-C, 143 SIGTERM (a retry continues shard by shard).
`--force` (the program's own flag, from `data prepare --force`): every shard made again.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Mapping, Optional, Sequence

EXIT_PREEMPTED = 143
#: The program's own flag (not a job setting): make every shard again, whole or not.
FORCE = "--force"


class Terminated(Exception):
    """SIGTERM (a preemption, `submitter stop`): the shards written so far stay."""


def main(argv: Optional[Sequence[str]] = None, environ: Mapping[str, str] = os.environ) -> int:
    from submitter.contract.errors import SubmitterError
    from training.args import parse_args

    args = list(sys.argv[1:] if argv is None else argv)
    force = FORCE in args  # `data prepare --force`: every shard made again
    try:
        spec = parse_args([a for a in args if a != FORCE], environ)
        return run(spec, environ, force=force)
    except SubmitterError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


def corpus_dir(spec: Any, environ: Mapping[str, str]) -> tuple[str, str]:
    """The corpus's directory (the storage checked where it runs, as a run's) and the line
    saying where it goes."""
    from submitter.contract.storage import corpus_root
    from training.run.mounts import checked_run_root

    root, line = checked_run_root(spec, environ)  # <storage> here, <storage>/<namespace> in a pod
    return corpus_root(root, None, spec.name), line


def run(spec: Any, environ: Mapping[str, str], force: bool = False) -> int:
    from submitter.contract.errors import UsageError
    from training.data import prepare as prep
    from training.data.pipeline import _filesystem
    from training.data.tokens import get_encoding, resolve_tokenizer
    from training.data.shards import tokenizer_identity

    corpus, storage_line = corpus_dir(spec, environ)
    print(f"{storage_line}\ncorpus: {corpus}", flush=True)
    try:
        tokenizer, why = resolve_tokenizer(spec.tokenizer, spec.bpe_file, environ)
    except (RuntimeError, OSError, ValueError) as e:
        raise UsageError(f"tokenizer: {e}") from None
    source = prep.resolve_source(spec.dataset, spec.dataset_config, spec.data, spec.data_format,
                                 spec.text_column)
    size = sum(f.size for f in source.files)
    print(f"data: {source.what} ({source.fmt}, {len(source.files)} file(s), {size / 1e6:,.1f} MB"
          f"{', validation split' if source.has_val_split else ''}; fingerprint "
          f"{source.fingerprint()})", flush=True)
    print(why, flush=True)
    fs, root = _filesystem(corpus)
    key = prep.recorded_key(fs, root, source, tokenizer_identity(get_encoding(tokenizer)),
                            spec.val_percent)
    done = prep.existing(fs, root, spec.name, key)
    damage = None if done is None or force else prep.damage(fs, root, done)
    if damage is not None:
        print(f"repairing {corpus}: {damage.split(': prepare the corpus again')[0]}; the "
              f"shards that are missing or damaged are made again", flush=True)
    elif force and done is not None:
        print(f"--force: every shard of {corpus} is made again", flush=True)
    elif done is not None:  # events to stdout and the ConfigMap only: the corpus is not touched
        emitter = _emitter(None, environ)
        emitter.emit("run_finished", **_finished(corpus, done, already=True))
        print(f"{corpus} is already prepared from this source and tokenizer: nothing to do",
              flush=True)
        return 0
    from training.run.logs import kept_logs

    if done is None and not _has_plan(fs, root):
        prep.check_source(source)  # bad input known now: one line, before Ray, nothing written
    from training.data.lease import Lease, describe, holder

    fs.create_dir(root, recursive=True)
    # one prepare of a corpus at a time: a second one is refused (exit 8) naming the holder
    with Lease(fs, root, holder(spec.name, environ)) as lease:
        if lease.took_over is not None:
            print(f"took over the lease of a prepare that stopped beating "
                  f"({describe(lease.took_over, time.time())})", flush=True)
        with kept_logs(corpus, spec.to_dict()):  # <corpus>/logs/: outlives the pods
            return _prepare(spec, source, tokenizer, fs, root, corpus, environ, force)


def _prepare(spec: Any, source: Any, tokenizer: Any, fs: Any, root: str, corpus: str,
             environ: Mapping[str, str], force: bool = False) -> int:
    from training.data import prepare as prep

    emitter = _emitter(corpus, environ)
    cpus = _start_ray()
    emitter.emit("run_started", run_name=spec.name, num_workers=cpus, storage_path=corpus,
                 run_dir=corpus, corpus=corpus, data=source.what, tokenizer=tokenizer.describe())

    def progress(p: Any) -> None:
        emitter.emit("prepare_progress", shards_done=p.shards_done, shards=p.shards,
                     tokens=p.tokens, tokens_per_sec=round(p.tokens_per_sec, 1),
                     documents=p.documents, shard=p.last)

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        outcome = prep.prepare(source, fs, root, tokenizer, name=spec.name,
                               val_percent=spec.val_percent, force=force,
                               on_progress=progress)
    except Terminated:
        emitter.emit("run_failed", error="stopped by SIGTERM; prepare again to continue shard "
                                         "by shard", reason="preemption")
        return EXIT_PREEMPTED
    except KeyboardInterrupt:
        emitter.emit("run_failed", error="interrupted (Ctrl-C); prepare again to continue "
                                         "shard by shard")
        return 130
    except Exception as e:  # noqa: BLE001 - said as an event and exit 1 (a bad input raised earlier)
        from submitter.contract.errors import SubmitterError

        if isinstance(e, SubmitterError):  # bad input found while tokenizing: one line, exit 2
            emitter.emit("run_failed", error=str(e))
            raise
        emitter.emit("run_failed", error=f"{type(e).__name__}: {e}")
        print(f"error: prepare failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    emitter.emit("run_finished", **_finished(corpus, outcome.manifest, already=outcome.already),
                 tokens_per_sec=outcome.facts.get("tokens_per_sec"))
    note = no_validation_note(outcome.manifest, source.has_val_split, spec.val_percent)
    if note:
        print(note, flush=True)
    return 0


def no_validation_note(manifest: Any, has_split: bool, val_percent: float) -> str:
    """The plain line when the corpus has no validation tokens ('' when it has some)."""
    from training.data.shards import VAL

    if manifest.tokens(VAL):
        return ""
    why = ("its validation split is empty" if has_split else
           "no validation split: --val-percent 0 held out nothing" if not val_percent else
           f"no validation split: the source has none and the {val_percent:g}% hold-out took "
           "no document")
    return (f"note: {why}; a run on this corpus reports no val_loss (and keeps no best "
            "checkpoint by it): prepare with a larger --val-percent, or a source with a "
            "validation split")


def _has_plan(fs: Any, root: str) -> bool:
    import pyarrow.fs as pafs

    from training.data.prepare import PLAN

    return fs.get_file_info(f"{root}/{PLAN}").type == pafs.FileType.File


def _finished(corpus: str, manifest: Any, already: bool) -> dict[str, Any]:
    from training.data.prepare import describe_validation
    from training.data.shards import TRAIN, VAL

    return {"corpus": corpus, "shards": len(manifest.split(TRAIN)), "tokens": manifest.tokens(TRAIN),
            "val_tokens": manifest.tokens(VAL), "hold_out": describe_validation(manifest),
            "documents": manifest.extra.get("prepare", {}).get("documents"), "already": already}


def _terminate(signum: int, frame: Any) -> None:
    import logging

    # raised inside Ray Data's iterator, which would log it as an internal error of its own
    logging.getLogger("ray.data.exceptions").setLevel(logging.CRITICAL)
    raise Terminated()


def _emitter(corpus: Optional[str], environ: Mapping[str, str]) -> Any:
    """Events to stdout, `<corpus>/events.jsonl` (None: not written) and the job's ConfigMap."""
    from training.events.emitter import Emitter, StdoutSink, run_sinks

    sinks, history = run_sinks(corpus, environ, trackers=False)
    return Emitter([StdoutSink(), *sinks], history)


def _start_ray() -> int:
    """Ray: the cluster's (a pod: RAY_ADDRESS) or one on this machine; its CPUs."""
    import logging

    import ray

    from training.driver import quiet_logs

    quiet_logs()
    if not ray.is_initialized():
        env = {"env_vars": {"RAY_DATA_LOG_LEVEL": "WARNING"}}
        if os.environ.get("RAY_ADDRESS"):  # a pod: the RayJob's cluster
            ray.init(logging_level=logging.WARNING, runtime_env=env)
        else:  # an embedded Ray, never one someone else started on this machine
            ray.init(address="local", include_dashboard=False, log_to_driver=False,
                     logging_level=logging.ERROR, runtime_env=env)
    import ray.data

    quiet_logs()  # again: Ray Data sets its loggers up when it is first imported
    ray.data.DataContext.get_current().enable_progress_bars = False
    return int(ray.cluster_resources().get("CPU", 0)) or 1


if __name__ == "__main__":
    sys.exit(main())
