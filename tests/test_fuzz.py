"""Fuzzing (#9 item 8): JobSpec, the CLI (render with random flags) and job files, with a fixed,
derandomized budget of CASES cases per run in total (the same cases every run: CI is
reproducible, a failure is a test to fix, not a flake).

Every case must be a clean refusal (a UsageError: exit 2, one line, no traceback) or a render
whose YAML parses to exactly the intended settings: the pod's job document gives back the same
JobSpec, the YAML text parses back to the same objects, and no value ever becomes structure
(every key of every rendered object is one the templates write: no injection).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from submitter import jobfile
from submitter.cli import main
from submitter.contract import naming
from submitter.contract.errors import SubmitterError, UsageError
from submitter.contract.spec import JobSpec, camel, parse_selector, field_types, flag_name, normalize_keys
from submitter.render import render

#: Cases per test; the total is the suite's budget per CI run (>= 10,000).
BUDGET = {"jobspec": 5000, "cli": 2000, "jobfile": 3500}
CASES = sum(BUDGET.values())
COUNTS = {name: 0 for name in BUDGET}
#: Outcomes, for the report: rendered (and checked) or cleanly refused.
OUTCOMES = {"rendered": 0, "refused": 0}

FIELDS = [f.name for f in dataclasses.fields(JobSpec)]
TYPES = field_types()


def fuzz_settings(name: str) -> Any:
    return settings(max_examples=BUDGET[name], derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck), print_blob=True)


# --- values ---------------------------------------------------------------------------------------

NASTY = ["", " ", "-", "--fsdp", "-x", "a\nb", "a\rb", "\x00", "\t", "${HOME}", "$(id)", "{{ 7*7 }}",
         "{% raw %}", "'", '"', "\\", ": ", "- a", "#c", "&a", "*a", "!!python/object:os.system",
         "|", ">", "%", "@", "`", "~", "null", "Null", "true", "yes", "on", "no", "0x10", "0o17",
         "1e3", "1_000", ".5", "+1", "-1", "٤", "４", "\u2028", "\u202e", "\ud800", "\U0001f600",
         "é", "a" * 1025, "s3://b/r", "S3://b/r", "gs://b", "/mnt/checkpoints/x", "/tmp/x",
         "runs", "../x", "file:///mnt/checkpoints", "16Gi", "0", "500m", "1.5", "2147483648",
         "-2147483649", "nan", "inf", "gpt2-small", "tiny", "ReadWriteMany", "Always", "byte",
         "gpt2-demo", "A=1", "=x", "KEY=", "SUBMITTER_JOB=x", "PATH=/bin"]
#: Numbers at the edge (#19 item 8), as text: past int32, 400 digits (a float overflows), past
#: int()'s 4,300-digit limit, floats that overflow, infinities and NaN in YAML's and JSON's words.
NUMERIC_EXTREMES = ["9" * 400, "-" + "9" * 400, "9" * 5000, "-" + "9" * 5000, "9" * 400 + ".5",
                    "1e999", "-1e999", "1.0e+999", "2e308", ".inf", "-.inf", ".nan", "inf",
                    "-Infinity", "NaN"]
#: Past what a whole number (int32) or a Kubernetes quantity (2^63-1) holds, yet a finite float.
WHOLE_EXTREMES = ["9" * 20, "-" + "9" * 20, "99999999999999999999Gi"]
NASTY += NUMERIC_EXTREMES + WHOLE_EXTREMES

scalar_text = st.one_of(st.sampled_from(NASTY), st.text(max_size=20),
                        st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True))
numbers = st.one_of(st.integers(-2**40, 2**40), st.integers(-3, 70),
                    st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.sampled_from([10**400, -10**400, 2**63, 1e308, -1e308]))


def value_for(name: str) -> st.SearchStrategy:
    kind = TYPES[name]
    anything = st.one_of(scalar_text, numbers, st.none())
    if kind is dict:
        pairs = st.dictionaries(st.one_of(scalar_text, st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True)),
                                scalar_text, max_size=3)
        return st.one_of(pairs, anything, st.lists(scalar_text, max_size=2))
    if kind is list:
        return st.one_of(st.lists(scalar_text, max_size=3), anything)
    return st.one_of(anything, anything, st.lists(scalar_text, max_size=1), st.just({"a": 1}))


#: Free text that every check accepts yet is full of YAML/Jinja/shell syntax: injection bait.
bait_text = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1,
                    max_size=24).filter(lambda t: t.strip() == t and not t.startswith("-"))


def valid_value(name: str) -> st.SearchStrategy:
    """Values the field's own check is likely to accept (its default, the sample of
    tests/test_settings.py, values inside its schema's bounds, bait text for free text)."""
    from tests.test_settings import SAMPLES

    f = next(f for f in dataclasses.fields(JobSpec) if f.name == name)
    check, kind = f.metadata["check"], TYPES[name]
    schema = getattr(check, "schema", {}) if check is not None else {}
    pool = [st.just(defaults_[name]), st.just(SAMPLES.get(name, defaults_[name]))]
    if "enum" in schema:
        pool.append(st.sampled_from(schema["enum"]))
    if kind is int:
        pool.append(st.integers(schema.get("minimum", 0), schema.get("maximum", 2**31 - 1)))
    if kind is float:
        pool.append(st.floats(0.0001, 99.0))
    if kind is bool:
        pool.append(st.booleans())
    if kind is dict:
        pool.append(st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,6}", fullmatch=True), bait_text, max_size=3))
    if check is not None and check.__name__ == "_text":
        pool.append(bait_text)
    if name == "storage_path":
        pool.append(bait_text.map(lambda t: "/mnt/checkpoints/" + t.lstrip("/")))
        pool.append(bait_text.map(lambda t: "s3://bucket/" + t.lstrip("/")))
    return st.one_of(pool)


