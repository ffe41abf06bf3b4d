"""The entrypoint's emitter: seq, fold, the sinks (file, stdout, ConfigMap), history across runs."""

from __future__ import annotations

import io
import json

import pytest

from submitter.contract import events as ev
from submitter.contract import naming
from training.events.emitter import Emitter, FileSink, RunEmitter, StdoutSink
from training.events.progress_configmap import ConfigMapSink


def _clock():
    n = iter(range(10_000))
    return lambda: f"2026-01-01T00:00:{next(n):02d}.000Z"


def test_emitter_writes_every_sink_and_folds_state(tmp_path):
    out = io.StringIO()
    fs = FileSink(str(tmp_path / "run" / naming.EVENTS_FILE))
    em = Emitter([StdoutSink(out), fs], clock=_clock())
    em.emit("run_started", run_name="r", num_workers=2, storage_path="/s")
    em.emit("progress", epoch=1, step=5, loss=float("nan"), tokens_per_sec=10.0, lr=1e-3)
    lines = out.getvalue().splitlines()
    assert all(line.startswith(ev.STDOUT_PREFIX) for line in lines)
    from_file = fs.read()
    assert [e["seq"] for e in from_file] == [1, 2]
    assert from_file[1]["loss"] is None  # NaN is sent as null, the schema forbids it
    assert em.state.status == "running" and em.state.step == 5 and em.state.last_seq == 2


def test_seq_continues_from_the_events_file_across_runs(tmp_path):
    run_dir = str(tmp_path / "runs" / "job")
    first = RunEmitter(run_dir, {})
    for _ in range(3):
        first.emit("run_started", run_name="job", num_workers=1, storage_path="/s")
    second = RunEmitter(run_dir, {})  # a new driver (resubmit / RayJob retry)
    event = second.emit("run_finished")
    assert event["seq"] == 4
    assert second.state.status == "finished" and second.state.run_name == "job"
    seqs = [e["seq"] for e in FileSink(f"{run_dir}/{naming.EVENTS_FILE}").read()]
    assert seqs == [1, 2, 3, 4]


def test_worker_group_restarts_are_told_apart_from_a_resumed_run():
    em = Emitter([])
    assert em.worker_group_started(None, 1, 0) is None  # first start, fresh run: nothing
    restarted = em.worker_group_started("/s/job/checkpoint_epoch001_step0000010", 2, 10)
    assert restarted["type"] == "worker_group_restarted" and restarted["attempt"] == 1
    assert restarted["resumed_from"].endswith("step0000010")
    again = em.worker_group_started(None, 1, 0)
    assert again["attempt"] == 2 and again["resumed_from"] is None
    assert em.state.restarts == 2

    resumed = Emitter([]).worker_group_started("/s/job/ck", 3, 40)
    assert resumed["type"] == "run_resumed" and resumed["step"] == 40


def test_restart_attempts_count_on_across_driver_sessions():
    earlier = [ev.make_event("worker_group_restarted", seq=1, attempt=1, resumed_from="/s/j/a"),
               ev.make_event("run_failed", seq=2, error="node lost")]
    em = Emitter([], history=earlier)  # the RayJob retried: a new driver, same events
    assert em.worker_group_started("/s/j/b", 2, 20)["type"] == "run_resumed"
    assert em.worker_group_started("/s/j/c", 2, 30)["attempt"] == 2
    assert em.state.restarts == 2


def test_since_returns_only_this_sessions_newer_events():
    em = Emitter([], history=[ev.make_event("run_finished", seq=7)])
    a = em.emit("run_started", run_name="r", num_workers=1, storage_path="/s")
    b = em.emit("run_finished")
    assert (a["seq"], b["seq"]) == (8, 9)
    assert em.since(0) == [a, b] and em.since(8) == [b]


