"""The progress ConfigMap sink over real HTTP: the official `kubernetes` client against the API
emulator, on the ConfigMap `submitter render` makes, and read back by `watch`/`status`.

tests/test_events.py drives the sink with a hand-written fake; this proves the same behaviour
with the real client's patch encoding, error types and config loading.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import time

import kubernetes
import pytest

from submitter import cluster
from submitter.cli import main
from submitter.render import render
from submitter.contract.spec import JobSpec
from submitter.state import configmap_events
from tests.submitter.test_watch import NAME, watched
from submitter.contract import events as ev
from submitter.contract import naming
from submitter.contract.naming import ENV_NAMESPACE, ENV_PROGRESS_CONFIGMAP as ENV_CONFIGMAP
from training.events import progress_configmap
from training.events.emitter import Emitter, FileSink, StdoutSink, run_sinks
from training.events.progress_configmap import ConfigMapSink

NAMESPACE = "team"  # not the kubeconfig's namespace: the sink must use the one it is given
PROGRESS = f"{NAME}-progress"


def rendered_configmap(api, kube, namespace=NAMESPACE):
    """Create the job's progress ConfigMap exactly as `submitter render` makes it."""
    api.emulator.put("v1", "namespaces", {"metadata": {"name": namespace}})
    configmap = render(JobSpec.build(name=NAME, namespace=namespace)).get("ConfigMap")
    cluster.apply(kube, [configmap])
    assert configmap["metadata"]["name"] == PROGRESS and "data" not in configmap
    return configmap


def core_v1(kube):
    """The client the sink gets in a pod, built here for the emulator."""
    return kubernetes.client.CoreV1Api(kube.api)


def data_of(kube, namespace=NAMESPACE):
    return kube.get("ConfigMap", namespace, PROGRESS).get("data") or {}


def progress(em, step, epoch=1):
    return em.emit("progress", epoch=epoch, step=step, loss=3.0 - step / 100, tokens_per_sec=40000.0, lr=6e-4)


def started(em):
    return em.emit("run_started", run_name=NAME, num_workers=2, storage_path="s3://bucket/ck")


def test_the_rendered_configmap_gets_the_state_and_the_last_events(api, kube):
    rendered = rendered_configmap(api, kube)
    em = Emitter([ConfigMapSink(PROGRESS, NAMESPACE, api=core_v1(kube))])
    started(em)
    for step in range(1, naming.CONFIGMAP_MAX_EVENTS + 6):
        progress(em, step)
    em.emit("checkpoint_saved", epoch=1, path=f"s3://bucket/ck/{NAME}/checkpoint_000000")

    live = kube.get("ConfigMap", NAMESPACE, PROGRESS)
    assert live["metadata"]["labels"] == rendered["metadata"]["labels"]  # a patch, not a replace
    data = live["data"]
    assert set(data) == {naming.CONFIGMAP_STATE_KEY, naming.CONFIGMAP_EVENTS_KEY, ev.CURVE_KEY}
    curve = ev.parse_curve(data[ev.CURVE_KEY])  # the whole run, beyond the last events
    assert [p[0] for p in ev.curve_points(curve)] == list(range(1, naming.CONFIGMAP_MAX_EVENTS + 6))
    assert curve["checkpoints"] == [[naming.CONFIGMAP_MAX_EVENTS + 5, 1]]
    assert ev.ProgressState.from_dict(json.loads(data[naming.CONFIGMAP_STATE_KEY])) == em.state
    recent = ev.parse_lines(data[naming.CONFIGMAP_EVENTS_KEY])
    assert len(data[naming.CONFIGMAP_EVENTS_KEY].splitlines()) == len(recent) == naming.CONFIGMAP_MAX_EVENTS
    assert recent == em.session[-naming.CONFIGMAP_MAX_EVENTS:]
    assert [e["seq"] for e in recent] == list(range(em.seq - naming.CONFIGMAP_MAX_EVENTS + 1, em.seq + 1))

    cluster.apply(kube, render(JobSpec.build(name=NAME, namespace=NAMESPACE)))  # a re-submit
    assert data_of(kube) == data  # re-applying the plan keeps the progress the job wrote


