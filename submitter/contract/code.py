"""The user's code as data: a deterministic zip of the working directory, and its content hash.

`submitter` packs the directory (`--working-dir`, default: the script's directory) on the
laptop; `python -m training.run_script` unpacks it in the pod and checks the hash. Both sides
import this module, so it is stdlib only.

Deterministic: the same files give the same bytes (sorted entries, fixed timestamps and modes),
so `render` stays byte-identical for GitOps. The hash is over the file list and the files'
contents (not the zip bytes, which depend on zlib's version): it is the code's identity in the
run's `run.json`, and a resume with other code is refused naming the files that differ.
Left out: `.git`, caches and virtual environments, the ignore files themselves (adding one must
not read as changed code), what `.submitterignore` or `.gitignore` (at the top of the directory)
list, and the directories the caller names (a run's storage inside the code folder: a run's own
output is never its code).
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import zipfile
from dataclasses import dataclass
from typing import Mapping, Optional

from submitter.contract.errors import SpecError

#: A ConfigMap holds at most 1 MiB (etcd's limit, base64 and metadata included): the code
#: travels in one when its zip is at most this big, else in the run's bucket.
CONFIGMAP_LIMIT = 900 * 1024
#: The most a bundle may be in a bucket: far above Ray's 500 MB working_dir cap's use cases.
BUCKET_LIMIT = 2 * 1024**3
#: The ConfigMap key (binaryData) and the name of the bundle in a bucket: code/<hash>.zip.
BUNDLE_KEY = "code.zip"
#: The run's code record, in run.json and the head's environment (SUBMITTER_CODE).
ENV_CODE = "SUBMITTER_CODE"
#: Always left out: version control, caches, virtual environments, run outputs of ours.
ALWAYS_IGNORED = (".git", ".hg", ".svn", "__pycache__", "*.pyc", "*.pyo", ".pytest_cache",
                  ".mypy_cache", ".ruff_cache", ".ipynb_checkpoints", ".venv", ".tox",
                  ".DS_Store", ".submitterignore", ".gitignore")
IGNORE_FILES = (".submitterignore", ".gitignore")
_EPOCH = (1980, 1, 1, 0, 0, 0)


class CodeError(SpecError):
    """The code cannot be packed or shipped (exit 2)."""


@dataclass(frozen=True)
class Bundle:
    """A packed working directory: the zip, its manifest (path -> sha256) and the entry script."""

    data: bytes
    files: Mapping[str, str]
    entry: str
    root: str

    @property
    def sha256(self) -> str:
        return manifest_hash(self.files)

    @property
    def size(self) -> int:
        return len(self.data)


def manifest_hash(files: Mapping[str, str]) -> str:
    """The code's identity: sha256 over the sorted `path\\0sha256\\n` lines."""
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(f"{path}\0{files[path]}\n".encode("utf-8"))
    return h.hexdigest()


def _patterns(root: str) -> list[str]:
    out = list(ALWAYS_IGNORED)
    for name in IGNORE_FILES:
        try:
            with open(os.path.join(root, name), encoding="utf-8") as f:
                out += [line.strip() for line in f
                        if line.strip() and not line.lstrip().startswith(("#", "!"))]
        except OSError:
            continue
    return out


def ignored(rel: str, is_dir: bool, patterns: list[str]) -> bool:
    """gitignore's common forms: `name`, `*.ext`, `dir/`, `/anchored`, `a/b/*.py`."""
    name = rel.rsplit("/", 1)[-1]
    for pattern in patterns:
        p = pattern
        if p.endswith("/"):
            if not is_dir:
                continue
            p = p.rstrip("/")
        if p.startswith("/"):
            if fnmatch.fnmatchcase(rel, p[1:]):
                return True
        elif "/" in p:
            if fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(rel, "*/" + p):
                return True
        elif fnmatch.fnmatchcase(name, p):
            return True
    return False