class FakeCoreV1:
    """Records patches like the API would store them; can be told to fail."""

    def __init__(self, fail: bool = False, data: dict | None = None):
        self.fail, self.patches, self.data = fail, [], data

    def patch_namespaced_config_map(self, name, namespace, body, **kwargs):
        if self.fail:
            raise ConnectionError("API unreachable")
        self.patches.append((name, namespace, body))

    def read_namespaced_config_map(self, name, namespace, **kwargs):
        if self.fail:
            raise ConnectionError("API unreachable")
        return type("CM", (), {"data": self.data})()


def test_configmap_sink_patches_state_and_bounded_events():
    api = FakeCoreV1()
    em = Emitter([ConfigMapSink("job-progress", "ns", api=api)])
    for i in range(naming.CONFIGMAP_MAX_EVENTS + 5):
        em.emit("progress", epoch=1, step=i + 1, loss=1.0, tokens_per_sec=1.0, lr=1e-3)
    name, namespace, body = api.patches[-1]
    assert (name, namespace) == ("job-progress", "ns")
    state = json.loads(body["data"][naming.CONFIGMAP_STATE_KEY])
    assert state["step"] == naming.CONFIGMAP_MAX_EVENTS + 5 and state["status"] == "running"
    recent = ev.parse_lines(body["data"][naming.CONFIGMAP_EVENTS_KEY])
    assert len(recent) == naming.CONFIGMAP_MAX_EVENTS and recent[-1]["seq"] == em.seq


def test_a_failing_configmap_never_stops_the_other_sinks(tmp_path, caplog):
    fs = FileSink(str(tmp_path / naming.EVENTS_FILE))
    em = Emitter([ConfigMapSink("cm", "ns", api=FakeCoreV1(fail=True)), fs])
    em.emit("run_started", run_name="r", num_workers=1, storage_path="/s")
    em.emit("run_finished")
    assert len(fs.read()) == 2
    problems = em.problems()
    assert len(problems) == 1 and "unreachable" in problems[0]  # told once, not per event


def test_an_events_file_that_cannot_be_written_warns_once_per_event(tmp_path, caplog):
    (tmp_path / "ro").write_text("a file where the run directory should be")
    fs = FileSink(str(tmp_path / "ro" / naming.EVENTS_FILE))
    seen: list[dict] = []  # a sink after the file still gets the event
    sink = type("Seen", (), {"write": lambda self, e, state: seen.append(e)})()
    em = Emitter([fs, sink])
    with caplog.at_level("WARNING"):
        event = em.emit("run_started", run_name="r", num_workers=1, storage_path="/s")
    assert event["seq"] == 1 and seen == [event]
    assert len([r for r in caplog.records if "FileSink failed" in r.getMessage()]) == 1


def test_seq_continues_from_the_configmap_when_no_file_is_shared(monkeypatch):
    held = "\n".join(ev.to_json(ev.make_event("run_finished", seq=s)) for s in (11, 12))
    api = FakeCoreV1(data={naming.CONFIGMAP_EVENTS_KEY: held})
    monkeypatch.setattr(ConfigMapSink, "api", lambda self: api)
    em = RunEmitter(None, {"SUBMITTER_PROGRESS_CONFIGMAP": "job-progress",
                           "SUBMITTER_NAMESPACE": "team"})
    assert em.seq == 12
    assert em.emit("run_finished")["seq"] == 13
    assert api.patches and api.patches[-1][1] == "team"


def test_a_torn_last_line_is_repaired_before_appending(tmp_path):
    """A node crashed mid-write: the next driver's first event must not be glued onto the
    fragment (and lost with it)."""
    path = tmp_path / naming.EVENTS_FILE
    whole = ev.to_json(ev.make_event("run_started", seq=1, run_name="r", num_workers=1,
                                     storage_path="/s"))
    path.write_text(whole + "\n" + '{"v":1,"type":"progress","ti')
    em = RunEmitter(str(tmp_path), {})
    em.emit("run_resumed", resumed_from="/s/r/ck", epoch=1, step=4)
    events = FileSink(str(path)).read()
    assert [e["type"] for e in events] == ["run_started", "run_resumed"]
    assert events[-1]["seq"] == 2
    assert path.read_text().splitlines()[1].startswith('{"v":1,"type":"progress","ti')  # kept


