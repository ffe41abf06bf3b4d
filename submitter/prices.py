"""The price of a GPU-hour, for the cost estimate and --max-cost (#38).

No built-in prices: they go stale and differ per contract. The price is, in order,
`--gpu-hour-price` (also `gpu_hour_price` in the job file, `gpuHourPrice` in the chart's
values), else the user's own table `submitter-prices.yaml` beside their kubeconfig (the
directory of --kubeconfig, else of $KUBECONFIG's first file, else ~/.kube), one line a card:

    H100: 2.49            # any name --gpu-type takes: the peak table's card it names is matched
    NVIDIA-L4: 0.71
    local: 0.10           # a `submit --local` run: one hour of this machine

Without either, the estimate gives hours only and says how to add a price.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Optional

from submitter.contract.errors import UsageError
from submitter.contract.estimate import Price
from submitter.contract.flops import peak_for

PRICES_FILE = "submitter-prices.yaml"
#: The table's key for a local run's machine.
LOCAL_KEY = "local"


def prices_path(kubeconfig: Optional[str] = None, environ: Mapping[str, str] = os.environ) -> str:
    """Where the user's price table lives: beside the kubeconfig in use."""
    first = kubeconfig or next((p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p),
                               None)
    folder = os.path.dirname(os.path.abspath(os.path.expanduser(first))) if first else \
        os.path.expanduser("~/.kube")
    return os.path.join(folder, PRICES_FILE)


def parse_prices(doc: Any, where: str) -> dict[str, float]:
    """The table as {name: price}; a malformed one is one line naming the fix (exit 2)."""
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise UsageError(f"{where}: expected lines `CARD: PRICE` (e.g. `H100: 2.49`), got "
                         f"{type(doc).__name__}; fix or remove it")
    out: dict[str, float] = {}
    for key, value in doc.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or value <= 0:
            raise UsageError(f"{where}: {key}: {value!r} is not a price; write a positive "
                             f"number per GPU-hour, e.g. `{key}: 2.49`")
        out[str(key)] = float(value)
    return out


def lookup(table: Mapping[str, float], gpu_type: Optional[str], local: bool) -> Optional[tuple[str, float]]:
    """The table's line for the job: `local` for a local run; for a card, its exact --gpu-type
    spelling, else a line naming the same card of the peak table (H100 = NVIDIA-H100-80GB-HBM3)."""
    if local:
        return (LOCAL_KEY, table[LOCAL_KEY]) if LOCAL_KEY in table else None
    if not gpu_type:
        return None
    if gpu_type in table:
        return gpu_type, table[gpu_type]
    card = peak_for(gpu_type)
    for key, value in table.items():
        other = peak_for(key)
        if card is not None and other is not None and other.label == card.label:
            return key, value
    return None


def read_table(path: str) -> dict[str, float]:
    """The table at `path` ({} when there is none)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise UsageError(f"{path}: cannot read the price table ({e.strerror}); fix or remove it") from None
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UsageError(f"{path}: not YAML ({' '.join(str(e).split())[:120]}); write lines "
                         "`CARD: PRICE`") from None
    return parse_prices(doc, path)


def price_for(gpu_hour_price: Optional[float], gpu_type: Optional[str], local: bool,
              kubeconfig: Optional[str] = None,
              environ: Mapping[str, str] = os.environ) -> Optional[Price]:
    """The job's price per GPU-hour (a local run: per hour) and where it came from, or None."""
    unit = "hour of this machine" if local else "GPU-hour"
    if gpu_hour_price is not None:
        return Price(gpu_hour_price, f"{gpu_hour_price:g} per {unit}: gpu_hour_price (flag, job "
                                     "file or chart value)")
    path = prices_path(kubeconfig, environ)
    found = lookup(read_table(path), gpu_type, local)
    if found is None:
        return None
    key, value = found
    return Price(value, f"{value:g} per {unit}: `{key}` in {path}")
