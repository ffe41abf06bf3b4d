"""The docs site: it builds strictly, its generated references cover the code, and the commands
it shows run.

A fenced `console` block preceded by `<!-- runnable -->` (or `<!-- runnable: cluster -->`,
`<!-- runnable: local -->`) is executed: each `$ ` line (continued by a trailing `\\`) runs in
bash, in one fresh directory per block, and its output (stdout and stderr) must be the lines
shown under it, where `...` stands for any text (as doctest's ELLIPSIS). `cluster` blocks run
against the Kubernetes API emulator (KUBECONFIG points at it); `local` blocks train for real and
are marked slow.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

DOCS = ROOT / "docs"
MARKER = re.compile(r"^<!-- runnable(?::\s*(\w+))?\s*-->\s*$")


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    kind: str
    steps: tuple[tuple[str, str], ...]  # (command, expected output)

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def examples(root: Path = DOCS) -> list[Example]:
    """Every runnable block of every page."""
    found = []
    for page in sorted(root.rglob("*.md")):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            match = MARKER.match(line)
            if not match:
                continue
            assert lines[i + 1].startswith("```console"), f"{page}:{i + 1}: a runnable marker needs a console block"
            end = lines.index("```", i + 2)
            found.append(Example(str(page.relative_to(ROOT)), i + 1, match.group(1) or "render",
                                 parse_session(lines[i + 2:end])))
    return found


def parse_session(lines: list[str]) -> tuple[tuple[str, str], ...]:
    """`$ command` lines (with `\\` continuations) and the output lines under each."""
    steps: list[tuple[str, list[str]]] = []
    continued = False
    for line in lines:
        if line.startswith("$ ") or continued:
            text = line[2:] if line.startswith("$ ") and not continued else line
            if continued:
                steps[-1] = (steps[-1][0] + "\n" + text, steps[-1][1])
            else:
                steps.append((text, []))
            continued = line.endswith("\\")
        else:
            steps[-1][1].append(line)
    return tuple((cmd, "\n".join(out)) for cmd, out in steps)


def matches(expected: str, actual: str) -> bool:
    """The shown output, with `...` standing for any text (newlines included)."""
    pattern = ".*?".join(re.escape(part) for part in expected.strip().split("..."))
    return re.fullmatch(pattern, actual.strip(), re.DOTALL) is not None


def run_example(example: Example, cwd: Path, env: dict[str, str]) -> None:
    # the project's own `submitter` (this interpreter's scripts folder) comes first on PATH
    env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
           "COLUMNS": "100", "NO_COLOR": "1"}
    for command, expected in example.steps:
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=900)
        actual = done.stdout + done.stderr
        assert matches(expected, actual), (f"{example}: `{command}` printed (exit {done.returncode}):\n"
                                           f"{actual}\n--- the page shows:\n{expected}")


EXAMPLES = examples()


def _ids(kind: str) -> list:
    return [pytest.param(e, id=str(e)) for e in EXAMPLES if e.kind == kind]


def test_the_runnable_markers_are_found_and_known():
    assert {e.kind for e in EXAMPLES} <= {"render", "cluster", "local"}
    assert len(_ids("render")) >= 3 and _ids("cluster") and _ids("local")
    assert matches("a ... c", "a b\nb c") and not matches("a c", "a b c")


@pytest.mark.parametrize("example", _ids("render"))
def test_render_examples_print_what_the_page_shows(example, tmp_path):
    # no kubeconfig: the namespace is `default`, whatever the machine's context says
    run_example(example, tmp_path, {**os.environ, "KUBECONFIG": str(tmp_path / "no-kubeconfig")})


@pytest.mark.parametrize("example", _ids("cluster"))
def test_cluster_examples_against_the_api_emulator(example, kubeconfig, tmp_path):
    run_example(example, tmp_path, {**os.environ, "KUBECONFIG": kubeconfig})


def test_the_local_examples_are_the_end_to_end_runs_command():
    """A `<!-- runnable: local -->` example trains for real: tests/submitter/test_local.py's
    end-to-end run is that command (one Ray run checks the page and all the rest)."""
    from tests.submitter.test_local import LOCAL_EXAMPLE

    assert [e.steps[0][0] for e in EXAMPLES if e.kind == "local"] == [LOCAL_EXAMPLE.steps[0][0]]


# --- the site ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this module's checks; a strict build that fails fails them."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(out)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_mkdocs_build_strict(site):
    """A broken link, a missing page or anchor, or a reference that no longer resolves fails."""
    cli = (site / "reference" / "cli" / "index.html").read_text()
    from submitter.cli import main

    for name in main.list_commands(None):  # the lazily loaded cluster commands included
        assert f'id="submitter-{name}"' in cli, name
    api = (site / "reference" / "api" / "index.html").read_text()
    for name in ("submit", "watch", "status", "stop", "resume", "delete"):
        assert f'id="submitter.api.{name}"' in api, name
    helm = (site / "reference" / "helm-values" / "index.html").read_text()
    assert 'id="storagePath"' in helm and 'id="gpuPerPod"' in helm


# --- lists that render flat: Python-Markdown is stricter than GitHub's CommonMark ----------------

LIST_ITEM = re.compile(r"^( *)(?:[-*+]|\d+\.) ")
FENCE = re.compile(r"^ *(```|~~~)")


def shallow_list_items(text: str) -> list[int]:
    """Line numbers (1-based) of list items indented 1-3 spaces, outside code blocks: Python-
    Markdown nests a list only at 4 spaces, so these render as the parent list's siblings."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := LIST_ITEM.match(line)) and 0 < len(match.group(1)) < 4:
            found.append(number)
    return found


