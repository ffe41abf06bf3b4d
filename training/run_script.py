"""`python -m training.run_script`: the pods' constant entrypoint for a `--script` job.

It gets the job as data (`SUBMITTER_JOB`) and the code's whereabouts (`SUBMITTER_CODE`: a
ConfigMap, a bucket object, or for `--local` a file), then, before the user's script runs:
the storage policy and the in-pod filesystem check and write probe, as for the GPT-2 job; the
run's lock (training.run.identity.lock_run_dir: one live driver per run directory); the
bundle unpacked and its hash checked; the code's identity in `run.json` (a resume with other
code is refused naming the files that differ, unless --allow-code-change); Ray's runtime_env
(the unpacked directory as every worker's working_dir, --requirements as pip, the SIGTERM
hook); and the hooks of training.script.hooks. Then the script runs as `__main__` with its
arguments, its driver's output and its workers' errors kept under `<run>/logs/` as the GPT-2
job's are (training.run.logs). Exit 0 done, 1 failed, 2 bad input or refused, 143 preempted.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
from typing import Any, Mapping, Optional, Sequence

from submitter.contract import code
from submitter.contract.errors import SubmitterError, UsageError
from training.run.preempt import DriverPreemption

EXIT_PREEMPTED = 143
#: Where bundles are unpacked (by hash): the code is not checkpoint data, a pod's disk is fine.
CODE_CACHE = "submitter-code"


def read_bundle(ref: Mapping[str, Any], environ: Mapping[str, str]) -> bytes:
    """The bundle's bytes from where SUBMITTER_CODE says it is."""
    if "path" in ref:
        with open(ref["path"], "rb") as f:
            return f.read()
    if "uri" in ref:
        import pyarrow.fs as pafs

        fs, path = pafs.FileSystem.from_uri(ref["uri"])
        try:
            with fs.open_input_stream(path) as f:
                return f.read()
        except (OSError, FileNotFoundError) as e:
            raise UsageError(f"the code bundle {ref['uri']} cannot be read ({e}); submit the job "
                             "again with `submitter submit` (it uploads the bundle)") from None
    return _configmap_bundle(ref["configmap"], environ)


def _configmap_bundle(name: str, environ: Mapping[str, str]) -> bytes:
    """binaryData of the job's code ConfigMap, read with the head's service account."""
    import base64

    from submitter.contract import naming
    from training.events.progress_configmap import ConfigMapSink

    namespace = environ.get(naming.ENV_NAMESPACE) or "default"
    api = ConfigMapSink(name, namespace).api()
    try:
        obj = api.read_namespaced_config_map(name, namespace)
    except Exception as e:  # noqa: BLE001 - ApiException, connection errors: one line
        raise UsageError(f"cannot read the code ConfigMap {namespace}/{name} "
                         f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); re-apply the "
                         "job's objects (submitter submit)") from None
    data = (obj.binary_data or {}).get(code.BUNDLE_KEY)
    if not data:
        raise UsageError(f"the ConfigMap {namespace}/{name} holds no {code.BUNDLE_KEY}")
    return base64.b64decode(data)


def unpack_bundle(data: bytes, sha256: str, base: Optional[str] = None) -> tuple[str, dict[str, str]]:
    """Unpack into `<tmp>/submitter-code/<sha256>` (a fresh directory each time: a half-written
    one from a killed start is never trusted); check the hash."""
    root = os.path.join(base or tempfile.gettempdir(), CODE_CACHE)
    os.makedirs(root, exist_ok=True)
    target = tempfile.mkdtemp(prefix=sha256[:16] + "-", dir=root)
    files = code.unpack(data, target)
    if code.manifest_hash(files) != sha256:
        raise UsageError(f"the code bundle's content does not match its hash {sha256[:12]}: "
                         "submit the job again")
    return target, files


def claim_code(run_dir: str, spec: Any, ref: Mapping[str, Any], files: Mapping[str, str],
               installed: Sequence[str] = ()) -> str:
    """Record the code in a new run's run.json, or check it against the run's. Returns a line.
    `installed`: the --requirements as pip resolved them (name==version)."""
    from training.run.identity import RUN_FILE, RunMismatch, join, read_json, write_json_once

    path = join(run_dir, RUN_FILE)
    stored = read_json(path)
    current = {"sha256": ref["sha256"], "entry": ref["entry"], "files": dict(files),
               "pip": list(ref.get("pip") or []), "pip_installed": list(installed)}
    if stored is None:
        record = {"v": 1, "created": time.time(), "program": "script",
                  "identity": {"code_sha256": ref["sha256"], "entry": ref["entry"]},
                  "code": current, "job": spec.to_dict()}
        if write_json_once(path, record):
            return f"run: new, code {ref['sha256'][:12]} recorded in {path}"
        stored = read_json(path) or {}
    old = stored.get("code")
    if old is None:
        raise RunMismatch(f"{run_dir} holds a run of the GPT-2 entrypoint, not of a script; use "
                          "another --name (or --storage-path)")
    if old.get("sha256") == ref["sha256"]:
        return f"run: continuing {run_dir} (same code {ref['sha256'][:12]})"
    changed = code.changed_files(old.get("files") or {}, files)
    shown = ", ".join(changed[:10]) + (f" and {len(changed) - 10} more" if len(changed) > 10 else "")
    if not spec.allow_code_change:
        raise RunMismatch(f"{run_dir} was trained with other code ({shown} differ); its "
                          "checkpoints may not fit: resume with --allow-code-change, or use "
                          "another --name")
    return (f"run: continuing {run_dir} with changed code ({shown}; --allow-code-change); "
            f"run.json keeps the first code {old.get('sha256', '')[:12]}")


