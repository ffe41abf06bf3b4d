"""Small reads from an object store (pyarrow's filesystems, the ones the pods write with, and
their credentials: AWS_* / AWS_ENDPOINT_URL, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*):
what `report`, `logs` and `estimate` read of a run kept in a bucket. pyarrow is imported only
when a bucket is read."""

from __future__ import annotations

from typing import Any

from submitter.contract.errors import UsageError
from submitter.contract.stack import pip_install


def need_pyarrow() -> Any:
    """pyarrow.fs, or UsageError (exit 2) with the pip command: reading a run from an object
    store goes through the same filesystems the pod wrote it with (and the same credentials:
    AWS_* / AWS_ENDPOINT_URL, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*)."""
    try:
        from pyarrow import fs
    except ImportError:
        raise UsageError("submitter report --storage-path s3://|gs://|abfss://... needs pyarrow: "
                         f"{pip_install('report')}") from None
    return fs


def read_object(fs: Any, filesystem: Any, path: str) -> str | None:
    """A small object's text (None: no such file)."""
    if filesystem.get_file_info(path).type != fs.FileType.File:
        return None
    with filesystem.open_input_stream(path) as f:
        return f.read().decode("utf-8", errors="replace")


def usage_texts(storage_uri: str) -> list[str]:
    """Every usage.json two folders down an object-store storage path (`<storage>/<name>/`,
    `<storage>/<namespace>/<name>/`), for submitter.contract.usage.read_usages. Folders are listed
    one level at a time: a recursive listing would walk every checkpoint shard."""
    from submitter.contract.usage import USAGE_FILE

    fs = need_pyarrow()
    filesystem, root = fs.FileSystem.from_uri(storage_uri.rstrip("/"))

    def folders(path: str) -> list[str]:
        infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
        return [i.path for i in infos if i.type == fs.FileType.Directory]

    texts = []
    for run in folders(root):
        for folder in [run, *folders(run)]:
            text = read_object(fs, filesystem, f"{folder}/{USAGE_FILE}")
            if text is not None:
                texts.append(text)
    return texts
