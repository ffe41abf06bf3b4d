"""A --script job as render and the CLI see it: the runner's entrypoint, the code in a ConfigMap
the job owns (or the run's bucket), the head's SUBMITTER_CODE, nothing else special-cased."""

from __future__ import annotations

import base64
import json
import os

import pytest
import yaml

from submitter.cli import main
from submitter.code_plan import SCRIPT_ENTRYPOINT
from submitter.contract import code, naming
from submitter.contract.spec import JobSpec
from submitter.render import ENTRYPOINT, render


def _script_dir(tmp_path, big: int = 0):
    (tmp_path / "train.py").write_text("import ray.train\n")
    (tmp_path / "requirements.txt").write_text("# pinned\nnumpy==2.1.0  # arrays\n\nscipy\n")
    if big:
        (tmp_path / "weights.bin").write_bytes(os.urandom(big))  # incompressible
    return tmp_path


def _by_kind(plan):
    return {(o["kind"], o["metadata"]["name"]): o for o in plan}


def _head(rayjob):
    return rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]


def test_a_script_job_runs_the_runner_with_its_code_in_a_configmap(tmp_path):
    d = _script_dir(tmp_path)
    spec = JobSpec.build(name="mine", script=str(d / "train.py"),
                         requirements=str(d / "requirements.txt"), script_args=["--lr", "3"])
    objects = _by_kind(render(spec))
    rayjob = objects[("RayJob", "mine")]
    assert rayjob["spec"]["entrypoint"] == SCRIPT_ENTRYPOINT
    cm = objects[("ConfigMap", "mine-code")]
    assert cm["metadata"]["labels"][naming.JOB_LABEL] == "mine"
    assert naming.JOB_UID_ANNOTATION in cm["metadata"]["annotations"]
    files = code.unpack(base64.b64decode(cm["binaryData"][code.BUNDLE_KEY]), str(tmp_path / "out"))
    assert sorted(files) == ["requirements.txt", "train.py"]
    env = {e["name"]: e.get("value") for e in _head(rayjob)["env"]}
    ref = code.parse_code_ref(env[code.ENV_CODE])
    assert ref == {"configmap": "mine-code", "entry": "train.py", "sha256": code.manifest_hash(files),
                   "pip": ["numpy==2.1.0", "scipy"]}
    assert json.loads(env[naming.ENV_JOB])["scriptArgs"] == ["--lr", "3"]
    # only the head reads the ConfigMap: its Role may get it, by name
    rules = objects[("Role", "mine-progress")]["rules"]
    assert {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["mine-code"],
            "verbs": ["get"]} in rules
    # the same files render byte-identical objects (GitOps)
    assert str(render(spec)) == str(render(JobSpec.build(spec.to_dict())))


def test_the_gpt2_job_is_unchanged(tmp_path):
    objects = _by_kind(render(JobSpec.build(name="gpt")))
    assert objects[("RayJob", "gpt")]["spec"]["entrypoint"] == ENTRYPOINT
    assert ("ConfigMap", "gpt-code") not in objects
    assert code.ENV_CODE not in {e["name"] for e in _head(objects[("RayJob", "gpt")])["env"]}


def test_a_large_bundle_goes_to_the_runs_bucket(tmp_path):
    d = _script_dir(tmp_path, big=code.CONFIGMAP_LIMIT + 1)
    spec = JobSpec.build(name="big", namespace="team", script=str(d / "train.py"),
                         storage_path="s3://bucket/runs")
    objects = _by_kind(render(spec))
    assert ("ConfigMap", "big-code") not in objects
    ref = code.parse_code_ref({e["name"]: e.get("value") for e in
                               _head(objects[("RayJob", "big")])["env"]}[code.ENV_CODE])
    assert ref["uri"] == f"s3://bucket/runs/team/big/code/{ref['sha256']}.zip"


def test_a_large_bundle_without_a_bucket_is_refused_with_the_two_fixes(tmp_path, runner):
    d = _script_dir(tmp_path, big=code.CONFIGMAP_LIMIT + 1)
    result = runner.invoke(main, ["render", "--name", "big", "--script", str(d / "train.py")])
    assert result.exit_code == 2
    assert "900 KiB" in result.output and "object-store --storage-path" in result.output
    assert "--image" in result.output and "Traceback" not in result.output
    assert result.stdout == ""