defaults_ = __import__("submitter.contract.spec", fromlist=["defaults"]).defaults()


@st.composite
def settings_maps(draw: Any) -> dict[str, Any]:
    """Mostly valid settings, and in half the cases one field set to anything at all."""
    names = draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=12))
    values = {"name": "j", **{n: draw(valid_value(n)) for n in names}}
    if draw(st.booleans()):
        bad = draw(st.sampled_from(FIELDS))
        values[bad] = draw(value_for(bad))
    return values


# --- what a render must be --------------------------------------------------------------------------

def _keys(obj: Any, out: set[str]) -> set[str]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.add(k)
            _keys(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _keys(v, out)
    return out


def _rich_specs() -> list[JobSpec]:
    """Specs that switch every optional part of the templates on: each setting's sample alone
    (tests/test_settings.py, as that test builds them) and all of them at once."""
    from tests.test_settings import NEEDS, SAMPLES

    specs = [JobSpec.build({"name": "j"})]
    for name, value in SAMPLES.items():
        specs.append(JobSpec.build({"name": "j", **NEEDS.get(name, {}), name: value}))
    try:
        specs.append(JobSpec.build({**SAMPLES, "name": "j"}))
    except UsageError:
        pass
    return [s for s in specs if _renders(s)]


def _renders(spec: JobSpec) -> bool:
    try:
        render(spec)
    except UsageError:
        return False
    return True


def _user_keys(spec: JobSpec) -> set[str]:
    """Keys the user chose (env names, the keys of any mapping setting, and the GPU product
    label key, which becomes a nodeSelector key): data, not structure."""
    chosen = {k for v in spec.to_dict().values() if isinstance(v, dict) for k in v}
    selectors = {k for text in (spec.operator_selector, spec.metrics_selector)
                 for k in parse_selector(text)}  # --operator/--metrics-selector: matchLabels keys
    return chosen | selectors | ({spec.gpu_type_label} if spec.gpu_type else set())


#: Every key the templates write (over specs that switch every optional part on or off), plus
#: the label and annotation keys the objects carry. A key outside this set is an injection.
KNOWN_KEYS = set().union(*(_keys(list(render(s)), set()) for s in _rich_specs()))


def check_render(spec: JobSpec) -> None:
    """A render of `spec` is exactly `spec`: or a clean refusal (storage policy)."""
    try:
        plan = render(spec)
    except UsageError as e:
        check_refusal(e)
        return
    OUTCOMES["rendered"] += 1
    text = str(plan)
    parsed = list(yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    assert parsed == list(plan)  # the YAML text is the objects, nothing more
    unknown = _keys(parsed, set()) - KNOWN_KEYS - _user_keys(spec)
    assert not unknown, f"values became keys: {sorted(unknown)[:5]}"
    rayjob = next(o for o in parsed if o["kind"] == "RayJob")
    document = jobfile._head_env(rayjob)[naming.ENV_JOB]
    assert JobSpec.from_document(document) == spec  # the pod gets exactly these settings
    assert all(o["metadata"]["name"].startswith(spec.name) or o["metadata"]["name"] == spec.existing_pvc
               for o in parsed)


def check_refusal(e: BaseException) -> None:
    OUTCOMES["refused"] += 1
    assert isinstance(e, UsageError), repr(e)
    message = str(e)
    assert message and "\n" not in message and "\r" not in message, repr(message[:200])
    assert len(message) <= 1000, len(message)
    assert "Traceback" not in message


# --- the tests --------------------------------------------------------------------------------------

def test_fuzz_jobspec_build_and_render():
    @fuzz_settings("jobspec")
    @given(settings_maps())
    def case(values: dict[str, Any]) -> None:
        COUNTS["jobspec"] += 1
        try:
            spec = JobSpec.build(values)
        except SubmitterError as e:
            check_refusal(e)
            return
        assert JobSpec.from_document(spec.document()) == spec
        assert JobSpec.build(spec.to_values()) == JobSpec.build(spec.to_dict()) == spec
        check_render(spec)

    case()
    assert COUNTS["jobspec"] >= BUDGET["jobspec"]


def _argv(name: str, value: Any) -> list[str]:
    kind, flag = TYPES[name], flag_name(name)
    if kind is bool:
        return [flag] if value else [f"--no-{flag[2:]}"]
    if kind in (dict, list):
        return [f"{flag}={v}" for v in value]
    return [f"{flag}={value}"]


@st.composite
def cli_values(draw: Any) -> dict[str, Any]:
    """Flags as a user types them: mostly valid values as text, sometimes any text."""
    out: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=6)):
        value = draw(valid_value(name)) if draw(st.integers(0, 3)) else draw(scalar_text)
        if TYPES[name] is dict:
            value = [f"{k}={v}" for k, v in value.items()] if isinstance(value, dict) else [str(value)]
        elif TYPES[name] is list:
            value = [str(v) for v in value] if isinstance(value, list) else [str(value)]
        elif TYPES[name] is not bool or not isinstance(value, bool):
            value = "" if value is None else str(value)
        out[name] = value
    return out


