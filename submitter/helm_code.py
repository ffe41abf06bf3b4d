"""A --script job's Helm values: the chart cannot pack code, so `submitter render --script FILE
--helm-values` carries what render would put in the cluster, under the chart-only key `code`.

    code:
      ref: '{"configmap": ..., "entry": "train.py", "sha256": ..., "pip": [...]}'  # SUBMITTER_CODE
      configmap: <the job's code ConfigMap>   # null when the bundle goes to the run's bucket
      key: bundle.zip
      data: <the bundle, base64>              # "" for a bucket bundle (upload it first)

The chart renders the same objects from these as `submitter render --script` (the code
ConfigMap, its Role rule, the runner's entrypoint, the head's SUBMITTER_CODE). A bucket bundle
is not uploaded by render (it writes nothing): `submitter submit` uploads it (`upload_line`).
"""

from __future__ import annotations

import base64
from typing import Any, Optional

from submitter.contract.spec import JobSpec

#: The chart-only values key (not a JobSpec field: never part of the job document).
CODE_KEY = "code"


def code_values(spec: JobSpec) -> Optional[dict[str, Any]]:
    """The `code` values of a --script job (None for the GPT-2 job)."""
    from submitter.code_plan import code_plan
    from submitter.contract.code import BUNDLE_KEY

    plan = code_plan(spec)
    if plan is None:
        return None
    data = base64.b64encode(plan.bundle.data).decode("ascii") if plan.configmap else ""
    return {"ref": plan.env_value, "configmap": plan.configmap, "key": BUNDLE_KEY, "data": data}


def helm_values(spec: JobSpec) -> dict[str, Any]:
    """What `--helm-values` writes: the job's fields, plus `code` for a --script job."""
    values = spec.to_values()
    code = code_values(spec)
    if code is not None:
        values[CODE_KEY] = code
    return values


def upload_line(spec: JobSpec) -> Optional[str]:
    """For a bundle that goes to the bucket: the line saying it must be uploaded before the
    chart's job starts (None for a ConfigMap bundle or the GPT-2 job)."""
    from submitter.code_plan import code_plan

    plan = code_plan(spec)
    if plan is None or plan.uri is None:
        return None
    return (f"note: the code bundle goes to {plan.uri}; it must be there before the chart's "
            "job starts: `submitter submit` with the same flags uploads it (render writes "
            "nothing)")