def test_arguments_after_a_double_dash_are_the_scripts(tmp_path, runner):
    d = _script_dir(tmp_path)
    result = runner.invoke(main, ["render", "--name", "a", "--script", str(d / "train.py"),
                                  "--script-args", "first", "--", "--epochs", "3"])
    assert result.exit_code == 0, result.output
    rayjob = next(o for o in yaml.safe_load_all(result.stdout) if o["kind"] == "RayJob")
    document = {e["name"]: e.get("value") for e in _head(rayjob)["env"]}[naming.ENV_JOB]
    assert json.loads(document)["scriptArgs"] == ["first", "--epochs", "3"]


@pytest.mark.parametrize("argv, says", [
    (["--working-dir", "."], "belong to --script"),
    (["--", "--epochs", "3"], "belong to --script"),
    (["--script", "no-such-file.py"], "no such file"),
])
def test_script_mistakes_are_one_line_and_exit_2(argv, says, runner):
    result = runner.invoke(main, ["render", "--name", "a", *argv])
    assert result.exit_code == 2 and says in result.output
    assert "Traceback" not in result.output


def test_the_code_configmap_is_a_valid_object(tmp_path):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    d = _script_dir(tmp_path)
    objects = _by_kind(render(JobSpec.build(name="mine", script=str(d / "train.py"))))
    for key in (("ConfigMap", "mine-code"), ("Role", "mine-progress")):
        kubernetes_validate.validate(objects[key], "1.30.0", strict=True)


def test_a_local_script_run_is_named_after_its_script():
    from submitter.local import local_spec, script_run_name

    assert script_run_name("/x/My_Train.v2.py") == "my-train-v2"
    assert script_run_name("2fast.py") == "script-2fast"
    assert local_spec({}, {"script": "/x/train.py"}, "/data/runs").name == "train"
    assert local_spec({}, {"script": "/x/train.py", "name": "mine"}, "/data/runs").name == "mine"
    assert local_spec({}, {}, "/data/runs").name == "gpt2-local"


def test_a_script_jobs_objects_validate_against_their_schemas(tmp_path):
    from tests.support.schemas import validate_plan

    d = _script_dir(tmp_path)
    spec = JobSpec.build(name="mine", script=str(d / "train.py"), script_args=["--x"])
    assert validate_plan(list(render(spec))) == []


def _with_a_local_run(folder):
    """What `submit --local --script train.py` leaves in the script's folder: ./runs/train/..."""
    run = folder / "runs" / "train"
    (run / "checkpoint_000000").mkdir(parents=True)
    (run / "checkpoint_000000" / "state.pt").write_bytes(os.urandom(4096))
    (run / "events.jsonl").write_text('{"type": "run_started"}\n')
    (run / "run.json").write_text("{}")


def test_a_local_runs_storage_inside_the_code_folder_is_not_code(storage, tmp_path, monkeypatch):
    from submitter.code_plan import local_code_env, storage_note
    from submitter.local import local_spec, local_storage_path

    d = _script_dir(storage)  # a folder the user keeps: ./runs is accepted there
    monkeypatch.chdir(d)
    spec = local_spec({}, {"script": "train.py"}, local_storage_path({}, {}))

    def packed():
        ref = json.loads(local_code_env(spec)[code.ENV_CODE])
        with open(ref["path"], "rb") as f:
            return ref["sha256"], code.unpack(f.read(), str(tmp_path / "out" / ref["sha256"]))

    first, files = packed()
    assert set(files) == {"train.py", "requirements.txt"}
    _with_a_local_run(d)  # the first run's output: the second run's code is the same
    second, files = packed()
    assert second == first and not any(p.startswith("runs/") for p in files)
    (d / ".submitterignore").write_text("runs/\n")  # the third run, after the docs' advice
    assert packed()[0] == first
    note = storage_note(spec)
    assert note is not None and "runs/" in note and str(d) in note and "\n" not in note


def test_render_script_does_not_pack_a_local_runs_output(tmp_path, monkeypatch, runner):
    d = _script_dir(tmp_path)
    monkeypatch.chdir(d)
    args = ["render", "--name", "mine", "--script", "train.py", "-o", "yaml"]
    before = runner.invoke(main, args)
    assert before.exit_code == 0, before.output
    _with_a_local_run(d)
    after = runner.invoke(main, args)
    assert after.exit_code == 0, after.output
    assert after.stdout == before.stdout  # the same ConfigMap: no checkpoint in it
    assert "runs/ left out" in after.stderr and "runs/" not in before.stderr
