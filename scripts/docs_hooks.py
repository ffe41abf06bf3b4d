"""MkDocs hooks (mkdocs.yml `hooks:`): what the generated reference pages need at build time.

- The CLI's cluster commands are loaded into the group before mkdocs-click reads it: `submitter`
  imports them only when one runs (`submitter render` must not pay for them), and mkdocs-click
  lists the group's loaded commands.
- `<!-- helm-values-reference -->` in a page becomes a table of every key of
  `charts/submitter/values.schema.json` (type, default from `values.yaml`, description), so the
  reference is the schema Helm validates against and cannot drift from it (`values_table` is
  pure: a test calls it without MkDocs).
- `<!-- exit-codes -->` becomes the table of `submitter.contract.errors.EXIT_CODES`, the one the
  `submitter --help` epilog prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import yaml

MARKER = "<!-- helm-values-reference -->"
EXIT_CODES_MARKER = "<!-- exit-codes -->"
CHART = Path(__file__).resolve().parent.parent / "charts" / "submitter"


def _type(prop: Mapping[str, Any]) -> str:
    """The schema's type(s) of one key: `string`, `integer or null`, `one of: a, b`."""
    if "enum" in prop:
        return "one of: " + ", ".join(f"`{v}`" for v in prop["enum"])
    options = prop.get("anyOf") or [prop]
    names: list[str] = []
    for option in options:
        kind = option.get("type", "string" if "maxLength" in option or "pattern" in option else None)
        if kind and kind not in names:
            names.append(kind)
    return " or ".join(names) or "any"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def values_table(schema: Mapping[str, Any], defaults: Mapping[str, Any]) -> str:
    """The Markdown table of every top-level key, in the schema's order, plus its conditions."""
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, prop in schema["properties"].items():
        default = json.dumps(defaults.get(key))
        rows.append(f"| <span id=\"{key}\"></span>`{key}` | {_cell(_type(prop))} | `{_cell(default)}` | "
                    f"{_cell(prop.get('description', ''))} |")
    if "if" in schema and "then" in schema:
        given = ", ".join(f"`{k}: {json.dumps(v.get('const'))}`" for k, v in schema["if"]["properties"].items())
        then = ", ".join(f"`{k}` {', '.join(f'{c} {n}' for c, n in v.items())}"
                         for k, v in schema["then"]["properties"].items())
        rows += ["", f"Also checked by the schema: with {given}, {then}."]
    return "\n".join(rows)


def chart_table(chart: Path = CHART) -> str:
    schema = json.loads((chart / "values.schema.json").read_text())
    defaults = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    return values_table(schema, defaults)


def on_config(config: Any, **_: Any) -> Any:
    from submitter import cli, cli_cluster, cli_data

    for command in (*cli_cluster.COMMANDS, cli_data.data):  # the lazily loaded commands
        cli.main.add_command(command)
    return config


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, chart_table())
    if EXIT_CODES_MARKER in markdown:
        from submitter.contract.errors import exit_codes_markdown

        markdown = markdown.replace(EXIT_CODES_MARKER, exit_codes_markdown())
    return markdown