def list_files(root: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """The files of `root` to pack, as sorted relative paths with '/'; `exclude`: directories
    (relative, with '/') left out whole, whatever the ignore files say."""
    patterns = _patterns(root)
    skip = {e.strip("/") for e in exclude}
    out = []
    for here, dirs, files in os.walk(root, followlinks=False):
        rel_here = os.path.relpath(here, root).replace(os.sep, "/")
        rel_here = "" if rel_here == "." else rel_here + "/"
        dirs[:] = sorted(d for d in dirs if rel_here + d not in skip
                         and not ignored(rel_here + d, True, patterns))
        for name in files:
            rel = rel_here + name
            if not ignored(rel, False, patterns) and os.path.isfile(os.path.join(here, name)):
                out.append(rel)
    return sorted(out)


def pack(working_dir: str, script: str, limit: int = BUCKET_LIMIT,
         exclude: tuple[str, ...] = ()) -> Bundle:
    """Zip `working_dir` deterministically; `script` must be a file inside it; `exclude`:
    directories left out (see list_files)."""
    root = os.path.abspath(working_dir)
    if not os.path.isdir(root):
        raise CodeError(f"--working-dir {working_dir}: not a directory; give the directory whose "
                        "files the script needs (default: the script's own)")
    entry_path = os.path.abspath(script)
    if not os.path.isfile(entry_path):
        raise CodeError(f"--script {script}: no such file; give the path of your training "
                        "script, e.g. --script train.py")
    entry = os.path.relpath(entry_path, root).replace(os.sep, "/")
    if entry.startswith("../"):
        raise CodeError(f"--script {script} is outside --working-dir {working_dir}: the script "
                        "must be one of the files shipped; use a --working-dir that contains it")
    files: dict[str, str] = {}
    total = 0
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for rel in list_files(root, exclude):
            path = os.path.join(root, *rel.split("/"))
            with open(path, "rb") as f:
                content = f.read()
            total += len(content)
            if total > limit:
                raise CodeError(too_big(working_dir, total, limit))
            files[rel] = hashlib.sha256(content).hexdigest()
            info = zipfile.ZipInfo(rel, date_time=_EPOCH)
            executable = os.stat(path).st_mode & 0o111
            info.external_attr = (0o100755 if executable else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, content)
    if entry not in files:
        raise CodeError(f"--script {script} is left out of the bundle by an ignore rule "
                        f"({', '.join(IGNORE_FILES)}); un-ignore it")
    return Bundle(buf.getvalue(), files, entry, root)


def inside(root: str, path: str) -> Optional[str]:
    """`path` relative to `root` (with '/') when it is a directory strictly inside it, else None.
    Why: a run's storage inside the code folder must be left out of the code, or a second run
    sees its own checkpoints as changed code. Both sides are resolved (symlinks, `..`)."""
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(root))
    if rel == "." or rel == ".." or rel.startswith(".." + os.sep) or os.path.isabs(rel):
        return None
    return rel.replace(os.sep, "/")


def too_big(working_dir: str, size: int, limit: int) -> str:
    return (f"the code in {working_dir} is {size / 2**20:.1f} MiB, over the {limit / 2**10:.0f} "
            "KiB a ConfigMap carries: use an object-store --storage-path (s3://, gs://, ...; the "
            "code goes to the run's bucket), or bake the code into an image (--image) and leave "
            "large files out with a .submitterignore")


def unpack(data: bytes, target: str) -> dict[str, str]:
    """Extract a bundle into `target`; returns its manifest (path -> sha256), checked."""
    files = {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for info in sorted(z.infolist(), key=lambda i: i.filename):
            name = info.filename
            if name.startswith("/") or ".." in name.split("/"):
                raise CodeError(f"the code bundle holds an unsafe path {name!r}")
            content = z.read(info)
            files[name] = hashlib.sha256(content).hexdigest()
            path = os.path.join(target, *name.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(content)
            os.chmod(path, (info.external_attr >> 16) & 0o777 or 0o644)
    return files


def changed_files(stored: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """Sorted paths added, removed or changed between two manifests."""
    return sorted(p for p in set(stored) | set(current) if stored.get(p) != current.get(p))


def code_ref(bundle: Bundle, *, configmap: Optional[str] = None, uri: Optional[str] = None,
             path: Optional[str] = None, pip: Optional[list[str]] = None) -> str:
    """The head's `SUBMITTER_CODE`: where the bundle is (a ConfigMap, a bucket URI or, for
    --local, a file), its hash, the entry script and the pip requirements."""
    where = {k: v for k, v in (("configmap", configmap), ("uri", uri), ("path", path)) if v}
    assert len(where) == 1, where
    return json.dumps({"sha256": bundle.sha256, "entry": bundle.entry, "pip": list(pip or []),
                       **where}, sort_keys=True, separators=(",", ":"))


def parse_code_ref(text: str) -> dict:
    """`SUBMITTER_CODE` back to data, or CodeError."""
    try:
        ref = json.loads(text)
    except ValueError:
        ref = None
    if not isinstance(ref, dict) or not {"sha256", "entry"} <= set(ref) or not (
            {"configmap", "uri", "path"} & set(ref)):
        raise CodeError(f"{ENV_CODE} is not a code reference written by submitter; re-render "
                        "the job")
    return ref


def bundle_uri(run_dir: str, sha256: str) -> str:
    """Where a bucket bundle lives: under the run, by content."""
    return f"{run_dir.rstrip('/')}/code/{sha256}.zip"