def runtime_env(code_dir: str, pip: Sequence[str]) -> dict[str, Any]:
    """What every Ray worker of the script gets: the code, the SIGTERM hook, the packages."""
    env: dict[str, Any] = {"working_dir": code_dir,
                           "worker_process_setup_hook": "training.script.worker_setup"}
    if pip:
        env["pip"] = list(pip)
    return env


def inject_runtime_env(extra: Mapping[str, Any], environ: Any = os.environ) -> None:
    """Ray's job-level runtime_env (RAY_JOB_CONFIG_JSON_ENV_VAR, which `ray job submit` sets
    and every ray.init of the driver merges), with ours added."""
    key = "RAY_JOB_CONFIG_JSON_ENV_VAR"
    config = json.loads(environ.get(key) or "{}")
    config["runtime_env"] = {**(config.get("runtime_env") or {}), **extra}
    environ[key] = json.dumps(config)


def install_driver_packages(pip: Sequence[str], notice: Any) -> list[str]:
    """The driver runs outside Ray's runtime_env: the same packages go into a directory on its
    sys.path (pip --target, by the requirements' hash, reused by a retry on the same node).
    Returns what pip installed, as `name==version` (for run.json)."""
    if not pip:
        return []
    import hashlib

    key = hashlib.sha256("\n".join(pip).encode()).hexdigest()[:16]
    target = os.path.join(tempfile.gettempdir(), "submitter-pip", key)
    if not os.path.isdir(target):
        notice(f"requirements: installing {', '.join(pip)} for the driver")
        result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                                 "--target", target + ".part", *pip],
                                capture_output=True, text=True)
        if result.returncode:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["?"]
            raise UsageError(f"pip could not install --requirements ({tail[0][:300]}); fix the "
                             "file, or bake the packages into an image (--image)")
        os.replace(target + ".part", target)
    sys.path.insert(0, target)
    from importlib.metadata import distributions

    return sorted(f"{d.metadata['Name']}=={d.version}" for d in distributions(path=[target]))


def _script_hub() -> Any:
    """The run's emitter actor once the script's fit() started it (else None)."""
    from training.script import hooks as script_hooks

    return script_hooks.hub_or_none() if script_hooks.started() else None


#: The driver's SIGTERM (the preStop hook), as `python -m training` handles it
#: (training.run.preempt.DriverPreemption). Before any fit() the script ends at once; during one
#: the workers' `should_stop()` checkpoints, and the end is 'preempted' (exit 143, a retry
#: resumes from that checkpoint). Installed before the script and again once its fit() started
#: Ray (ray.init puts its own SIGTERM handler in the driver: exit 1 at once).
_SIGTERM = DriverPreemption(None, 30.0, find_hub=_script_hub)


def prepare_storage(spec: Any, environ: Mapping[str, str]) -> tuple[str, str, str]:
    """(Ray Train storage_path, run dir, a line), checked as `python -m training` does."""
    from training.run.mounts import checked_run_root
    from training.run.identity import join

    root, line = checked_run_root(spec, environ)
    return root, join(root, spec.run_name), line


NOT_RAY_TRAIN = ("note: {entry} created no Ray Train trainer: it ran with the storage check and "
                 "its code recorded, but checkpoints, resume, progress events and metrics are "
                 "its own (they need ray.train's TorchTrainer or another DataParallelTrainer)")


