"""`submitter render` and the CLI contract: flags from JobSpec, exit codes, nothing written on error."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml

from submitter.cli import main
from submitter.render import render
from submitter.contract.spec import JobSpec, flag_name


def test_render_stdout_is_the_plan(runner):
    result = runner.invoke(main, ["render", "--name", "gpt2-demo", "--replicas", "8", "--gpu-per-pod", "1"])
    assert result.exit_code == 0, result.output
    expected = render(JobSpec.build(name="gpt2-demo", replicas=8, gpu_per_pod=1))
    assert result.stdout == str(expected)
    assert [o["kind"] for o in yaml.safe_load_all(result.stdout)] == [
        "PersistentVolumeClaim", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "NetworkPolicy",
        "RayJob"]


def test_render_json_is_a_list(runner):
    result = runner.invoke(main, ["render", "--name", "j", "-o", "json"])
    doc = json.loads(result.stdout)
    assert doc["kind"] == "List" and len(doc["items"]) == 7


def test_render_directory_writes_one_file_per_object_and_a_kustomization(runner, tmp_path):
    out = tmp_path / "manifests-out"
    (tmp_path / "manifests-out").mkdir()
    (out / "mine.txt").write_text("keep me")
    result = runner.invoke(main, ["render", "--name", "gpt2-demo", "-o", str(out) + "/"])
    assert result.exit_code == 0, result.output
    kustomization = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    objects = [yaml.safe_load((out / name).read_text()) for name in kustomization["resources"]]
    assert objects == list(render(JobSpec.build(name="gpt2-demo")))
    assert (out / "mine.txt").read_text() == "keep me"  # nothing the user made is deleted
    assert result.stdout == ""


def test_job_file_sets_fields_and_flags_override(runner, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("name: from-file\nreplicas: 4\ngpu_per_pod: 2\nenv: {A: '1'}\n")
    result = runner.invoke(main, ["render", "-f", str(job), "--replicas", "6", "--env", "B=2"])
    assert result.exit_code == 0, result.output
    expected = JobSpec.build(name="from-file", replicas=6, gpu_per_pod=2, env={"A": "1", "B": "2"})
    assert result.stdout == str(render(expected))


@pytest.mark.parametrize("args, words", [
    (["--name", "gpt2-demo", "--storage-path", "/tmp/ckpt"], ["/tmp"]),
    (["--name", "gpt2-demo", "--storage-path", "runs"], ["relative"]),
    (["--name", "gpt2-demo", "--storage-path", "~/ray_results"], ["starts with '~'"]),
    (["--name", "gpt2-demo", "--storage-access-mode", "ReadWriteOnce"], ["ReadWriteMany"]),
    (["--name", "Bad_Name"], ["--name"]),
    (["--name", "j", "--env", "NOEQUALS"], ["KEY=VALUE"]),
    (["--replicas", "2"], ["name is required"]),
    (["--name", "j", "--fsdp"], ["--gpu-per-pod"]),
    (["--name", "j", "--compile", "maybe"], ["--compile", "auto, on, off"]),
    (["--name", "j", "--compile", ""], ["--compile"]),
    (["--name", "j", "--precision", "fp8"], ["--precision", "auto, bf16, fp16, fp32"]),
    (["--name", "j", "--precision", "fp16"], ["--gpu-per-pod"]),
])
def test_bad_input_is_one_line_exit_2_and_nothing_on_stdout(runner, args, words, tmp_path):
    out = tmp_path / "out"
    for extra in ([], ["-o", str(out) + "/"], ["--output-dir", str(out)]):
        result = runner.invoke(main, ["render", *args, *extra])
        assert result.exit_code == 2, result.output
        assert result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        for word in words:
            assert word in lines[0]
        assert "Traceback" not in result.stderr
    assert not out.exists()


def test_bad_job_files(runner, tmp_path):
    cases = {"broken.yaml": "name: [unclosed", "list.yaml": "- a\n- b\n", "unknown.yaml": "nme: x\n"}
    for filename, text in cases.items():
        (tmp_path / filename).write_text(text)
        result = runner.invoke(main, ["render", "-f", str(tmp_path / filename)])
        assert result.exit_code == 2 and result.stdout == "", (filename, result.output)
        assert len(result.stderr.strip().splitlines()) == 1
    result = runner.invoke(main, ["render", "-f", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and "cannot read job file" in result.stderr


def test_every_jobspec_field_has_exactly_one_flag_on_render_and_submit():
    fields = {f.name for f in dataclasses.fields(JobSpec)}
    for command in ("render", "submit"):
        params = {p.name for p in main.commands[command].params}
        assert fields <= params, fields - params
        for f in dataclasses.fields(JobSpec):
            opt = next(p for p in main.commands[command].params if p.name == f.name)
            assert flag_name(f.name) in opt.opts
            assert opt.default is None or opt.multiple  # not given = the job file / JobSpec decides


def test_namespace_has_short_flag(runner):
    result = runner.invoke(main, ["render", "--name", "j", "-n", "ml"])
    assert all(o["metadata"]["namespace"] == "ml" for o in yaml.safe_load_all(result.stdout))


def test_helm_values_round_trip_to_the_same_spec(runner, tmp_path):
    args = ["--name", "gpt2-demo", "--replicas", "8", "--gpu-per-pod", "1", "--storage-class", "nfs"]
    result = runner.invoke(main, ["render", *args, "--helm-values"])
    assert result.exit_code == 0, result.output
    values = yaml.safe_load(result.stdout)
    assert values["gpuPerPod"] == 1 and values["storageClass"] == "nfs"
    assert JobSpec.build(values) == JobSpec.build(name="gpt2-demo", replicas=8, gpu_per_pod=1,
                                                  storage_class="nfs")
    (tmp_path / "values.yaml").write_text(result.stdout)  # a values file is a job file too
    again = runner.invoke(main, ["render", "-f", str(tmp_path / "values.yaml")])
    assert again.stdout == runner.invoke(main, ["render", *args]).stdout


def test_help_and_render_import_no_heavy_modules():
    code = ("import sys; from submitter.cli import main\n"
            "try:\n    main(['render', '--name', 'j'], standalone_mode=False)\nfinally:\n"
            "    heavy = [m for m in ('kubernetes', 'ray', 'torch', 'transformers', 'datasets')"
            " if m in sys.modules]\n    print('HEAVY', heavy, file=sys.stderr)\n")
    for argv in ([sys.executable, "-c", code],
                 [sys.executable, "-c", code.replace("['render', '--name', 'j']", "['--help']")]):
        proc = subprocess.run(argv, capture_output=True, text=True)
        assert "HEAVY []" in proc.stderr, proc.stderr


def test_python_dash_m_submitter_works():
    proc = subprocess.run([sys.executable, "-m", "submitter", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and "0.1.0" in proc.stdout


def test_lazy_cluster_commands_are_exactly_cli_clusters_and_import_on_their_own():
    from submitter import cli, cli_cluster

    assert sorted(cli.LAZY_COMMANDS) == sorted(c.name for c in cli_cluster.COMMANDS)
    proc = subprocess.run([sys.executable, "-c", "import submitter.cli_cluster"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr  # no circular import between the command modules


def test_help_groups_options_by_jobspec_group_and_every_command_has_examples(runner):
    import re

    from submitter.cli_help import section_order
    from submitter.contract.spec import GROUPS

    for command in ("render", "submit"):
        text = runner.invoke(main, [command, "--help"]).stdout
        titles = re.findall(r"^(\w+) options:$", text, flags=re.M)
        want = [g.capitalize() for g in section_order()]
        assert titles == [t for t in want if t in titles]  # in the documented order
        assert {g.capitalize() for g in GROUPS if any(f.metadata["group"] == g
                                                      for f in dataclasses.fields(JobSpec))} <= set(titles)
        for f in dataclasses.fields(JobSpec):  # each flag sits under its own group's title
            at = re.search(rf"^  (-\w, )?{flag_name(f.name)}[ /=]", text, flags=re.M).start()
            title = re.findall(r"^(\w+) options:$", text[:at], flags=re.M)[-1]
            assert title == f.metadata["group"].capitalize(), f.name
    for name in main.list_commands(None):
        assert "Examples:" in runner.invoke(main, [name, "--help"]).stdout, name


def test_click_usage_errors_are_one_line_exit_2(runner):
    for args in (["render", "--nme", "x"], ["render", "--replicas"], ["submit", "--dry-run", "maybe"]):
        result = runner.invoke(main, args)
        assert result.exit_code == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "--help" in lines[0], result.stderr


def test_replicas_range_from_a_flag_and_from_a_job_file(runner, tmp_path):
    """`--replicas 1:3` and `replicas: 1:3` in a job file (not YAML 1.1's base-60 integer 63)."""
    job = tmp_path / "job.yaml"
    job.write_text("name: elastic\nreplicas: 1:3\n")
    from_file = runner.invoke(main, ["render", "-f", str(job), "-o", "json"])
    from_flag = runner.invoke(main, ["render", "--name", "elastic", "--replicas", "1:3", "-o", "json"])
    assert from_file.exit_code == 0 and from_flag.exit_code == 0, from_file.output + from_flag.output
    assert from_file.stdout == from_flag.stdout
    rayjob = next(o for o in json.loads(from_flag.stdout)["items"] if o["kind"] == "RayJob")
    group = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (1, 1, 3)
    assert rayjob["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] is True


def test_a_global_batch_an_elastic_group_cannot_keep_is_one_line_exit_2(runner):
    result = runner.invoke(main, ["render", "--name", "e", "--replicas", "1:3",
                                  "--global-batch-size", "20"])  # CPU: micro-batches of 8
    assert result.exit_code == 2
    assert "use 24" in result.output and "Traceback" not in result.output
    # 32 = 4 micro-batches: 2 groups split them equally, 3 as 2/1/1 (a token-mean loss)
    assert runner.invoke(main, ["render", "--name", "e", "--replicas", "1:3",
                                "--global-batch-size", "32"]).exit_code == 0


def test_render_warns_when_a_step_and_the_save_outlast_the_grace_period(runner):
    args = ["render", "--name", "j", "--gpu-per-pod", "1", "--replicas", "1",
            "--gpu-type", "Tesla-T4"]
    quiet = runner.invoke(main, args)
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr
    loud = runner.invoke(main, [*args, "--termination-grace-period", "30"])
    assert loud.exit_code == 0 and "kind: RayJob" in loud.stdout
    assert loud.stderr.startswith("warning: ") and "--termination-grace-period 50" in loud.stderr