def test_a_new_driver_without_a_run_dir_continues_seq_from_the_configmap(api, kube, kubeconfig, monkeypatch):
    """As with an s3:// storage path: no events.jsonl to share, the ConfigMap is the history.
    The sinks build their own client from $KUBECONFIG, set after `kubernetes` was imported."""
    rendered_configmap(api, kube)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    environ = {ENV_CONFIGMAP: PROGRESS, ENV_NAMESPACE: NAMESPACE}

    first = Emitter(*run_sinks(None, environ))
    started(first)
    progress(first, 10)
    first.emit("checkpoint_saved", epoch=1, path=f"s3://bucket/ck/{NAME}/checkpoint_000000")

    second = Emitter(*run_sinks(None, environ))  # the RayJob retried: a new driver
    assert second.seq == 3 and second.state == first.state
    resumed = second.worker_group_started(f"s3://bucket/ck/{NAME}/checkpoint_000000", 1, 10)
    assert (resumed["type"], resumed["seq"]) == ("run_resumed", 4)
    assert second.emit("run_finished")["seq"] == 5

    held = configmap_events(kube.get("ConfigMap", NAMESPACE, PROGRESS))
    assert [e["seq"] for e in held] == [1, 2, 3, 4, 5]  # the earlier session's events are kept
    curve = ev.parse_curve(data_of(kube)[ev.CURVE_KEY])  # ...and the curve continues, no duplicates
    assert (curve["progress"], curve["checkpoints"], curve["seq"]) == ([[10, 2.9, 40000.0]], [[10, 1]], 5)
    assert json.loads(data_of(kube)[naming.CONFIGMAP_STATE_KEY])["status"] == "finished"