def test_fuzz_cli_render_with_random_flags():
    runner = CliRunner()

    @fuzz_settings("cli")
    @given(cli_values())
    def case(values: dict[str, Any]) -> None:
        COUNTS["cli"] += 1
        values.setdefault("name", "j")
        flags: dict[str, Any] = {}
        for name, value in values.items():  # what each flag means, as the CLI's types see it
            kind = TYPES[name]
            if kind is bool:
                value = value if isinstance(value, bool) else True
            elif kind in (dict, list):
                value = value if isinstance(value, list) else [str(value)]
            elif not isinstance(value, str):
                value = str(value).lower() if isinstance(value, bool) else ",".join(map(str, value))
            flags[name] = value
        argv = ["render"] + [a for name, value in flags.items() for a in _argv(name, value)]
        result = runner.invoke(main, argv)
        try:
            from submitter.contract.spec import parse_pairs

            intended = {n: (parse_pairs(flag_name(n), v) if TYPES[n] is dict else v) for n, v in flags.items()}
            want = str(render(JobSpec.build(**intended)))
        except UsageError:
            want = None
        assert "Traceback" not in result.output
        OUTCOMES["refused" if want is None else "rendered"] += 1
        if want is None:
            assert result.exit_code == 2, (argv, result.output)
            assert isinstance(result.exception, SystemExit)
            lines = result.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), (argv, result.stderr)
            assert result.stdout == ""
        else:
            assert result.exit_code == 0, (argv, result.output)
            assert result.stdout == want

    case()
    assert COUNTS["cli"] >= BUDGET["cli"]


@pytest.fixture(scope="module")
def scratch() -> Any:
    with tempfile.TemporaryDirectory(prefix="fuzz-jobfiles-") as d:
        yield d


key_spellings = st.one_of(st.sampled_from(FIELDS), st.sampled_from(FIELDS).map(camel),
                          st.sampled_from(FIELDS).map(lambda n: n.replace("_", "-")), scalar_text)
raw_scalar = st.one_of(st.sampled_from(NASTY), st.text(max_size=12),
                       st.sampled_from(["&a x", "*a", "!!str x", "!x y", "[1, [2", "{a: 1}", "[]", "{}",
                                        "? a", "<<: {a: 1}", "'q", '"\\x"', "|\n  b", "2026-01-01",
                                        "0b11", "1:20", ".inf", ".nan", "~"]))


