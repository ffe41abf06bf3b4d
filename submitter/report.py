"""`submitter report NAME`: the run as a picture (PNG) and a self-contained HTML page.

The data comes from where the run keeps it: a run directory's `events.jsonl` (every event; a local
path, or an object store URI as `submit` writes them, read with pyarrow's filesystems like the pod
wrote it) or a cluster job's progress ConfigMap (its bounded curve of the whole run, `curve.json`, plus
the folded state; the job's settings from the RayJob's job document). Both become one `RunData`
and the same figure: train and validation loss against step, tokens/s, restarts and checkpoints
marked. matplotlib (the `report` extra) is imported only here, with the Agg backend (no display).
"""

from __future__ import annotations

import base64
import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from submitter.contract import events as ev
from submitter.contract import naming
from submitter.contract.errors import NotFound, UsageError
from submitter.contract.stack import pip_install

#: The PNG's size in pixels (FIGSIZE inches x DPI).
FIGSIZE, DPI = (10.0, 7.0), 100
PIP_HINT = pip_install("report")


@dataclass(frozen=True)
class RunData:
    """Everything a report shows about one run."""

    name: str
    source: str  # where it was read from, for the page
    curve: dict[str, Any]
    state: ev.ProgressState
    settings: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)  # run_started's (model, params, data...)
    usage: Any = None  # what it took: usage.json (submitter.contract.usage), None if not kept
    estimate: dict[str, Any] | None = None  # the estimate recorded with the job (#38)


# --- sources ------------------------------------------------------------------------------------

def events_file(storage_path: str, name: str, namespace: str | None = None) -> Path:
    """The run's events.jsonl: `<storage>/<namespace>/<name>/` (a cluster run), `<storage>/<name>/`
    (a local run), STORAGE as the run directory itself, or one level deeper."""
    root = Path(storage_path).expanduser()
    candidates = [root / namespace / name / naming.EVENTS_FILE] if namespace else []
    candidates += [root / name / naming.EVENTS_FILE, root / naming.EVENTS_FILE]
    candidates += sorted(root.glob(f"*/{name}/{naming.EVENTS_FILE}"))
    candidates += sorted(root.glob(f"{name}*/{naming.EVENTS_FILE}"))
    for path in candidates:
        if path.is_file():
            return path
    raise NotFound(f"no {naming.EVENTS_FILE} for run {name} under {storage_path}; give the "
                   "--storage-path the run used (its run directory is <storage-path>/<name>, or "
                   "<storage-path>/<namespace>/<name> for a cluster run)")


def from_events(name: str, source: str, events: list[Mapping[str, Any]],
                settings: Mapping[str, Any] | None = None) -> RunData:
    started = next((e for e in reversed(events) if e.get("type") == "run_started"), {})
    facts = {k: v for k, v in started.items() if k not in ("v", "type", "time", "seq")}
    return RunData(name, source, ev.curve_fold(list(events)), ev.fold(list(events)),
                   dict(settings or {}), facts)


def need_pyarrow() -> Any:
    """pyarrow.fs, or UsageError (exit 2) with the pip command: reading a run from an object
    store goes through the same filesystems the pod wrote it with (and the same credentials:
    AWS_* / AWS_ENDPOINT_URL, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*)."""
    try:
        from pyarrow import fs
    except ImportError:
        raise UsageError("submitter report --storage-path s3://|gs://|abfss://... needs pyarrow: "
                         f"{PIP_HINT}") from None
    return fs


