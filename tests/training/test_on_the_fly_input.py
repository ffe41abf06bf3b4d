"""Files read on the fly (`--data` of text, JSONL, Parquet without a manifest): what Ray Data's
readers would fail on inside Ray (a traceback per task, exit 1) is refused before Ray starts,
in one line naming the file (and the line), exit 2, nothing written."""

from __future__ import annotations

import gzip
import json

import pytest

from submitter.contract.errors import UsageError
from training.data.pipeline import check_files


def _jsonl(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_a_jsonl_line_that_is_not_json_names_the_file_and_the_line(tmp_path):
    good = [json.dumps({"text": f"row {i}"}) for i in range(5)]
    bad = _jsonl(tmp_path / "b.jsonl", good[:2] + ["{not json"] + good[2:])
    with pytest.raises(UsageError) as e:
        check_files(str(tmp_path), "auto")
    message = str(e.value)
    assert message.startswith(f"{bad} line 3: not JSON") and "\n" not in message


def test_a_gzipped_jsonl_is_read_line_by_line_and_an_array_is_not_an_object(tmp_path):
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"text": "x"}\n\n[1, 2]\n'))
    with pytest.raises(UsageError, match=r"a\.jsonl\.gz line 3: a JSON list, not an object"):
        check_files(str(path), "auto")


def test_a_file_named_with_data_format_is_checked_whatever_its_suffix(tmp_path):
    path = _jsonl(tmp_path / "rows.txt", [json.dumps({"text": "a"}), "nope"])
    check_files(str(path), "auto")  # text: any bytes are text
    with pytest.raises(UsageError, match=r"rows\.txt line 2: not JSON"):
        check_files(str(path), "jsonl")


def test_only_the_budget_of_jsonl_is_read_line_by_line(tmp_path):
    lines = [json.dumps({"text": "x" * 50})] * 200 + ["{not json"]
    _jsonl(tmp_path / "a.jsonl", lines)
    check_files(str(tmp_path), "jsonl", jsonl_bytes=4096)  # the bad line is past the budget
    with pytest.raises(UsageError, match="line 201"):
        check_files(str(tmp_path), "jsonl")


def test_a_text_file_named_parquet_is_not_parquet(tmp_path):
    fake = tmp_path / "d" / "part-0.parquet"
    fake.parent.mkdir()
    fake.write_text("just some text\n")
    with pytest.raises(UsageError) as e:
        check_files(str(fake.parent), "auto")
    message = str(e.value)
    assert message.startswith(f"{fake}: not a Parquet file") and "\n" not in message


def test_a_parquet_without_the_text_column_and_a_missing_or_empty_path(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["a", "b"]}), tmp_path / "x.parquet")
    with pytest.raises(UsageError, match=r"x\.parquet: no column 'text' \(it has body\)"):
        check_files(str(tmp_path / "x.parquet"), "auto")
    check_files(str(tmp_path / "x.parquet"), "auto", text_column="body")
    with pytest.raises(UsageError, match=r"^--val-data .*nope: not found"):
        check_files(str(tmp_path / "nope"), "auto", flag="--val-data")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "a.txt").write_text("")
    with pytest.raises(UsageError, match="empty"):
        check_files(str(tmp_path / "e"), "auto")
    (tmp_path / "e" / "a.txt").write_text("some text\n")
    check_files(str(tmp_path / "e"), "auto")


def test_the_program_refuses_bad_jsonl_before_ray_and_writes_nothing(storage, capsys):
    import ray

    from training.__main__ import main

    data = storage / "in"
    data.mkdir()
    _jsonl(data / "a.jsonl", [json.dumps({"text": "hello"}), "oops"])
    code = main(["--name", "j", "--storage-path", str(storage), "--model", "tiny",
                 "--tokenizer", "byte", "--block-size", "16", "--data", str(data)])
    err = capsys.readouterr().err.strip().splitlines()
    assert not ray.is_initialized()
    assert code == 2 and len(err) == 1, err
    assert err[0].endswith(f"{data / 'a.jsonl'} line 2: not JSON (Expecting value: line 1 "
                           "column 1 (char 0)): each line of a JSONL file is one JSON object"), err
    assert sorted(p.name for p in storage.iterdir()) == ["in"]  # no run directory
