"""How a `--script` job's code reaches the pods: packed here, shipped in a ConfigMap the job owns
(the usual case: a few files) or in the run's bucket (larger), refused otherwise.

The cluster side sees a program and its data only: the RayJob's entrypoint becomes
`python -m training.run_script`, the head's `SUBMITTER_CODE` says where the bundle is, its hash
and the entry script, and `--requirements` travel as the pip list of Ray's runtime_env.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from submitter.contract import code, naming
from submitter.contract.errors import UsageError
from submitter.contract.spec import JobSpec
from submitter.contract.storage import OBJECT_STORE_SCHEMES, namespace_root, scheme_of

#: The constant entrypoint of a --script job (the GPT-2 job's is `python -m training`).
SCRIPT_ENTRYPOINT = "python -m training.run_script"


@dataclass(frozen=True)
class CodePlan:
    bundle: code.Bundle
    #: the ConfigMap that carries the bundle, or None when it goes to `uri`
    configmap: Optional[str]
    uri: Optional[str]
    pip: tuple[str, ...]

    @property
    def env_value(self) -> str:
        return code.code_ref(self.bundle, configmap=self.configmap, uri=self.uri,
                             pip=list(self.pip))


def working_dir(spec: JobSpec) -> str:
    return spec.working_dir or os.path.dirname(os.path.abspath(str(spec.script)))


#: `submit --local`'s default storage, relative to the directory it runs from.
LOCAL_RUNS = "runs"


def storage_inside_code(spec: JobSpec, cwd: Optional[str] = None) -> tuple[str, ...]:
    """Run storage inside the code folder, relative to it: the job's storage path when local,
    and `./runs` (`submit --local`'s default) when it holds runs. Why: a run's own output is not
    its code; packed, a second run reads as other code and render ships checkpoints."""
    if spec.script is None:
        return ()
    root = working_dir(spec)
    storage = spec.resolved_storage_path.removeprefix("file://")
    found = []
    if scheme_of(storage) == "" and os.path.isabs(storage):
        found.append(code.inside(root, storage))
    default = os.path.join(cwd or os.getcwd(), LOCAL_RUNS)
    if holds_runs(default):
        found.append(code.inside(root, default))
    return tuple(sorted({rel for rel in found if rel}))


def holds_runs(path: str) -> bool:
    """Whether `path` is a local storage path that submitter wrote: a run (events or run.json)
    or a prepared corpus in one of its folders."""
    from submitter.contract.naming import EVENTS_FILE
    from submitter.contract.storage import CORPORA_DIR

    try:
        names = os.listdir(path)
    except OSError:
        return False
    return any(name == CORPORA_DIR or os.path.isfile(os.path.join(path, name, EVENTS_FILE))
               or os.path.isfile(os.path.join(path, name, "run.json")) for name in names)


def storage_note(spec: JobSpec) -> Optional[str]:
    """The one line that says run storage inside the code folder is left out of the code."""
    rels = storage_inside_code(spec)
    if not rels:
        return None
    shown = ", ".join(f"{rel}/" for rel in rels)
    return f"code: {shown} left out (run storage, inside the code folder {working_dir(spec)})"


def pack_code(spec: JobSpec) -> code.Bundle:
    """The job's code bundle: the working directory, less the run storage inside it."""
    return code.pack(working_dir(spec), spec.script, exclude=storage_inside_code(spec))


def read_requirements(path: Optional[str]) -> tuple[str, ...]:
    """The requirement lines of a pip requirements file (comments and blanks dropped)."""
    if path is None:
        return ()
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.split(" #")[0].strip() for line in f]
    except OSError as e:
        raise UsageError(f"--requirements {path}: {e.strerror}; give a pip requirements file") from None
    out = tuple(line for line in lines if line and not line.startswith("#"))
    for line in out:
        if line.startswith("-"):
            raise UsageError(f"--requirements {path}: {line!r} is a pip option; list packages "
                             "only (name, name==version, ...), or bake them into an image")
    return out


def code_plan(spec: JobSpec) -> Optional[CodePlan]:
    """The code of a --script job (None for the GPT-2 job). Packs the working directory once
    per job in a process: render and submit share it."""
    if spec.script is None:
        return None
    return _code_plan(spec.document())


@lru_cache(maxsize=8)
def _code_plan(document: str) -> CodePlan:
    spec = JobSpec.from_document(document)
    bundle = pack_code(spec)
    pip = read_requirements(spec.requirements)
    if bundle.size <= code.CONFIGMAP_LIMIT:
        return CodePlan(bundle, naming.object_names(spec.name)["code"], None, pip)
    storage = spec.resolved_storage_path
    if scheme_of(storage) not in OBJECT_STORE_SCHEMES:
        raise code.CodeError(code.too_big(working_dir(spec), bundle.size, code.CONFIGMAP_LIMIT))
    run_dir = f"{namespace_root(storage, spec.namespace)}/{spec.name}"  # the pod's run dir
    return CodePlan(bundle, None, code.bundle_uri(run_dir, bundle.sha256), pip)


def upload(plan: CodePlan) -> Optional[str]:
    """Write a bucket bundle (content-addressed: an existing object is the same bytes).
    Returns a line for the output, or None for a ConfigMap bundle."""
    if plan.uri is None:
        return None
    try:
        import pyarrow.fs as pafs
    except ImportError:
        raise UsageError("the code bundle goes to the run's bucket, which needs pyarrow here: "
                         "pip install pyarrow (or a smaller working directory: a ConfigMap "
                         f"carries up to {code.CONFIGMAP_LIMIT // 1024} KiB)") from None
    try:
        fs, path = pafs.FileSystem.from_uri(plan.uri)
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            with fs.open_output_stream(path) as f:
                f.write(plan.bundle.data)
    except OSError as e:
        raise UsageError(f"cannot upload the code bundle to {plan.uri}: {e}; check this "
                         "machine's credentials for the bucket") from None
    return f"code: {plan.bundle.size / 2**20:.1f} MiB uploaded to {plan.uri}"


def local_code_env(spec: JobSpec) -> dict[str, str]:
    """`submit --local` of a --script job: the bundle in a file, as SUBMITTER_CODE names it
    (the runner unpacks and checks it as in a pod); {} for the GPT-2 job."""
    if spec.script is None:
        return {}
    import tempfile

    bundle = pack_code(spec)
    directory = os.path.join(tempfile.gettempdir(), "submitter-bundles")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{bundle.sha256}.zip")
    with open(path + ".part", "wb") as f:
        f.write(bundle.data)
    os.replace(path + ".part", path)
    return {code.ENV_CODE: code.code_ref(bundle, path=path,
                                         pip=list(read_requirements(spec.requirements)))}