def main(argv: Optional[Sequence[str]] = None, environ: Any = os.environ) -> int:
    from submitter.contract import events as ev
    from training.args import parse_args

    notice = lambda line: print(line, flush=True)  # noqa: E731
    lock = None
    try:
        spec = parse_args(list(sys.argv[1:] if argv is None else argv), environ)
        if spec.script is None:
            raise UsageError("python -m training.run_script runs a --script job; this job has no "
                             "--script (its entrypoint is python -m training)")
        if not environ.get(code.ENV_CODE):
            raise UsageError(f"{code.ENV_CODE} is not set: render the job with `submitter render "
                             "--script FILE` (it ships the code)")
        ref = code.parse_code_ref(environ[code.ENV_CODE])
        from training.driver import require_training_stack

        require_training_stack()
        storage_root, run_dir, line = prepare_storage(spec, environ)
        notice(line)
        from training.run.identity import lock_run_dir

        lock = lock_run_dir(run_dir, environ, notice)  # one live driver per run, as for GPT-2
        code_dir, files = unpack_bundle(read_bundle(ref, environ), ref["sha256"])
        installed = install_driver_packages(ref.get("pip") or [], notice)
        notice(claim_code(run_dir, spec, ref, files, installed))
        inject_runtime_env(runtime_env(code_dir, ref.get("pip") or []), environ)
        from training.script import hooks as script_hooks

        script_file = os.path.join(code_dir, *ref["entry"].split("/"))
        settings = script_hooks.Settings(
            storage_root=storage_root, name=spec.run_name, run_dir=run_dir,
            script_file=os.path.abspath(script_file), entry=ref["entry"],
            storage_mount=spec.storage_mount, allow_ephemeral=spec.allow_ephemeral_storage,
            access_mode=spec.storage_access_mode, environ=dict(environ), job=spec.to_dict(),
            on_started=_SIGTERM.install)
        script_hooks.install(settings)
    except SubmitterError as e:
        if lock is not None:
            lock.release()
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    from submitter.contract.shutdown import exit_chain

    from training.run.logs import kept_logs

    _SIGTERM.wait_s = exit_chain(spec.termination_grace_period).driver_wait_s
    _SIGTERM.install()
    try:
        with kept_logs(run_dir, settings.job):  # <run>/logs/, as the GPT-2 driver keeps it
            notice(f"script: {ref['entry']} (code {ref['sha256'][:12]}), run {run_dir}")
            outcome = run_user_script(script_file, code_dir, list(spec.script_args))
            return finish(outcome, settings, environ, notice, ev)
    finally:
        if lock is not None:
            lock.release()


def run_user_script(script_file: str, code_dir: str, args: list[str]) -> Optional[BaseException]:
    """Run the script as __main__ in its directory; returns what ended it badly, or None."""
    os.chdir(code_dir)
    sys.path.insert(0, code_dir)
    sys.argv = [script_file, *args]
    try:
        runpy.run_path(script_file, run_name="__main__")
    except SystemExit as e:
        return None if e.code in (None, 0) else e
    except BaseException as e:  # noqa: BLE001 - reported as the run's end below
        return e
    return None


def ended_by_preemption(outcome: Optional[BaseException]) -> bool:
    """The script ended because its workers were preempted: a worker's `should_stop()`
    checkpointed and raised training.script.Preempted (Ray Train keeps each worker's own
    exception in WorkerGroupError.worker_failures; a script may re-raise or chain it), or Ray
    Train gave up on its preemption retries (ray.train.PreemptionError, where Ray has it)."""
    from training.run.failure import chain
    from training.script import Preempted

    try:
        from ray.train import PreemptionError  # type: ignore[attr-defined]
    except ImportError:
        PreemptionError = Preempted
    return any(isinstance(e, (Preempted, PreemptionError)) for e in chain(outcome))


def finish(outcome: Optional[BaseException], s: Any, environ: Mapping[str, str], notice: Any,
           ev: Any) -> int:
    """The run's last event and the exit code."""
    import traceback

    from training.run.failure import one_line
    from training.script import hooks as script_hooks

    if isinstance(outcome, SubmitterError):  # a refusal (the script's storage_path): no run
        print(f"error: {outcome}", file=sys.stderr)
        return outcome.exit_code
    if not s.fits and outcome is None:
        notice(NOT_RAY_TRAIN.format(entry=s.entry))
    hub = script_hooks.hub_or_none()
    if hub is None:
        from training.events.emitter import Emitter, StdoutSink, run_sinks

        sinks, history = run_sinks(s.run_dir, s.environ)
        local = Emitter([StdoutSink(), *sinks], history)
        emit = lambda etype, **f: local.emit(etype, **f)  # noqa: E731
    else:
        import ray

        def emit(etype: str, **f: Any) -> None:
            call = hub.finished.remote() if etype == "run_finished" else hub.emit.remote(etype, **f)
            ray.get(call, timeout=60)
            script_hooks.drain(hub)
    preempted = _SIGTERM.fired or ended_by_preemption(outcome)
    try:
        if outcome is None:
            emit("run_finished")
        else:
            if not isinstance(outcome, (KeyboardInterrupt, SystemExit)):
                traceback.print_exception(outcome)
            error = one_line(outcome)  # a worker group's failure: the first worker's own error
            if preempted and isinstance(outcome, KeyboardInterrupt):
                error = ("preempted (SIGTERM); a retry (or the same command again) resumes from "
                         "the last checkpoint")
            emit("run_failed", error=error, **({"reason": "preemption"} if preempted else {}))
    except Exception as e:  # noqa: BLE001 - the events are best effort at the very end
        notice(f"warning: the run's last event was not recorded ({type(e).__name__}: {e})")
    if outcome is None:
        return 0
    return EXIT_PREEMPTED if preempted else 1


if __name__ == "__main__":
    sys.exit(main())
