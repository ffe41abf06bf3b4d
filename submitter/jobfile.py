"""Job files: read one safely (`-f`), and write one that reads back to the same job (`-o jobfile`).

A job file is user input from anywhere (a repository, a chat message, a pipe), so reading it is
bounded before YAML sees it: regular files (or stdin) only, at most `MAX_BYTES`, UTF-8, and a YAML
subset without anchors, aliases or tags (a 331-byte alias bomb expands to gigabytes; `!!python/...`
tags construct objects), nested at most `MAX_DEPTH` deep, at most `MAX_EVENTS` nodes, without
duplicate keys: checked on the parser's events, before anything is composed or expanded. Every problem is
one `UsageError` line (exit 2) naming the file and the fix, cut to a readable length.

`-f` accepts three forms of the same settings, told apart by their keys:
- a job file: snake_case keys (`gpu_per_pod: 1`), what `submitter render -o jobfile` writes;
- a Helm values file: camelCase keys (`gpuPerPod: 1`), what `--helm-values` writes;
- a rendered manifest stream or List (`submitter render > job.yaml`): the job document is read
  from the RayJob's head container (env `SUBMITTER_JOB`).
"""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
from typing import Any, Mapping

import yaml

from submitter.contract import naming
from submitter.contract.errors import UsageError
from submitter.contract.spec import (GROUPS, MAX_INT_LITERAL, JobSpec, OversizedNumber, camel,
                                     defaults, normalize_keys, parse_document)

#: Largest job file read (a job file is a few KiB; a manifest stream a few tens).
MAX_BYTES = 1 << 20
#: Deepest nesting accepted (a job file needs 2: `env: {A: b}`; manifests about 12).
MAX_DEPTH = 64
#: Most YAML nodes (events) accepted: a rendered job is a few thousand, a job file about 150.
MAX_EVENTS = 50_000
#: Longest piece of user text quoted in an error line.
MAX_QUOTE = 80


class JobFileError(UsageError):
    """A job file cannot be read or is not a job file (one line, exit code 2)."""


def cut(text: str, limit: int = MAX_QUOTE) -> str:
    """`text` on one line, at most about `limit` characters: an error never carries 50 MB."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit] + f"... ({len(flat)} characters)"


# --- reading ----------------------------------------------------------------------------------

def read_bytes(path: str, limit: int = MAX_BYTES) -> bytes:
    """At most `limit` bytes of a regular file (or stdin for "-"); refuses devices, FIFOs,
    directories and larger files without reading more than `limit + 1` bytes."""
    if path == "-":
        data = sys.stdin.buffer.read(limit + 1)
    else:
        try:
            # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise JobFileError(f"cannot read job file {cut(path)}: {e.strerror}") from None
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
                raise JobFileError(f"job file {cut(path)} is {what}; give a YAML file")
            chunks, size = [], 0
            while size <= limit:
                chunk = os.read(fd, limit + 1 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
        except OSError as e:
            raise JobFileError(f"cannot read job file {cut(path)}: {e.strerror}") from None
        finally:
            os.close(fd)
    if len(data) > limit:
        raise JobFileError(f"job file {cut(path)} is larger than {limit // 1024} KiB; a job file "
                           "holds settings only")
    return data


def decode(data: bytes, path: str) -> str:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise JobFileError(f"job file {cut(path)} is not UTF-8 text (byte {e.start}); is it a "
                           "binary file?") from None
    if "\x00" in text:
        raise JobFileError(f"job file {cut(path)} contains NUL characters; is it a binary file?")
    return text


def _yaml12_ints(base: Any) -> Any:
    """`base` without YAML 1.1's base-60 integers, which would read `replicas: 1:2` as 62;
    Helm (Go) reads it as the text "1:2", and so do we."""
    import re

    int_tag = "tag:yaml.org,2002:int"
    loader = type("Loader", (base,), {})
    loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != int_tag]
        for first, resolvers in base.yaml_implicit_resolvers.items()}
    loader.add_implicit_resolver(
        int_tag, re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)"
                            r"|[-+]?0x[0-9a-fA-F_]+)$"), list("-+0123456789"))
    loader.add_constructor(int_tag, _construct_int)
    return loader


def _construct_int(loader: Any, node: Any) -> Any:
    """YAML's int, or past int()'s 4,300-digit limit (a ValueError traceback in PyYAML) an
    OversizedNumber, which the setting's check refuses by name, like any out-of-range number."""
    text = str(node.value).replace("_", "")
    if text.lstrip("+-").isdigit() and len(text.lstrip("+-")) > MAX_INT_LITERAL:
        return OversizedNumber(len(text.lstrip("+-")), text.startswith("-"))
    return yaml.constructor.SafeConstructor.construct_yaml_int(loader, node)