def flat_list_lines(html: str) -> list[str]:
    """Lines of a rendered paragraph or list item that start with a list marker: a list
    Markdown took for text (no blank line before it, or a marker it did not nest)."""
    html = re.sub(r"<(pre|code)\b.*?</\1>", "", html, flags=re.DOTALL)
    return [line.strip() for block in re.findall(r"<(?:p|li)>(.*?)</(?:p|li)>", html, re.DOTALL)
            for line in block.splitlines() if re.match(r"\s*(?:[-*+]|\d+\.) ", line)]


def test_list_checks_catch_the_trap():
    assert shallow_list_items("- a\n  - b\n    - c\n```\n  - code\n```\n") == [2]
    assert flat_list_lines("<p>Text:\n- <strong>a</strong>\n- b</p><pre><code>- x</code></pre>") == [
        "- <strong>a</strong>", "- b"]
    assert flat_list_lines("<ul>\n<li>a, 1. b</li>\n</ul><p>x - y</p>") == []


def test_no_nested_list_is_indented_less_than_four_spaces():
    shallow = {str(page.relative_to(ROOT)): lines for page in sorted(DOCS.rglob("*.md"))
               if (lines := shallow_list_items(page.read_text()))}
    assert shallow == {}, "indent nested list items by 4 spaces (page: line numbers)"


def test_no_list_renders_as_a_paragraph(site):
    flat = {str(page.relative_to(site)): lines for page in sorted(site.rglob("*.html"))
            if (lines := flat_list_lines(page.read_text()))}
    assert flat == {}, "a list needs a blank line before it (page: lines that rendered as text)"


def test_the_helm_values_reference_lists_every_key_of_the_schema():
    import json

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import docs_hooks
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    schema = json.loads((ROOT / "charts" / "submitter" / "values.schema.json").read_text())
    table = docs_hooks.chart_table()
    for key in schema["properties"]:
        assert f"`{key}`" in table, key
    assert "| `\"2\"` |" in table  # replicas' default, read from values.yaml
    assert "with `fsdp: true`, `gpuPerPod` minimum 1" in table


# --- troubleshooting: one anchor per diagnosis ---------------------------------------------------

def diagnoses() -> set[str]:
    """Every reason word `status` can print as `blocked: WORD: ...` (submitter/diagnose.py): the
    literal words, the container and disruption reasons it passes on, and the event reasons as
    it names them."""
    from submitter import diagnose

    source = (ROOT / "submitter" / "diagnose.py").read_text()
    words = {node.args[0].value for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Finding"
             and node.args and isinstance(node.args[0], ast.Constant)}
    words |= diagnose.IMAGE_PULL | diagnose.CONFIG_ERRORS | set(diagnose.DISRUPTIONS.values())
    for reason in diagnose.POD_EVENT_REASONS:
        found = diagnose.pod_problem({"metadata": {"name": "p"}},
                                     [{"type": "Warning", "reason": reason, "message": "m"}])
        words.add(found.reason)
    return words


def test_every_diagnosis_status_can_print_has_its_own_anchor():
    page = (DOCS / "troubleshooting.md").read_text()
    anchors = set(re.findall(r"\{#([A-Za-z][\w-]*)\}", page))
    words = diagnoses()
    assert {"Unschedulable", "PVCNotBound", "OOMKilled", "ImagePullBackOff", "FailedToStart"} <= words
    assert words - anchors == set()
    # what status and watch print besides a blocking reason
    assert {"raycluster", "progress-unavailable", "stalled"} <= anchors