def test_a_complete_last_line_without_newline_is_kept_as_an_event(tmp_path):
    path = tmp_path / naming.EVENTS_FILE
    path.write_text(ev.to_json(ev.make_event("run_finished", seq=1)))
    FileSink(str(path)).write(ev.make_event("run_failed", seq=2, error="x"), ev.ProgressState())
    assert [e["seq"] for e in FileSink(str(path)).read()] == [1, 2]


def test_the_driver_can_ask_the_workers_for_a_preemption_checkpoint():
    em = Emitter([])
    assert em.preemption_requested() is False
    em.request_preemption()
    assert em.preemption_requested() is True


class _Remote:
    def __init__(self, fn):
        self.remote = fn


def test_the_driver_tells_a_sink_problem_once_in_the_job_log(monkeypatch):
    """The emitter actor's ConfigMap sink cannot write: the driver's poller prints its one line
    (the job's log is the driver's stdout), however many events and polls follow."""
    ray = pytest.importorskip("ray")
    from training.events.poller import EventPoller

    monkeypatch.setattr(ray, "get", lambda ref, **kw: ref)
    em = Emitter([ConfigMapSink("cm", "ns", api=FakeCoreV1(fail=True))])
    hub = type("Hub", (), {})()
    hub.since, hub.problems = _Remote(em.since), _Remote(em.problems)
    told, shown = [], []
    poller = EventPoller(hub, shown.append, 60.0, told.append)
    for step in range(1, 4):
        em.emit("progress", epoch=1, step=step, loss=1.0, tokens_per_sec=1.0, lr=1e-3)
        poller.drain()
    poller.tell_problems()
    assert len(shown) == 3
    assert len(told) == 1 and told[0].startswith("progress unavailable: configmap/cm")


def test_a_script_run_prints_each_event_and_a_sink_problem_once(monkeypatch, capsys):
    """The --script driver's output is its job log too: the same poller as the GPT-2 driver's."""
    ray = pytest.importorskip("ray")
    from training.script import hooks as script_hooks

    monkeypatch.setattr(ray, "get", lambda ref, **kw: ref)
    monkeypatch.setattr(script_hooks, "_poller", [])
    em = Emitter([ConfigMapSink("cm", "ns", api=FakeCoreV1(fail=True))])
    hub = type("Hub", (), {})()
    hub.since, hub.problems = _Remote(em.since), _Remote(em.problems)
    for step in range(1, 3):
        em.emit("progress", epoch=1, step=step, loss=1.0, tokens_per_sec=1.0, lr=1e-3)
        script_hooks.drain(hub)
    script_hooks.drain(hub)
    lines = capsys.readouterr().out.splitlines()
    assert len([line for line in lines if line.startswith(ev.STDOUT_PREFIX)]) == 2
    assert len([line for line in lines if "progress unavailable: configmap/cm" in line]) == 1


def test_the_emitter_actor_is_pinned_to_the_drivers_node_not_preferred(monkeypatch):
    """Only the driver's pod (the head) mounts the service-account token the ConfigMap sink
    needs: the actor's node affinity must be hard (a soft one put it on a worker in 2 of 5
    runs). tests/test_kuberay_standin.py checks where it really ran."""
    ray = pytest.importorskip("ray")
    from training import driver

    seen = {}

    class Remote:
        def options(self, **kwargs):
            seen.update(kwargs)
            return self

        def remote(self, *args):
            return "actor"

    context = type("Ctx", (), {"get_node_id": lambda self: "ab" * 28})()
    monkeypatch.setattr(ray, "remote", lambda cls: Remote())
    monkeypatch.setattr(ray, "get_runtime_context", lambda: context)
    monkeypatch.setattr(driver, "run_dir_of", lambda cfg: "/runs/x")
    assert driver._start_hub(None) == "actor"
    strategy = seen["scheduling_strategy"]
    assert strategy.node_id == "ab" * 28 and strategy.soft is False