#: libyaml when present: parsing 1 MiB takes a fifth of a second instead of several seconds.
_LOADER = _yaml12_ints(getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def check_events(text: str) -> None:
    """Refuse, from the parser's events and before anything is composed or expanded: aliases,
    anchors, explicit tags, nesting deeper than MAX_DEPTH, more than MAX_EVENTS nodes and
    duplicate keys. Raises JobFileError (without the file name) or yaml.YAMLError."""
    stack: list[list[Any]] = []  # per open collection: [is_mapping, next_is_key, keys seen]
    for count, event in enumerate(yaml.parse(text, Loader=_LOADER)):
        where = _line(event)
        if count > MAX_EVENTS:
            raise JobFileError(f"more than {MAX_EVENTS} YAML nodes{where}; a job file is a short "
                               "mapping of settings")
        if isinstance(event, yaml.AliasEvent):
            raise JobFileError(f"YAML aliases (*{cut(event.anchor, 40)}){where} are not allowed "
                               "in a job file; write the value out")
        if getattr(event, "anchor", None) is not None:
            raise JobFileError(f"YAML anchors (&{cut(event.anchor, 40)}){where} are not allowed "
                               "in a job file; write the value out")
        tag = getattr(event, "tag", None)
        if tag is not None and tag != "!":
            raise JobFileError(f"YAML tags ({cut(tag, 40)}){where} are not allowed in a job file; "
                               "write plain values")
        if isinstance(event, (yaml.ScalarEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            parent = stack[-1] if stack else None
            if parent is not None and parent[0]:
                if parent[1] and isinstance(event, yaml.ScalarEvent):
                    key = (event.value, event.style is None)
                    if key in parent[2]:
                        raise JobFileError(f"key {cut(event.value, 40)!r} appears twice{where}; "
                                           "keep one")
                    parent[2].add(key)
                parent[1] = not parent[1]
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            stack.append([isinstance(event, yaml.MappingStartEvent), True, set()])
            if len(stack) > MAX_DEPTH:
                raise JobFileError(f"nesting deeper than {MAX_DEPTH} levels{where}; a job file "
                                   "is a flat mapping of settings")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            stack.pop()


def _line(event: Any) -> str:
    mark = getattr(event, "start_mark", None)
    return f" (line {mark.line + 1})" if mark is not None else ""


def parse(text: str, path: str) -> list[Any]:
    """Every YAML document of `text`, after `check_events` refused what it refuses."""
    try:
        check_events(text)
        docs = list(yaml.load_all(text, Loader=_LOADER))  # no aliases, tags or deep nesting left
    except JobFileError as e:
        raise JobFileError(f"job file {cut(path)}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = cut(getattr(e, "problem", None) or "syntax error", 60)
        raise JobFileError(f"job file {cut(path)} is not valid YAML{where} ({problem}); check "
                           "its syntax") from None
    except RecursionError:
        raise JobFileError(f"job file {cut(path)} is nested too deeply") from None
    return [d for d in docs if d is not None]


def load(path: str | None) -> dict[str, Any]:
    """The settings of a job file, values file or manifest stream, as snake_case keys
    (`{}` for no file). Raises JobFileError (exit 2) for anything else."""
    if path is None:
        return {}
    docs = parse(decode(read_bytes(path), path), path)
    if not docs:
        return {}
    if _is_manifest(docs):
        return from_manifests(docs, path)
    if len(docs) > 1:
        raise JobFileError(f"job file {cut(path)} holds {len(docs)} YAML documents; a job file is "
                           "one mapping of settings")
    data = docs[0]
    if not isinstance(data, dict):
        raise JobFileError(f"job file {cut(path)} must be a mapping of settings, e.g. 'replicas: 8'")
    from submitter.helm_code import CODE_KEY

    # a --script job's values file (--helm-values) carries its code for the chart; render and
    # submit pack the script's directory again
    return settings({k: v for k, v in data.items() if k != CODE_KEY}, path)


def settings(data: Mapping[Any, Any], path: str) -> dict[str, Any]:
    """Check the one spelling of the keys: snake_case (a job file) or camelCase throughout (a Helm
    values file); then field names (unknown keys raise SpecError with a suggestion)."""
    snake = {f.name for f in dataclasses.fields(JobSpec)}
    camels = {camel(n): n for n in snake if camel(n) != n}
    for key in data:
        if not isinstance(key, str):
            raise JobFileError(f"job file {cut(path)}: setting names are text, got {cut(repr(key), 40)}")
        if "-" in key and key.replace("-", "_") in snake:
            raise JobFileError(f"job file {cut(path)}: key {cut(key, 40)!r} is spelled with '-'; job "
                               f"files use snake_case: {key.replace('-', '_')}")
    used_camel = sorted(k for k in data if k in camels)
    used_snake = sorted(k for k in data if k in snake and "_" in k)
    if used_camel and used_snake:
        raise JobFileError(f"job file {cut(path)} mixes Helm values keys ({used_camel[0]}) and job "
                           f"file keys ({used_snake[0]}); use snake_case ({camels[used_camel[0]]}) "
                           "throughout")
    return normalize_keys(data)


def _is_manifest(docs: list[Any]) -> bool:
    first = docs[0]
    return isinstance(first, dict) and "apiVersion" in first and "kind" in first


def from_manifests(docs: list[Any], path: str) -> dict[str, Any]:
    """The settings of a rendered job: the RayJob head container's `SUBMITTER_JOB` document."""
    objects: list[Any] = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "List":
            objects.extend(doc.get("items") or [])
        else:
            objects.append(doc)
    rayjobs = [o for o in objects if isinstance(o, dict) and o.get("kind") == "RayJob"]
    if len(rayjobs) != 1:
        raise JobFileError(f"job file {cut(path)} is a Kubernetes manifest with "
                           f"{len(rayjobs) or 'no'} RayJob(s); give the output of `submitter "
                           "render` (one job) or a job file (`submitter render -o jobfile`)")
    document = _head_env(rayjobs[0]).get(naming.ENV_JOB)
    if not isinstance(document, str):
        raise JobFileError(f"job file {cut(path)}: its RayJob carries no {naming.ENV_JOB} job "
                           "document (was it rendered by submitter?)")
    values = normalize_keys(parse_document(document))
    return values


def _head_env(rayjob: Mapping[str, Any]) -> dict[str, Any]:
    try:
        containers = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]
        return {e.get("name"): e.get("value") for c in containers for e in (c.get("env") or [])
                if isinstance(e, dict)}
    except (KeyError, TypeError):
        return {}


# --- writing ----------------------------------------------------------------------------------

HEADER = """\
# submitter job file: every setting of one job, with its help and default.
# Use it with `submitter render -f FILE` or `submitter submit -f FILE` (flags override it).
# Keys are snake_case, as here. (A Helm values file, `render --helm-values`, spells the
# same settings in camelCase; -f reads that too.) Written by `submitter render -o jobfile`.
"""


def dump(spec: JobSpec) -> str:
    """The job file of `spec`: every setting grouped as in `--help`, a comment per key (its help
    and default). `load` of the text gives back exactly `spec.to_dict()`."""
    from submitter.plan import to_yaml

    values, default = spec.to_dict(), defaults()
    lines = [HEADER]
    by_group: dict[str, list[dataclasses.Field]] = {g: [] for g in GROUPS}
    for f in dataclasses.fields(JobSpec):
        by_group.setdefault(f.metadata["group"], []).append(f)
    for group, members in by_group.items():
        if not members:
            continue
        lines.append(f"\n# --- {group} " + "-" * max(3, 86 - len(group)) + "\n")
        for f in members:
            shown = default[f.name]
            note = "" if shown == values[f.name] else f" (default: {cut(repr(shown), 40)})"
            lines.append(f"# {f.metadata['help']}{note}\n")
            lines.append(to_yaml({f.name: values[f.name]}, stream=False))
    return "".join(lines)
