"""A local run reads its files on this machine (issue 37 item 13): `submit --local --data
../x.txt` trains on that file (a pod's policy, which refuses relative paths, is not a local
run's), and a file that is not there is one line, exit 2, before anything starts or is written."""

from __future__ import annotations

import pytest

from submitter.cli import main as cli
from submitter.contract.errors import UsageError
from submitter.local import local_files


def test_relative_paths_become_this_machine_s_absolute_paths(tmp_path, monkeypatch):
    (tmp_path / "x.txt").write_text("hello\n")
    (tmp_path / "ranks.tiktoken").write_text("")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    got = local_files({"data": "../x.txt", "bpe_file": "../ranks.tiktoken", "name": "n"})
    assert got == {"data": str(tmp_path / "x.txt"), "bpe_file": str(tmp_path / "ranks.tiktoken"),
                   "name": "n"}
    kept = {"data": "wiki", "val_data": "s3://bucket/val.txt"}  # a corpus NAME, a URI: as given
    assert local_files(kept) == kept
    with pytest.raises(UsageError, match=r"--val-data \.\./gone\.txt: no such file or directory here"):
        local_files({"val_data": "../gone.txt"})


@pytest.mark.parametrize("command", [["submit", "--local"], ["data", "prepare", "--local", "--name", "c"]])
def test_a_missing_local_file_is_one_line_and_nothing_is_written(runner, storage, monkeypatch, command):
    (storage / "here").mkdir()
    monkeypatch.chdir(storage / "here")
    result = runner.invoke(cli, [*command, "--data", "../missing.txt",
                                 "--storage-path", str(storage / "here" / "runs")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--data ../missing.txt: no such file or directory here" in lines[0]
    assert list((storage / "here").iterdir()) == []  # no storage directory, no run.json