@st.composite
def job_file_text(draw: Any) -> str:
    """YAML text: mostly a mapping of (variously spelled) keys to dumped or raw values, sometimes
    garbage, nesting, several documents or bytes that are not UTF-8."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.text(max_size=60))
    if kind == 1:
        return draw(st.sampled_from(["[", "{"])) * draw(st.integers(1, 200))
    lines = []
    if kind >= 5:  # a real job file (or values file), as render -o jobfile / --helm-values write
        values = draw(settings_maps())
        spell = camel if kind == 9 else (lambda n: n)
        lines.append(yaml.safe_dump({spell(k): v for k, v in values.items()}, width=1 << 20).strip())
        if kind <= 6:
            return "\n".join(lines) + "\n"
    for key in draw(st.lists(key_spellings, max_size=6)):
        if draw(st.booleans()):
            value = yaml.safe_dump(draw(st.one_of(value_for(draw(st.sampled_from(FIELDS))))),
                                   default_flow_style=True, width=1 << 20).strip()
            value = value.removesuffix("\n...").removesuffix("...").strip()
        else:
            value = draw(raw_scalar)
        lines.append(f"{yaml.safe_dump(key, default_flow_style=True).strip().removesuffix('...').strip()}: {value}")
    text = "\n".join(lines) + "\n"
    if kind == 2:
        text += "---\n" + text
    return text


def test_fuzz_job_files(scratch):
    path = os.path.join(scratch, "job.yaml")
    runner = CliRunner()

    @fuzz_settings("jobfile")
    @given(job_file_text(), st.integers(0, 9).map(lambda n: n == 0))
    def case(text: str, as_bytes: bool) -> None:
        COUNTS["jobfile"] += 1
        data = text.encode("utf-8", "surrogatepass")
        with open(path, "wb") as fh:
            fh.write(data if not as_bytes else b"\xff" + data)
        if COUNTS["jobfile"] % 10 == 0:  # every tenth file also through the command line
            result = runner.invoke(main, ["render", "-f", path])
            assert "Traceback" not in result.output and result.exit_code in (0, 2), result.output
            assert result.exit_code == 0 or (len(result.stderr.splitlines()) == 1 and result.stdout == "")
        try:
            values = jobfile.load(path)
            spec = JobSpec.build(values)
        except SubmitterError as e:
            check_refusal(e)
            return
        # accepted: exactly what a plain YAML parser reads from the file, nothing more or less
        plain = yaml.safe_load(data.decode("utf-8-sig"))
        assert spec == JobSpec.build(normalize_keys(plain or {}))
        check_render(spec)

    case()
    assert COUNTS["jobfile"] >= BUDGET["jobfile"]


# --- numbers at the edge, every numeric field, every source (not random: all of them) ------------

def _numeric_fields() -> list[str]:
    """Fields that hold a number: ints, floats, Kubernetes quantities and --replicas."""
    out = []
    for f in dataclasses.fields(JobSpec):
        check = getattr(f.metadata["check"], "__name__", "")
        if TYPES[f.name] in (int, float) or check in ("_positive_quantity", "_replicas"):
            out.append(f.name)
    return out


NUMERIC_FIELDS = _numeric_fields()


def test_the_numeric_fields_are_found():
    assert {"learning_rate", "epochs", "seed", "cpu_per_pod", "memory_per_pod", "replicas",
            "val_percent", "global_batch_size"} <= set(NUMERIC_FIELDS)


def _one_line_exit_2(result: Any, what: str) -> None:
    assert "Traceback" not in result.output, what
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (what, result.output[-300:])
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) <= 300, (what, lines)
    assert result.stdout == ""


@pytest.mark.parametrize("name", NUMERIC_FIELDS)
def test_numeric_extremes_are_refused_with_one_line_from_every_source(name, scratch):
    """Flags, job files (snake_case), Helm values files (camelCase) and the pod's job document:
    huge integers (400 and 5,000 digits), overflowing floats, +-inf and NaN are one line, exit 2."""
    runner = CliRunner()
    path = os.path.join(scratch, f"extreme-{name}.yaml")
    for text in NUMERIC_EXTREMES + (WHOLE_EXTREMES if TYPES[name] is not float else []):
        what = f"{name}={text[:12]}...({len(text)})"
        _one_line_exit_2(runner.invoke(main, ["render", "--name", "j", f"{flag_name(name)}={text}"]),
                         "flag " + what)
        for key in (name, camel(name)):  # a job file, a values file
            with open(path, "w") as fh:
                fh.write(f"name: j\n{key}: {text}\n")
            _one_line_exit_2(runner.invoke(main, ["render", "-f", path]), f"file {key} {what}")
        literal = {".inf": "Infinity", "-.inf": "-Infinity", ".nan": "NaN", "inf": "Infinity"}.get(text, text)
        for document in ('{"name":"j","%s":%s}' % (camel(name), literal),
                         '{"name":"j","%s":"%s"}' % (camel(name), text)):
            with pytest.raises(UsageError) as refused:
                JobSpec.from_document(document)
            check_refusal(refused.value)


def test_python_values_at_the_edge_are_refused_not_raised():
    """The Python API (JobSpec.build) with ints past int()'s print limit and non-finite floats."""
    for name in NUMERIC_FIELDS:
        for value in (10**400, -10**400, 10**5000, float("inf"), float("-inf"), float("nan")):
            with pytest.raises(UsageError) as refused:
                JobSpec.build({"name": "j", name: value})
            check_refusal(refused.value)


def test_the_budget_is_at_least_ten_thousand_cases():
    print(f"fuzz cases: {COUNTS} (total {sum(COUNTS.values())}); outcomes {OUTCOMES}")
    assert CASES >= 10_000