def test_missing_configmap_and_forbidden_patch_are_told_once_never_raised(api, kube, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    out = io.StringIO()
    events_file = FileSink(str(tmp_path / naming.EVENTS_FILE))
    sink = ConfigMapSink(PROGRESS, NAMESPACE, api=core_v1(kube))
    assert sink.read() == []  # 404: nothing to continue from
    em = Emitter([StdoutSink(out), sink, events_file])
    started(em)
    for step in (10, 20):
        progress(em, step)  # 404 on every patch

    rendered_configmap(api, kube)
    api.emulator.deny("patch", "configmaps")  # the job's Role lacks `patch`
    for step in (30, 40):
        progress(em, step)
    em.emit("run_finished")

    assert [e["seq"] for e in events_file.read()] == [1, 2, 3, 4, 5, 6]
    assert len(out.getvalue().splitlines()) == 6
    assert em.state.status == "finished" and em.state.step == 40
    patches = [r for r in api.emulator.log if r[0] == "PATCH" and "fieldManager" not in r[2]]  # not the apply
    assert len(patches) == 6  # every event was tried: best effort, not given up on
    assert data_of(kube) == {}
    # one line for the job's log (the driver prints it), not one per event or per kind
    assert em.problems() == [sink.problem]
    assert sink.problem.startswith(progress_configmap.PROBLEM_PREFIX)
    assert "404" in sink.problem and f"configmap/{PROGRESS}" in sink.problem
    assert not [r for r in caplog.records if "ConfigMap" in r.getMessage()]


def test_a_forbidden_patch_names_the_role_and_what_it_must_allow(api, kube):
    rendered_configmap(api, kube)
    api.emulator.deny("patch", "configmaps")
    sink = ConfigMapSink(PROGRESS, NAMESPACE, api=core_v1(kube))
    em = Emitter([sink])
    started(em)
    progress(em, 10)
    assert "403 Forbidden" in sink.problem and "cannot patch" in sink.problem
    assert f"must allow get and patch on configmap/{PROGRESS}" in sink.problem


def test_a_pod_without_a_token_says_so(monkeypatch, tmp_path):
    """The head without the service-account token (and no kubeconfig): the reason names it."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "1")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    sink = ConfigMapSink(PROGRESS, NAMESPACE)
    assert sink.read() == []
    Emitter([sink]).emit("run_finished")
    assert sink.problem is not None and "no service-account token in this pod" in sink.problem


def test_a_hung_api_server_costs_an_event_the_timeout_not_the_run(monkeypatch, caplog):
    monkeypatch.setattr(progress_configmap, "API_TIMEOUT", (1.0, 0.3))
    with socket.create_server(("127.0.0.1", 0)) as server:  # connects (backlog), never answers
        configuration = kubernetes.client.Configuration(host=f"http://127.0.0.1:{server.getsockname()[1]}")
        api_client = kubernetes.client.ApiClient(configuration)
        em = Emitter([ConfigMapSink(PROGRESS, NAMESPACE, api=kubernetes.client.CoreV1Api(api_client))])
        clock = time.monotonic()
        assert em.emit("run_finished")["seq"] == 1
        assert time.monotonic() - clock < 3
        assert "unreachable" in em.problems()[0] and "timed out" in em.problems()[0]


def test_an_unreachable_api_server_pauses_progress_patches_but_not_the_final_one():
    now = [0.0]
    api = CountingUnreachableApi()
    sink = ConfigMapSink(PROGRESS, NAMESPACE, api=api, clock=lambda: now[0])
    em = Emitter([sink])
    started(em)                          # no answer: pause
    for step in (10, 20, 30):
        progress(em, step)               # paused: not even tried
    assert api.patches == 1
    now[0] = progress_configmap.UNREACHABLE_PAUSE_S + 1
    progress(em, 40)                     # the pause is over: tried again, with every event
    assert api.patches == 2 and [e["seq"] for e in ev.parse_lines(api.last_events)] == [1, 2, 3, 4, 5]
    em.emit("run_finished")              # how the run ended is always tried
    assert api.patches == 3


class CountingUnreachableApi:
    """A CoreV1Api whose every patch fails as urllib3 does when nothing answers."""

    def __init__(self) -> None:
        self.patches, self.last_events = 0, ""

    def patch_namespaced_config_map(self, name, namespace, body, **kwargs):
        import urllib3

        self.patches += 1
        self.last_events = body["data"][naming.CONFIGMAP_EVENTS_KEY]
        raise urllib3.exceptions.MaxRetryError(None, "/", "Connection refused")


def test_watch_and_status_show_what_the_sink_wrote(api, kube, kubeconfig, runner, operator):
    submitted = runner.invoke(main, ["submit", "--name", NAME, "--kubeconfig", kubeconfig])
    assert submitted.exit_code == 0, submitted.output  # the whole plan, progress ConfigMap included
    kuberay = operator(NAME)  # KubeRay's part only; progress is the real sink's
    em = Emitter([ConfigMapSink(PROGRESS, "default", api=core_v1(kube))])

    def script():
        kuberay.initialize()
        kuberay.run()
        started(em)
        for step in (10, 20):
            progress(em, step)
        em.emit("checkpoint_saved", epoch=1, path=f"/mnt/checkpoints/{NAME}/checkpoint_000000")
        em.emit("epoch_finished", epoch=1, train_loss=2.9, val_loss=3.1, tokens_per_sec=41000.0)
        em.emit("run_finished", final_val_loss=3.1)
        time.sleep(0.2)  # the ConfigMap events reach the watcher before the final status
        kuberay.succeed()

    result, out = watched(api, runner, kubeconfig, script)
    assert result.exit_code == 0, result.output
    assert [o["event"] for o in out if o["kind"] == "event"] == em.session
    final = [o for o in out if o["kind"] == "status"][-1]
    p = em.state
    assert (final["state"], final["epoch"], final["step"], final["loss"], final["tokensPerSec"],
            final["lastCheckpoint"]) == ("SUCCEEDED", p.epoch, p.step, p.loss, p.tokens_per_sec,
                                         p.last_checkpoint)
    assert cluster.status(kube, "default", NAME).progress == em.state  # `submitter status`
