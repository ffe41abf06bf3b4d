"""`--help` with one section per group of settings (click lists options in one flat block).

The group of a job setting is its JobSpec field's `group` (the same order as `GROUPS`), so a new
setting lands in the right section without touching this module; the other options are placed
by `OTHER_GROUPS` and anything unknown goes to "Other options" (last).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

import click

from submitter.contract.errors import EXIT_CODES
from submitter.contract.spec import GROUPS, JobSpec

#: Options that are not job settings, by parameter name.
OTHER_GROUPS = {
    "job_file": "job",
    "local": "submit", "dry_run": "submit", "watch_after": "submit",
    "output": "output", "output_dir": "output", "helm_values": "output", "force": "output",
    "kube_context": "cluster", "kubeconfig": "cluster", "namespace": "cluster",
    "request_timeout": "cluster", "namespace_from_context": "cluster",
}
#: Sections after the JobSpec groups, in this order.
TRAILING = ("submit", "output", "cluster", "other")


@lru_cache(maxsize=1)
def _field_groups() -> dict[str, str]:
    return {f.name: f.metadata["group"] for f in dataclasses.fields(JobSpec)}


def group_of(param_name: str | None) -> str:
    name = param_name or ""
    return _field_groups().get(name) or OTHER_GROUPS.get(name) or "other"


def section_order() -> tuple[str, ...]:
    return tuple(GROUPS) + TRAILING


class GroupedCommand(click.Command):
    """A command whose `--help` writes one section per option group."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                sections.setdefault(group_of(param.name), []).append(record)
        for group in [*section_order(), *sorted(set(sections) - set(section_order()))]:
            if sections.get(group):
                with formatter.section(f"{group.capitalize()} options"):
                    formatter.write_dl(sections[group])


def grouped_sections(command: Any, ctx: click.Context) -> dict[str, list[str]]:
    """{group: [option names]} of a command, in help order (for tests and docs)."""
    out: dict[str, list[str]] = {}
    for param in command.get_params(ctx):
        if param.get_help_record(ctx) is not None:
            out.setdefault(group_of(param.name), []).append(param.name)
    return out


def exit_codes_epilog(width: int = 96) -> str:
    """`--help`'s "Exit codes" table, from contract.errors.EXIT_CODES (as the docs' table is), one
    code a line wrapped under its meaning; `\\b` keeps click from re-flowing it."""
    import textwrap

    lines = ["\b", "Exit codes (docs: Reliability > Exit codes):"]
    for code, meaning in EXIT_CODES:
        lines += textwrap.wrap(meaning.replace("`", ""), width, initial_indent=f"  {code:>3}  ",
                               subsequent_indent=" " * 7)
    return "\n".join(lines)
