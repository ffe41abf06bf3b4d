"""Job files (#9 item 3, #11 item 3): hostile files are one line and exit 2, fast; what
`render -o jobfile` writes (and render's own output) reads back to the same job."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
import yaml

from submitter import jobfile
from submitter.cli import main
from submitter.contract.spec import JobSpec, flag_name
from submitter.render import render

ALIAS_BOMB = (  # 331 bytes; expanded, 9**9 strings (hundreds of MB, minutes)
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
)


def refused(runner, path, *words, stdin=None):
    start = time.perf_counter()
    result = runner.invoke(main, ["render", "-f", str(path)], input=stdin)
    elapsed = time.perf_counter() - start
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert len(lines[0]) < 1000, lines[0]  # (an unknown key lists the valid ones)
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert elapsed < 10  # refused before expansion, not after minutes of it
    return lines[0]


def test_alias_bomb_is_refused_before_expansion(runner, tmp_path):
    assert len(ALIAS_BOMB.encode()) <= 400
    (tmp_path / "bomb.yaml").write_text(ALIAS_BOMB)
    refused(runner, tmp_path / "bomb.yaml", "anchors")
    (tmp_path / "alias.yaml").write_text("name: *x\n")
    refused(runner, tmp_path / "alias.yaml", "alias")


@pytest.mark.parametrize("text", [
    "name: !!python/object/apply:os.system ['echo pwned']\n",
    "name: !!str j\n",
    "env: !custom {A: b}\n",
    "--- !!map\nname: j\n",
])
def test_tags_are_refused(runner, tmp_path, text):
    (tmp_path / "tag.yaml").write_text(text)
    refused(runner, tmp_path / "tag.yaml", "tags")


def test_binary_file_deep_nesting_and_nul_are_one_line(runner, tmp_path):
    (tmp_path / "bin.yaml").write_bytes(bytes(range(256)) * 8)
    refused(runner, tmp_path / "bin.yaml", "not UTF-8")
    (tmp_path / "deep.yaml").write_text("[" * 5000 + "]" * 5000)
    refused(runner, tmp_path / "deep.yaml", "nesting")
    (tmp_path / "deepmap.yaml").write_text("{a: " * 5000 + "1" + "}" * 5000)
    refused(runner, tmp_path / "deepmap.yaml", "nesting")
    (tmp_path / "nul.yaml").write_bytes(b"name: j\x00\n")
    refused(runner, tmp_path / "nul.yaml", "NUL")


def test_devices_fifos_directories_and_huge_files_are_refused_without_reading_them(runner, tmp_path):
    refused(runner, "/dev/zero", "not a regular file")
    refused(runner, tmp_path, "a directory")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused(runner, fifo, "not a regular file")  # opening it does not wait for a writer
    big = tmp_path / "big.yaml"
    big.write_text("name: " + "x" * (50 * 1024 * 1024) + "\n")
    refused(runner, big, "larger than 1024 KiB")
    value = tmp_path / "value.yaml"
    value.write_text("name: " + "x" * (900 * 1024) + "\n")  # under the cap: the value is cut
    refused(runner, value, "--name")
    refused(runner, tmp_path / "missing.yaml", "cannot read job file")


def test_reading_stops_at_the_cap(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (jobfile.MAX_BYTES + 10))
    with pytest.raises(jobfile.JobFileError, match="larger than"):
        jobfile.read_bytes(str(big))
    assert len(jobfile.read_bytes(str(big), limit=jobfile.MAX_BYTES + 10)) == jobfile.MAX_BYTES + 10


def test_one_spelling_duplicates_and_several_documents_are_refused(runner, tmp_path):
    cases = {"kebab.yaml": ("gpu-per-pod: 1\n", "snake_case: gpu_per_pod"),
             "mixed.yaml": ("gpuPerPod: 1\nstorage_class: nfs\n", "mixes"),
             "dup.yaml": ("name: a\nname: b\n", "appears twice"),
             "docs.yaml": ("name: a\n---\nname: b\n", "2 YAML documents"),
             "broken.yaml": ("name: [unclosed\n", "not valid YAML"),
             "list.yaml": ("- a\n", "mapping of settings"),
             "long-key.yaml": ("k" * 1000 + ": 1\n", "unknown job setting"),
             "two-rayjobs.yaml": ("apiVersion: v1\nkind: List\nitems: []\n", "no RayJob")}
    for filename, (text, word) in cases.items():
        (tmp_path / filename).write_text(text)
        refused(runner, tmp_path / filename, word)


def test_stdin_is_a_job_file(runner):
    result = runner.invoke(main, ["render", "-f", "-"], input="name: from-stdin\n")
    assert result.exit_code == 0, result.output
    assert result.stdout == str(render(JobSpec.build(name="from-stdin")))


SAMPLE = ["--name", "gpt2-demo", "--replicas", "8", "--gpu-per-pod", "1", "--env", "A=1",
          "--env", "B=x: y", "--storage-class", "nfs", "--learning-rate", "0.0003",
          "--cpu-per-pod", "4", "--max-steps-per-epoch", "100", "--fsdp"]


def test_render_o_jobfile_has_every_setting_with_a_comment_and_reads_back_identical(runner, tmp_path):
    result = runner.invoke(main, ["render", *SAMPLE, "-o", "jobfile"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    want = JobSpec.build(**_flags_to_values(SAMPLE))
    assert yaml.safe_load(text) == want.to_dict()  # every setting, snake_case, exact values
    lines = text.splitlines()
    for f in dataclasses.fields(JobSpec):
        at = next(i for i, line in enumerate(lines) if line.startswith(f"{f.name}:"))
        assert lines[at - 1] == f"# {f.metadata['help']}" or \
            lines[at - 1].startswith(f"# {f.metadata['help']} (default: "), f.name
    (tmp_path / "job.yaml").write_text(text)
    assert JobSpec.build(jobfile.load(str(tmp_path / "job.yaml"))) == want
    again = runner.invoke(main, ["render", "-f", str(tmp_path / "job.yaml")])
    assert again.stdout == str(render(want))
    assert runner.invoke(main, ["render", "-f", str(tmp_path / "job.yaml"), "-o", "jobfile"]).stdout == text


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_rendered_manifests_are_a_job_file(runner, tmp_path, fmt):
    rendered = runner.invoke(main, ["render", *SAMPLE, "-o", fmt]).stdout
    (tmp_path / "job.yaml").write_text(rendered)
    again = runner.invoke(main, ["render", "-f", str(tmp_path / "job.yaml"), "-o", fmt])
    assert again.exit_code == 0, again.output
    assert again.stdout == rendered
    flag = runner.invoke(main, ["render", "-f", str(tmp_path / "job.yaml"), "--replicas", "3"])
    assert yaml.safe_load_all(flag.stdout)  # flags still override
    assert str(render(JobSpec.build(**{**_flags_to_values(SAMPLE), "replicas": 3}))) == flag.stdout


@pytest.mark.parametrize("value", ["yml", "JSON", "Yaml", "out", "jobfile.yaml", "", " "])
def test_render_o_accepts_only_its_documented_values(runner, tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, ["render", "--name", "j", "-o", value])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "yaml, json, jobfile" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no directory named yml/


def test_render_directory_needs_an_explicit_form(runner, tmp_path):
    for args, target in ((["-o", f"{tmp_path}/a/"], "a"), (["--output-dir", str(tmp_path / "b")], "b")):
        result = runner.invoke(main, ["render", "--name", "j", *args])
        assert result.exit_code == 0, result.output
        assert (tmp_path / target / "kustomization.yaml").exists()
    both = runner.invoke(main, ["render", "--name", "j", "-o", "json", "--output-dir", str(tmp_path / "c")])
    assert both.exit_code == 2 and not (tmp_path / "c").exists()


def _flags_to_values(argv: list[str]) -> dict:
    out: dict = {}
    names = {flag_name(f.name): f.name for f in dataclasses.fields(JobSpec)}
    i = 0
    while i < len(argv):
        name = names[argv[i]]
        if name == "fsdp":
            out[name] = True
            i += 1
            continue
        if name == "env":
            key, _, value = argv[i + 1].partition("=")
            out.setdefault("env", {})[key] = value
        else:
            out[name] = argv[i + 1]
        i += 2
    return out


def test_init_writes_a_job_file_that_reads_back_and_never_overwrites(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, ["init", *SAMPLE])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "job.yaml").read_text()
    assert text == runner.invoke(main, ["render", *SAMPLE, "-o", "jobfile"]).stdout
    again = runner.invoke(main, ["init", "--name", "other"])
    assert again.exit_code == 2 and "--force" in again.stderr
    assert (tmp_path / "job.yaml").read_text() == text  # nothing the user made is overwritten
    assert runner.invoke(main, ["init", "--name", "other", "--force"]).exit_code == 0
    assert yaml.safe_load((tmp_path / "job.yaml").read_text())["name"] == "other"
    bad = runner.invoke(main, ["init", "--name", "j", "--storage-path", "/tmp/x", "bad.yaml"])
    assert bad.exit_code == 2 and not (tmp_path / "bad.yaml").exists()


def test_a_megabyte_of_yaml_is_refused_quickly(runner, tmp_path):
    lines, size = [], 0
    while size < jobfile.MAX_BYTES - 100:
        lines.append(f"k{len(lines)}: [a, b, c]\n")
        size += len(lines[-1])
    (tmp_path / "flat.yaml").write_text("".join(lines))
    start = time.process_time()
    refused(runner, tmp_path / "flat.yaml", "YAML nodes")
    assert time.process_time() - start < 5  # (libyaml: a fifth of a second; pure Python: 6 s)


def test_every_settings_sample_round_trips_through_a_job_file(tmp_path):
    from tests.test_settings import NEEDS, SAMPLES

    path = tmp_path / "job.yaml"
    for name, value in SAMPLES.items():
        spec = JobSpec.build({"name": "j", **NEEDS.get(name, {}), name: value})
        path.write_text(jobfile.dump(spec))
        assert JobSpec.build(jobfile.load(str(path))) == spec, name
        rendered = tmp_path / "rendered.yaml"
        rendered.write_text(str(render(spec)))  # render's own output reads back too
        assert JobSpec.build(jobfile.load(str(rendered))) == spec, name
