"""Which data path a job takes, from what `--data`/`--dataset` say (pure; stdlib only).

- **prepared**: `--data` names a prepared corpus (training.data.shards: token shards plus a
  manifest, made once by `submitter data prepare`): a NAME (no `/`: `<storage>/corpora/NAME`,
  under the namespace's root on a cluster), a path ending in `/manifest.json`, or a path under
  a `corpora/` directory. The workers read its shards by position: no tokenizing, no Ray Data,
  so a worker pod keeps no CPU back for Ray Data.
- **decided at start**: `--data` is a directory or bucket prefix without a file suffix: a
  prepared corpus when it holds `manifest.json`, else its files are tokenized on the fly. The
  pods keep the data CPUs (render cannot look).
- **on the fly**: files with a text/Parquet/JSONL suffix, a Hugging Face dataset, the offline
  corpus: Ray Data reads and tokenizes them in the worker pods every epoch (fine for small data;
  prepare large data once).

`render` shows the choice and why (`resolved.dataPath`); the run's first lines say it again.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Optional

from submitter.contract.naming import OFFLINE_DATASET
from submitter.contract.storage import CORPORA_DIR

PREPARED, AT_START, ON_THE_FLY = "prepared", "decided-at-start", "on-the-fly"
MANIFEST = "manifest.json"
#: A corpus NAME as JSON Schema sees it (the chart's values): no `/`, no `.`, no scheme.
CORPUS_NAME_PATTERN = "^[^/.:\\x00-\\x1f\\x7f]+$"
#: A mixture of prepared corpora by NAME, `NAME:WEIGHT,NAME:WEIGHT` (the chart's values).
_MIX_NAME = "[^/.:,\\x00-\\x1f\\x7f]+"
#: A mixture's weight: a positive decimal number (no sign, no exponent).
MIX_WEIGHT = "(?:[0-9]*[1-9][0-9]*(?:\\.[0-9]*)?|[0-9]*\\.[0-9]*[1-9][0-9]*)"
MIXTURE_PATTERN = f"^{_MIX_NAME}:{MIX_WEIGHT}(?:,{_MIX_NAME}:{MIX_WEIGHT})*$"
#: What reads as an attempt at a mixture (checked by mixture_problem).
_MIXTURE_FORM = f"^{_MIX_NAME}:[^/:,]*(?:,{_MIX_NAME}:[^/:,]*)*$"
#: Sequences per mixture round (training.data.order.MixtureOrder): each corpus's share of a
#: round is whole, so a share under 1/MIX_ROUND is refused.
MIX_ROUND = 1024


@dataclass(frozen=True)
class DataPath:
    kind: str           # PREPARED | AT_START | ON_THE_FLY
    why: str            # one line for `resolved` and the run's output
    name: Optional[str] = None  # a prepared corpus given by NAME
    mixture: tuple[tuple[str, float], ...] = ()  # prepared corpora by NAME, with weights

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "why": self.why}


def is_corpus_name(data: str) -> bool:
    """A bare NAME (`--data fineweb10b`): a corpus under the storage's corpora/."""
    return re.fullmatch(CORPUS_NAME_PATTERN, data) is not None


def data_path(data: Optional[str], dataset: str) -> DataPath:
    """The job's data path (see the module's docstring)."""
    if data is None:
        what = ("the offline corpus" if dataset == OFFLINE_DATASET
                else f"Hugging Face dataset {dataset}")
        return DataPath(ON_THE_FLY, f"{what}: tokenized on the fly by Ray Data in the worker "
                                    "pods (prepare large data once: submitter data prepare)")
    parts = mixture(data)
    if parts:
        return DataPath(PREPARED, f"--data {data} mixes prepared corpora by weight ("
                                  f"{mixture_shares(parts)}; <storage>/{CORPORA_DIR}/NAME): "
                                  "every step in these proportions, read by position in the "
                                  "workers, nothing tokenized, no Ray Data", mixture=parts)
    if is_corpus_name(data):
        return DataPath(PREPARED, f"--data {data} names a prepared corpus "
                                  f"(<storage>/{CORPORA_DIR}/{data}): its shards are read by "
                                  "position in the workers, nothing tokenized, no Ray Data",
                        name=data)
    path = data.rstrip("/")
    if posixpath.basename(path) == MANIFEST or f"/{CORPORA_DIR}/" in f"{path}/":
        return DataPath(PREPARED, f"--data {data} is a prepared corpus: its shards are read by "
                                  "position in the workers, nothing tokenized, no Ray Data")
    if "." not in posixpath.basename(path):
        return DataPath(AT_START, f"--data {data} is a directory: a prepared corpus if it "
                                  f"holds {MANIFEST} (read by position), else its files are "
                                  "tokenized on the fly")
    return DataPath(ON_THE_FLY, f"--data {data}: files tokenized on the fly by Ray Data in the "
                                "worker pods (prepare large data once: submitter data prepare)")


def corpus_dir(data: str) -> str:
    """The corpus directory a prepared `--data` path names (without `/manifest.json`)."""
    path = data.rstrip("/")
    return posixpath.dirname(path) if posixpath.basename(path) == MANIFEST else path


def looks_like_mixture(data: str) -> bool:
    """`--data` in the mixture's form (NAME:WEIGHT[,NAME:WEIGHT...]), checked or not."""
    return re.fullmatch(_MIXTURE_FORM, data) is not None


def mixture_problem(data: str) -> Optional[str]:
    """What is wrong with a `--data` mixture (None: nothing, or not a mixture)."""
    if not looks_like_mixture(data):
        return None
    seen: set[str] = set()
    for part in data.split(","):
        name, _, weight = part.partition(":")
        if not re.fullmatch(MIX_WEIGHT, weight):
            return (f"{part!r}: the weight of a mixture's corpus is a positive number "
                    f"(e.g. --data fineweb-edu:0.7,stack:0.3)")
        if name in seen:
            return f"{name!r} is in the mixture twice: give each corpus once, with its weight"
        seen.add(name)
    total = sum(float(p.partition(":")[2]) for p in data.split(","))
    small = [p for p in data.split(",") if float(p.partition(":")[2]) * MIX_ROUND < total]
    if small:
        return (f"{small[0]!r}: a share under 1/{MIX_ROUND} of the mixture; give it a larger "
                f"weight or leave it out")
    return None


def mixture(data: Optional[str]) -> tuple[tuple[str, float], ...]:
    """`--data NAME:WEIGHT,NAME:WEIGHT` as ((NAME, WEIGHT), ...) (): not a valid mixture)."""
    if data is None or not looks_like_mixture(data) or mixture_problem(data):
        return ()
    return tuple((name, float(w)) for name, _, w in (p.partition(":") for p in data.split(",")))


def mixture_shares(parts: tuple[tuple[str, float], ...]) -> str:
    """'a 70%, b 30%': each corpus's share of every step."""
    total = sum(w for _, w in parts)
    return ", ".join(f"{name} {100 * w / total:.3g}%" for name, w in parts)