def object_store_events(storage_path: str, name: str, namespace: str | None = None) -> tuple[str, str]:
    """(URI, text) of a run's events.jsonl in an object store, looked for where `submit` puts
    it: `<storage>/<namespace>/<name>/`, `<storage>/<name>/`, STORAGE as the run directory, or
    `<storage>/*/<name>/` (a cluster run whose namespace was not given)."""
    fs = need_pyarrow()
    root_uri = storage_path.rstrip("/")
    try:
        filesystem, root = fs.FileSystem.from_uri(root_uri)
    except (ValueError, OSError) as e:  # ArrowInvalid is a ValueError; missing credentials an OSError
        raise UsageError(f"cannot open --storage-path {storage_path}: {first_line(e)}") from None
    root = root.rstrip("/")
    candidates = [f"{root}/{namespace}/{name}"] if namespace else []
    candidates += [f"{root}/{name}", root]
    try:
        for directory in candidates:
            found = _read_object(fs, filesystem, f"{directory}/{naming.EVENTS_FILE}")
            if found is not None:
                return _as_uri(root_uri, root, f"{directory}/{naming.EVENTS_FILE}"), found
        listing = filesystem.get_file_info(fs.FileSelector(root, recursive=False, allow_not_found=True))
        for info in sorted(listing, key=lambda i: i.path):
            if info.type == fs.FileType.Directory:
                found = _read_object(fs, filesystem, f"{info.path}/{name}/{naming.EVENTS_FILE}")
                if found is not None:
                    return _as_uri(root_uri, root, f"{info.path}/{name}/{naming.EVENTS_FILE}"), found
    except OSError as e:  # access denied, no such bucket, endpoint unreachable
        raise UsageError(f"cannot read {storage_path}: {first_line(e)}") from None
    raise NotFound(f"no {naming.EVENTS_FILE} for run {name} under {storage_path}; give the "
                   "--storage-path the run used (its run directory is <storage-path>/<name>, or "
                   "<storage-path>/<namespace>/<name> for a cluster run)")


def _read_object(fs: Any, filesystem: Any, path: str) -> str | None:
    if filesystem.get_file_info(path).type != fs.FileType.File:
        return None
    with filesystem.open_input_stream(path) as f:
        return f.read().decode("utf-8", errors="replace")


def _as_uri(root_uri: str, root: str, path: str) -> str:
    """A path inside the filesystem as the URI the user wrote (s3://bucket/... for bucket/...)."""
    if root and root_uri.endswith(root):
        return root_uri[:len(root_uri) - len(root)] + path
    return f"{root_uri.split('://', 1)[0]}://{path}"


