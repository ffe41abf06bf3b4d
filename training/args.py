"""`python -m training`: the job document (and, for humans, flags) -> a validated JobSpec.

In a pod the RayJob's entrypoint is the constant `python -m training`, and the job arrives as
data: the JSON document in `$SUBMITTER_JOB` (or a file given with `--job`). The flags exist for
people running the entrypoint by hand; they are generated from the contract's fields (one flag
per JobSpec setting, grouped as in `submitter --help`) and override the document. Bad input
raises UsageError (one line, exit 2).
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Mapping, Optional, Sequence

from submitter.contract.errors import UsageError
from submitter.contract.naming import ENV_JOB
from submitter.contract.spec import (GROUPS, JobSpec, defaults, field_types, fields, flag_name,
                                     parse_document, parse_pairs)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        raise UsageError(f"{message} (see python -m training --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m training",
                description="GPT-2 pre-training on Ray Train: the RayJob's entrypoint. It reads "
                            f"the job document from ${ENV_JOB} (what `submitter render` puts in "
                            "the RayJob) or --job; flags override single settings.")
    p.add_argument("--job", metavar="PATH", help=f"a job document (JSON) [default: ${ENV_JOB}]")
    types, default = field_types(), defaults()
    for group in GROUPS:
        g = p.add_argument_group(group)
        for f in fields():
            if f.metadata["group"] != group:
                continue
            flag, kind, help_ = flag_name(f.name), types[f.name], f.metadata["help"]
            if default[f.name] not in (None, "", {}, []):
                help_ += f" [default: {default[f.name]}]"
            if kind is bool:
                g.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                               default=None, help=help_)
            elif kind in (dict, list):
                g.add_argument(flag, dest=f.name, action="append", metavar=f.metadata["metavar"],
                               help=help_)
            else:  # JobSpec coerces and checks the text, with the same messages as submitter's
                g.add_argument(flag, dest=f.name, metavar=f.metadata["metavar"] or kind.__name__.upper(),
                               help=help_.replace("%", "%%"))
    return p


def parse_args(argv: Optional[Sequence[str]] = None,
               environ: Mapping[str, str] = os.environ) -> JobSpec:
    """The job: the document (--job, else $SUBMITTER_JOB, else none) overridden by flags."""
    ns = vars(build_parser().parse_args(argv))
    document = _read_document(ns.pop("job"), environ)
    types = field_types()
    flags: dict[str, Any] = {}
    for key, value in ns.items():
        if value is not None and types[key] is dict:
            value = parse_pairs(flag_name(key), value)
        flags[key] = value
    return JobSpec.build(document, **flags)


def _read_document(path: Optional[str], environ: Mapping[str, str]) -> dict[str, Any]:
    if path is None:
        text = environ.get(ENV_JOB)
        return parse_document(text) if text else {}
    try:
        with open(path, encoding="utf-8") as f:
            return parse_document(f.read(1 << 20))
    except OSError as e:
        raise UsageError(f"--job {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--job {path} is not UTF-8 text; pass a job document (JSON)") from None
