"""Hostile strings in every free-text field: refused with a clear error, or round-trip exactly,
and never add or change a YAML key (templates produce data, never text)."""

from __future__ import annotations

from typing import Any, Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from submitter.contract.errors import UsageError
from submitter.render import render
from submitter.contract.spec import JobSpec

HOSTILE = ["", " ", "a: b", "- x", "\n", "x\ny: z", "{{ 1 }}", "{% if %}", '"', "'", "#", "---",
           "...", "&anchor", "*alias", "!!python/object:os.system", "${HOME}", "$(rm -rf /)",
           "`id`", ";", "|", ">", "\t", "\u2028", "\x00", "é", "null", "true", "1e3", "0x1F",
           "[a, b]", "{a: b}", "%", "@", "\\", "~", "..", "/", "s3://", "C:\\x", "\r\n", "\ufeff"]

text = st.one_of(
    st.sampled_from(HOSTILE),
    st.lists(st.sampled_from(HOSTILE + ["a", "b", "0", "-", "."]), min_size=1, max_size=6).map("".join),
    st.text(max_size=40),
)

# Every free-text field, with a safe value that renders (so optional keys are present in both).
FREE_TEXT = {
    "name": "job", "namespace": "ns", "cpu_per_pod": "4", "memory_per_pod": "16Gi",
    "head_cpu": "2", "head_memory": "8Gi", "image": "repo/img:1", "image_pull_policy": "Always",
    "storage_path": "/mnt/checkpoints/x", "storage_mount": "/mnt/checkpoints",
    "storage_size": "10Gi", "storage_class": "nfs", "storage_access_mode": "ReadWriteMany",
    "existing_pvc": "pvc", "model": "tiny", "dataset": "org/ds", "dataset_config": "cfg",
    "data": "s3://b/d", "bpe_file": "/mnt/checkpoints/r",
    "gpu_type_label": "x.io/gpu", "gpu_toleration": "a:NoSchedule", "priority_class": "high",
    "queue": "q", "runtime_class": "rc", "service_account": "sa",
}


def leaves(obj: Any) -> Iterator[Any]:
    if isinstance(obj, dict):
        for v in obj.values():
            yield from leaves(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from leaves(v)
    else:
        yield obj


def key_paths(obj: Any, prefix: tuple = ()) -> set[tuple]:
    """Every dict key path; list positions count, so an injected list item shows up too."""
    out = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.add(prefix + (k,))
            out |= key_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out |= key_paths(v, prefix + (i,))
    return out


def shape(values: dict) -> set[tuple]:
    return {(o["kind"], p) for o in render(JobSpec.build(values)) for p in key_paths(o)}


def check(field: str, value: str) -> None:
    base = dict(FREE_TEXT)
    if field == "existing_pvc":
        base.pop("storage_class")
    if field != "existing_pvc":
        base.pop("existing_pvc")
    if field in ("dataset", "dataset_config"):
        base.pop("data")  # --data takes precedence over --dataset
    values = dict(base, **{field: value})
    try:
        plan = render(JobSpec.build(values))
    except UsageError as e:
        message = str(e)
        assert message and "\n" not in message and "Traceback" not in message
        return
    assert shape(values) == shape(base), f"{field}={value!r} changed the object structure"
    found = [leaf for obj in plan for leaf in leaves(obj) if leaf == value]
    assert found or document(plan)[field] == value, f"{field}={value!r} did not round-trip"


def document(plan) -> dict:
    """The settings of the job document the head pod carries (env SUBMITTER_JOB)."""
    head = plan.get("RayJob")["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (text,) = [e["value"] for e in head["containers"][0]["env"] if e["name"] == "SUBMITTER_JOB"]
    return JobSpec.from_document(text).to_dict()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(sorted(FREE_TEXT)), value=text)
def test_hostile_free_text(field, value):
    check(field, value)


@settings(max_examples=60, deadline=None)
@given(key=text, value=text)
def test_hostile_env(key, value):
    base = dict(FREE_TEXT)
    base.pop("existing_pvc")
    values = dict(base, env={key: value})
    try:
        plan = render(JobSpec.build(values))
    except UsageError as e:
        assert "\n" not in str(e)
        return
    assert shape(values) == shape(dict(base, env={"SAFE": "v"}))
    rayjob = plan.get("RayJob")
    for group in [rayjob["spec"]["rayClusterSpec"]["headGroupSpec"],
                  *rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]]:
        assert {"name": key, "value": value} in group["template"]["spec"]["containers"][0]["env"]
    assert document(plan)["env"] == {key: value}


#: The mapping and list settings (#10): a safe value each, so the structure compares like for like.
COLLECTIONS = {"label": {"k": "v"}, "annotation": {"k": "v"}, "node_selector": {"k": "v"},
               "secret_env": {"K": "s:k"}, "toleration": ["a:NoSchedule"],
               "image_pull_secret": ["p"], "env_from_secret": ["s"]}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(sorted(COLLECTIONS)), key=text, value=text)
def test_hostile_keys_and_values_in_mappings_and_lists(field, key, value):
    base = dict(FREE_TEXT, **COLLECTIONS)
    base.pop("existing_pvc")
    hostile = {key: value} if isinstance(COLLECTIONS[field], dict) else [value]
    values = dict(base, **{field: hostile})
    try:
        plan = render(JobSpec.build(values))
    except UsageError as e:
        assert str(e) and "\n" not in str(e)
        return
    # a mapping's keys are keys of the objects (labels, annotations...): compare against the
    # same key with a safe value
    same_keys = ({key: next(iter(COLLECTIONS[field].values()))} if isinstance(hostile, dict)
                 else COLLECTIONS[field])
    assert shape(values) == shape(dict(base, **{field: same_keys})), \
        f"{field}={hostile!r} changed the object structure"
    assert document(plan)[field] == hostile


def test_known_injections_are_inert():
    """A few explicit cases that once broke string templating in other tools."""
    for field, value in [("storage_class", "nfs\nkind: Secret"), ("image", "x\"\n  y: z"),
                         ("namespace", "a: b"), ("dataset", "x; rm -rf /")]:
        check(field, value)
    plan = render(JobSpec.build(dict(name="job", env={"X": "}}\n---\nkind: Secret"})))
    assert [o["kind"] for o in plan].count("Secret") == 0


def test_astral_and_line_separator_characters_round_trip():
    """JSON escapes U+1F600 as a surrogate pair, which YAML rejects: found by the property test."""
    value = "\U0001f600 \u2028 \x85 \x7f"
    plan = render(JobSpec.build(dict(name="job", env={"X": value})))
    env = plan.get("RayJob")["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "X", "value": value} in env
    import yaml
    assert list(yaml.safe_load_all(str(plan))) == list(plan)


def test_lone_surrogates_refused():
    import pytest
    with pytest.raises(UsageError, match="not valid Unicode"):
        JobSpec.build(dict(name="job", env={"X": "\udc80"}))