def first_line(e: BaseException) -> str:
    """An error as one line (its first, at most 300 characters) for a user-facing message."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def from_run_dir(storage_path: str, name: str, namespace: str | None = None) -> RunData:
    from submitter.contract.storage import OBJECT_STORE_SCHEMES, scheme_of

    if scheme_of(storage_path) in OBJECT_STORE_SCHEMES:
        uri, text = object_store_events(storage_path, name, namespace)
        return with_usage(from_events(name, uri, ev.parse_lines(text)), uri)
    path = events_file(storage_path, name, namespace)
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    return with_usage(from_events(name, str(path), ev.parse_lines(text)), str(path))


def with_usage(run: RunData, events_at: str) -> RunData:
    """The run with what it took (usage.json) and its estimate (run.json's), both read from
    beside its events file (a path or an object-store URI); either may be missing."""
    from dataclasses import replace

    from submitter.contract.naming import RUN_ESTIMATE_KEY
    from submitter.contract.usage import USAGE_FILE, RunUsage

    folder = events_at.rsplit("/", 1)[0]
    usage_text, run_text = _sibling(folder, USAGE_FILE), _sibling(folder, "run.json")
    try:
        usage = RunUsage.from_json(usage_text) if usage_text else None
    except (ValueError, TypeError):
        usage = None
    try:
        estimate = json.loads(run_text).get(RUN_ESTIMATE_KEY) if run_text else None
    except (ValueError, AttributeError):
        estimate = None
    return replace(run, usage=usage, estimate=estimate if isinstance(estimate, dict) else None)


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
            text = _read_object(fs, filesystem, f"{folder}/{USAGE_FILE}")
            if text is not None:
                texts.append(text)
    return texts


def _sibling(folder: str, file_name: str) -> str | None:
    """A small file's text in the run's folder (None when absent or unreadable)."""
    path = f"{folder}/{file_name}"
    try:
        if "://" not in path:
            return Path(path).read_text(encoding="utf-8")
        fs = need_pyarrow()
        filesystem, inner = fs.FileSystem.from_uri(path)
        return _read_object(fs, filesystem, inner)
    except (OSError, ValueError):
        return None


def from_configmap(name: str, namespace: str, configmap: Mapping[str, Any] | None,
                   rayjob: Mapping[str, Any] | None) -> RunData:
    """A cluster job's report data (pure): the ConfigMap's curve (else its recent events) and
    state, and the settings from the RayJob's job document when the RayJob still exists."""
    from submitter.state import configmap_events, progress_from_configmap

    data = (configmap or {}).get("data") or {}
    recent = configmap_events(configmap)
    curve = ev.parse_curve(data.get(ev.CURVE_KEY)) or ev.curve_fold(recent)
    settings: dict[str, Any] = {}
    if rayjob is not None:
        from submitter.jobfile import _head_env

        document = _head_env(rayjob).get(naming.ENV_JOB)
        try:
            settings = json.loads(document) if isinstance(document, str) else {}
        except ValueError:
            settings = {}
    started = next((e for e in reversed(recent) if e.get("type") == "run_started"), {})
    facts = {k: v for k, v in started.items() if k not in ("v", "type", "time", "seq")}
    from submitter.state import estimate_of

    return RunData(name, f"configmap {namespace}/{name}-progress", curve,
                   progress_from_configmap(configmap), settings if isinstance(settings, dict) else {},
                   facts, estimate=estimate_of(rayjob))


def from_cluster(kube: Any, namespace: str, name: str) -> RunData:
    names = naming.object_names(name)
    configmap = kube.find("ConfigMap", namespace, names["progress"])
    if configmap is None:
        raise NotFound(f"no progress ConfigMap {names['progress']} in namespace {namespace}; "
                       f"for a local run give --storage-path")
    return from_configmap(name, namespace, configmap, kube.find("RayJob", namespace, name))


# --- output -------------------------------------------------------------------------------------

def need_matplotlib() -> Any:
    """matplotlib.pyplot with the Agg backend, or UsageError (exit 2) with the pip command."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(f"submitter report needs matplotlib: {PIP_HINT}") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def figure_png(run: RunData) -> bytes:
    """The report figure as PNG bytes: loss (train, validation) and tokens/s against step."""
    import io

    plt = need_matplotlib()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=FIGSIZE, dpi=DPI, sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
    points = [p for p in ev.curve_points(run.curve) if isinstance(p[0], (int, float))]
    loss = [(p[0], p[1]) for p in points if isinstance(p[1], (int, float))]
    tps = [(p[0], p[2]) for p in points if isinstance(p[2], (int, float))]
    val = [(v[0], v[3]) for v in run.curve.get("val") or [] if isinstance(v[0], (int, float))
           and isinstance(v[3], (int, float))]
    if loss:
        top.plot(*zip(*loss), label="train loss", color="tab:blue", linewidth=1.2)
    if val:
        top.plot(*zip(*val), label="validation loss", color="tab:orange", marker="o")
    if tps:
        bottom.plot(*zip(*tps), color="tab:green", linewidth=1.0)
    for i, (step, _epoch) in enumerate(_marks(run.curve.get("checkpoints"))):
        for ax in (top, bottom):
            ax.axvline(step, color="tab:gray", linestyle=":", linewidth=1,
                       label="checkpoint" if i == 0 and ax is top else None)
    for i, (step, _attempt) in enumerate(_marks(run.curve.get("restarts"))):
        for ax in (top, bottom):
            ax.axvline(step, color="tab:red", linestyle="--", linewidth=1.2,
                       label="worker-group restart" if i == 0 and ax is top else None)
    for i, (step, _from) in enumerate(_marks(run.curve.get("resizes"))):
        for ax in (top, bottom):
            ax.axvline(step, color="tab:purple", linestyle="-.", linewidth=1.2,
                       label="worker group resized" if i == 0 and ax is top else None)
    if not points and not val:
        top.text(0.5, 0.5, "no progress reported yet", ha="center", va="center",
                 transform=top.transAxes)
    top.set_title(f"{run.name}: {run.state.status}")
    top.set_ylabel("loss")
    bottom.set_ylabel("tokens/s")
    bottom.set_xlabel("step")
    if top.get_legend_handles_labels()[0]:
        top.legend(loc="upper right")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)  # no bbox "tight": the size stays FIGSIZE x DPI
    plt.close(fig)
    return buffer.getvalue()


def _marks(points: Any) -> list[tuple[Any, Any]]:
    return [(p[0], p[1]) for p in points or [] if isinstance(p, list) and len(p) >= 2
            and isinstance(p[0], (int, float))]


def final_metrics(run: RunData) -> dict[str, Any]:
    s = run.state
    out = {"status": s.status, "epoch": s.epoch, "step": s.step, "loss": s.loss,
           "train_loss": s.train_loss, "val_loss": s.val_loss, "tokens_per_sec": s.tokens_per_sec,
           "checkpoints": s.checkpoints, "restarts": s.restarts, "workers": s.world_size,
           "last_checkpoint": s.last_checkpoint,
           "error": s.error}
    out.update({k: v for k, v in s.metrics.items() if k not in out or v is not None})
    return {k: v for k, v in out.items() if v is not None}


def page(run: RunData, png: bytes) -> str:
    """A self-contained HTML page: the figure inline (base64), the final metrics and settings.
    No scripts, no stylesheets or images from elsewhere: it opens offline and in a mail."""
    def table(rows: Mapping[str, Any]) -> str:
        cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_show(v))}</td></tr>"
                        for k, v in rows.items())
        return f"<table>{cells}</table>" if cells else "<p>none recorded</p>"

    image = base64.b64encode(png).decode("ascii")
    title = html.escape(f"submitter report: {run.name}")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{title}</title><style>body{{font-family:sans-serif;margin:2em;max-width:70em}}"
        "table{border-collapse:collapse}th,td{border:1px solid #ccc;padding:.2em .6em;"
        "text-align:left;font-family:monospace}</style></head><body>\n"
        f"<h1>{title}</h1><p>from {html.escape(run.source)}</p>\n"
        f"<img alt=\"loss and tokens/s against step\" src=\"data:image/png;base64,{image}\">\n"
        f"<h2>Final metrics</h2>{table(final_metrics(run))}\n"
        f"<h2>What it took</h2>{took_html(run)}\n"
        f"<h2>Run</h2>{table(run.facts)}\n"
        f"<h2>Settings</h2>{table(run.settings)}\n</body></html>\n")


def took_lines(run: RunData) -> list[str]:
    """What the run took beside its estimate (submitter.pace.took_lines); [] when the run kept
    no usage.json (a cluster job read from its ConfigMap: give --storage-path)."""
    from submitter.pace import took_lines as lines

    return lines(run.usage, run.estimate) if run.usage is not None else []


def took_html(run: RunData) -> str:
    lines = took_lines(run)
    if not lines:
        return "<p>not recorded (usage.json is in the run's folder: give --storage-path)</p>"
    return "".join(f"<p>{html.escape(line)}</p>" for line in lines)


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


@dataclass(frozen=True)
class Written:
    png: Path
    html: Path
    took: tuple[str, ...] = ()  # what the run took beside the estimate, for the terminal


def write(run: RunData, out_dir: str | os.PathLike[str] = ".") -> Written:
    """Write `<name>-report.png` and `<name>-report.html` into `out_dir` (created if needed)."""
    png = figure_png(run)
    root = Path(out_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        png_path, html_path = root / f"{run.name}-report.png", root / f"{run.name}-report.html"
        png_path.write_bytes(png)
        html_path.write_text(page(run, png), encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot write the report into {out_dir}: {e.strerror}") from None
    return Written(png_path, html_path, tuple(took_lines(run)))
