"""The code bundle: deterministic, content-hashed, what is left out, what a resume compares."""

from __future__ import annotations

import os
import zipfile
import io

import pytest

from submitter.contract import code


def _tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_same_files_give_the_same_bytes_whatever_their_times(tmp_path):
    _tree(tmp_path, {"train.py": "print(1)\n", "lib/util.py": "X = 1\n"})
    first = code.pack(str(tmp_path), str(tmp_path / "train.py"))
    os.utime(tmp_path / "lib/util.py", (1, 1))
    second = code.pack(str(tmp_path), str(tmp_path / "train.py"))
    assert first.data == second.data and first.sha256 == second.sha256
    assert first.entry == "train.py" and sorted(first.files) == ["lib/util.py", "train.py"]


def test_the_hash_follows_the_content(tmp_path):
    _tree(tmp_path, {"train.py": "print(1)\n"})
    before = code.pack(str(tmp_path), str(tmp_path / "train.py"))
    (tmp_path / "train.py").write_text("print(2)\n")
    after = code.pack(str(tmp_path), str(tmp_path / "train.py"))
    assert before.sha256 != after.sha256
    assert code.changed_files(before.files, after.files) == ["train.py"]


def test_version_control_caches_and_ignore_files_are_left_out(tmp_path):
    _tree(tmp_path, {"train.py": "", ".git/config": "", "__pycache__/a.cpython-311.pyc": "",
                     "pkg/__pycache__/b.pyc": "", "data/big.bin": "x", "notes.log": "",
                     "keep/data.txt": "", "out/model.pt": "",
                     ".gitignore": "*.log\n/out/\n# comment\n",
                     ".submitterignore": "data/\n"})
    files = code.list_files(str(tmp_path))
    assert files == ["keep/data.txt", "train.py"]  # the ignore files are not code either


def test_an_ignored_script_is_refused(tmp_path):
    _tree(tmp_path, {"train.py": "", ".submitterignore": "train.py\n"})
    with pytest.raises(code.CodeError, match="ignore rule"):
        code.pack(str(tmp_path), str(tmp_path / "train.py"))


def test_a_script_outside_the_working_dir_is_refused(tmp_path):
    _tree(tmp_path, {"a/train.py": "", "b/x.py": ""})
    with pytest.raises(code.CodeError, match="outside --working-dir"):
        code.pack(str(tmp_path / "b"), str(tmp_path / "a/train.py"))


def test_unpack_gives_back_the_files_and_the_manifest(tmp_path):
    _tree(tmp_path / "src", {"train.py": "print(1)\n", "lib/u.py": "U = 2\n"})
    (tmp_path / "src/train.py").chmod(0o755)
    bundle = code.pack(str(tmp_path / "src"), str(tmp_path / "src/train.py"))
    files = code.unpack(bundle.data, str(tmp_path / "out"))
    assert files == dict(bundle.files) and code.manifest_hash(files) == bundle.sha256
    assert (tmp_path / "out/lib/u.py").read_text() == "U = 2\n"
    assert os.access(tmp_path / "out/train.py", os.X_OK)


def test_unpack_refuses_paths_that_leave_the_directory(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("../evil.py", "x")
    with pytest.raises(code.CodeError, match="unsafe path"):
        code.unpack(buf.getvalue(), str(tmp_path))


def test_too_big_names_the_limit_and_both_fixes():
    line = code.too_big("proj", 5 * 2**20, code.CONFIGMAP_LIMIT)
    assert "5.0 MiB" in line and "900 KiB" in line
    assert "object-store --storage-path" in line and "--image" in line


def test_the_code_reference_round_trips(tmp_path):
    _tree(tmp_path, {"train.py": ""})
    bundle = code.pack(str(tmp_path), str(tmp_path / "train.py"))
    ref = code.parse_code_ref(code.code_ref(bundle, configmap="j-code", pip=["numpy==2.0"]))
    assert ref == {"configmap": "j-code", "entry": "train.py", "pip": ["numpy==2.0"],
                   "sha256": bundle.sha256}
    with pytest.raises(code.CodeError):
        code.parse_code_ref('{"entry": "x"}')
