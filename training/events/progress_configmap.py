"""The progress ConfigMap sink: patch the job's ConfigMap with the folded state and recent events.

The one module of the entrypoint that talks to the Kubernetes API (import-linter holds that).
Best effort by design: a hung or refusing API server must never stop or slow training. A sink
that cannot write records why, once (`problem`): the driver prints that line into the job's log
(`training.driver`), and `submitter status` says that progress is unavailable.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from typing import Any, Callable, Mapping

from submitter.contract import events as ev
from submitter.contract import naming

log = logging.getLogger("training.events")
#: (connect, read) seconds for one ConfigMap request: a hung API server must not hang the run.
API_TIMEOUT = (5.0, 10.0)
#: After a request that got no answer (timeout, refused, reset), progress patches pause this
#: long, so an unreachable API server costs one timeout per pause, not one per event. The
#: ConfigMap holds the state and the last events, so the next patch catches up.
UNREACHABLE_PAUSE_S = 30.0
#: Events that are always tried: the ConfigMap must say how the run ended.
_ALWAYS_TRY = frozenset({"run_finished", "run_failed", "run_stopped"})


class ConfigMapSink:
    """Patch the job's progress ConfigMap: the folded state and the last events.

    Best effort: a failure is never raised; training goes on. The first failure's reason (no
    token, 403, unreachable, ...) becomes `problem`, one line, for the owner to show once.
    """

    def __init__(self, name: str, namespace: str, api: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.namespace = name, namespace
        self._api = api
        self._recent: deque[str] = deque(maxlen=naming.CONFIGMAP_MAX_EVENTS)
        self._warned: set[str] = set()
        #: The first failure, as one line with its reason; None while every write succeeded.
        self.problem: str | None = None
        self._clock = clock
        self._paused_until = float("-inf")
        #: The whole run's curve, downsampled (the events key keeps only the last events).
        self._curve: dict[str, Any] = ev.empty_curve()

    def api(self) -> Any:
        if self._api is None:
            from kubernetes import client, config  # lazy: only in a cluster

            configuration = client.Configuration()  # our own: the process-wide default is left alone
            try:
                config.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                # $KUBECONFIG now: the client's default was read when `kubernetes` was imported
                config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None,
                                        client_configuration=configuration, persist_config=False)
            self._api = client.CoreV1Api(client.ApiClient(configuration))
        return self._api

    def continue_from(self, history: list[Mapping[str, Any]]) -> None:
        """Keep the run's earlier events: a new driver's first patch must not drop them."""
        self._recent.extend(ev.to_json(e) for e in history[-naming.CONFIGMAP_MAX_EVENTS:])
        self._curve = ev.curve_fold(history, self._curve)  # events the stored curve lacks

    def read(self) -> list[dict[str, Any]]:
        """The events the ConfigMap already holds (to continue seq without a shared file)."""
        try:
            cm = self.api().read_namespaced_config_map(self.name, self.namespace,
                                                       _request_timeout=API_TIMEOUT)
            data = cm.data or {}
            self._curve = ev.parse_curve(data.get(ev.CURVE_KEY)) or self._curve
            return ev.parse_lines(data.get(naming.CONFIGMAP_EVENTS_KEY, ""))
        except Exception as e:  # noqa: BLE001 - best effort
            self._warn(e)
            return []

    def write(self, event: Mapping[str, Any], state: ev.ProgressState) -> None:
        self._recent.append(ev.to_json(event))
        self._curve = ev.curve_apply(self._curve, event)
        if self._clock() < self._paused_until and event.get("type") not in _ALWAYS_TRY:
            return
        body = {"data": {naming.CONFIGMAP_STATE_KEY: json.dumps(state.to_dict(), sort_keys=True),
                         naming.CONFIGMAP_EVENTS_KEY: "\n".join(self._recent) + "\n",
                         ev.CURVE_KEY: json.dumps(self._curve, separators=(",", ":"))}}
        try:
            self.api().patch_namespaced_config_map(self.name, self.namespace, body,
                                                   _request_timeout=API_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - a status sink must never stop training
            if getattr(e, "status", None) is None:  # no HTTP answer at all (an API error has one)
                self._paused_until = self._clock() + UNREACHABLE_PAUSE_S
            self._warn(e)

    def _warn(self, e: Exception) -> None:
        """Keep the first failure as `problem` (the owner shows it once); later kinds of failure
        go to the debug log only, so the job's log says it once, not once per event."""
        kind = type(e).__name__
        if self.problem is None:
            self.problem = (f"{PROBLEM_PREFIX} configmap/{self.name} in namespace "
                            f"{self.namespace} cannot be written: {reason(e, self.name)}; "
                            "submitter status and watch show no training progress (events.jsonl "
                            "in the run directory and this log still have it); training continues")
        if kind not in self._warned:
            self._warned.add(kind)
            log.debug("progress ConfigMap %s/%s not updated (%s: %s)", self.namespace, self.name,
                      kind, _describe(e))


#: The start of the sink's one line in the job's log (grep for it).
PROBLEM_PREFIX = "progress unavailable:"


def reason(e: Exception, name: str) -> str:
    """Why a ConfigMap request failed, in the words of what to check: the token, the Role, the
    network. `e` is what the kubernetes client raised (or its config loader)."""
    status = getattr(e, "status", None)
    said = _describe(e)
    if type(e).__name__ == "ConfigException":  # neither in-cluster config nor a kubeconfig
        return ("no service-account token in this pod (the head's pod template must mount it: "
                f"automountServiceAccountToken) and no kubeconfig ({said})")
    if status is None:
        return f"the API server is unreachable from this pod ({type(e).__name__}: {said})"
    if status == 401:
        return f"401 Unauthorized: the API server refused the pod's token ({said})"
    if status == 403:
        return (f"403 Forbidden: the pod's service account may not do this; its Role must allow "
                f"get and patch on configmap/{name} ({said})")
    if status == 404:
        return f"404: configmap/{name} does not exist (submit creates it; was it deleted?)"
    return f"{status}: {said}"


def _describe(e: Exception) -> str:
    """One line; for an API error its status and the server's reason ("... cannot patch ...")."""
    text = str(e).splitlines()[0] if str(e) else ""
    try:
        message = json.loads(getattr(e, "body", None) or "{}").get("message")
    except (TypeError, ValueError, AttributeError):
        message = None
    return f"{text} {message}"[:300] if message else text[:200]
