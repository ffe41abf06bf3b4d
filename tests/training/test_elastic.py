"""Elastic worker groups: the pure parts (ScalingConfig options, the step of each group size,
micro-batch groups) and worker_group_resized from the emitter to watch's text."""

from __future__ import annotations

import pytest

from submitter.contract import batch
from submitter.contract import events as ev
from submitter.event_text import describe
from training.gpt2.elastic import RESIZE_INTERVAL_ENV, cpus_per_worker, group_batch, scaling_options
from training.events.emitter import Emitter
from training.gpt2.microbatch import worker_batch


def test_scaling_options_fixed_and_elastic():
    assert scaling_options(3, 3, {}) == {"num_workers": 3}
    assert scaling_options(1, 4, {}) == {"num_workers": (1, 4),
                                         "elastic_resize_monitor_interval_s": 60.0}
    assert scaling_options(1, 4, {RESIZE_INTERVAL_ENV: "5"})["elastic_resize_monitor_interval_s"] == 5.0


def test_an_elastic_worker_reserves_its_pods_share_so_a_pod_holds_exactly_its_workers():
    assert cpus_per_worker(True, 3, 1.0) == 3.0  # a 4-CPU pod: 3 for the worker, 1 for Ray Data
    assert cpus_per_worker(False, 3, 1.0) == 1.0


@pytest.mark.parametrize("world", [1, 2, 3, 5, 6])
def test_every_group_size_makes_the_same_step(world):
    resolved = batch.Resolved(8, 48)  # --batch-size-per-worker 8 --global-batch-size 48
    how = group_batch(worker_batch(resolved, world, 0), world, 64)
    assert how["global_batch_size"] == 48 and how["tokens_per_step"] == 48 * 64
    assert how["micro_batch_size"] == 8 and how["world_size"] == world
    assert how["accumulation_steps"] == -(-6 // world)  # rank 0 carries the larger share


def test_without_a_global_batch_the_step_follows_the_group():
    assert group_batch(worker_batch(batch.Resolved(8, None), 3, 0), 3, 64)["global_batch_size"] == 24


def test_a_resize_keeps_the_step_and_changes_the_micro_batch():
    """2 -> 3 GPUs with 2,048 sequences a step: shares 1,024 -> 704/704/640; on a card that
    fits 300 sequences the micro-batch goes 256 -> 176 and 160, the step stays 2,048."""
    resolved = batch.Resolved(None, 2048, fits=64)
    two = [worker_batch(resolved, 2, r, fits=300) for r in range(2)]
    three = [worker_batch(resolved, 3, r, fits=300) for r in range(3)]
    assert [(w.micro, w.accumulation) for w in two] == [(256, 4), (256, 4)]
    assert [(w.micro, w.accumulation) for w in three] == [(176, 4), (176, 4), (160, 4)]
    for group in (two, three):
        assert sum(w.share for w in group) == 2048
        assert {group_batch(w, len(group), 256)["tokens_per_step"] for w in group} == {524_288}


def test_a_start_with_another_world_size_is_a_resize():
    em = Emitter([])
    same = {"global_batch_size": 16, "tokens_per_step": 1024}
    assert em.worker_group_started(None, 1, 0, world_size=2, accumulation_steps=1, **same) is None
    assert em.state.world_size == 2
    restarted = em.worker_group_started("/s/j/a", 1, 10, world_size=2, accumulation_steps=1, **same)
    assert restarted["type"] == "worker_group_restarted"  # same size: no resize
    shrunk = em.worker_group_started("/s/j/b", 1, 12, world_size=1, accumulation_steps=2, **same)
    assert shrunk["type"] == "worker_group_resized"
    assert (shrunk["from"], shrunk["to"], shrunk["global_batch_size"]) == (2, 1, 16)
    grown = em.worker_group_started("/s/j/c", 2, 20, world_size=2, accumulation_steps=1, **same)
    assert (grown["from"], grown["to"]) == (1, 2)
    types = [e["type"] for e in em.session]
    assert types == ["worker_group_restarted", "worker_group_restarted", "worker_group_resized",
                     "worker_group_restarted", "worker_group_resized"]
    assert em.state.world_size == 2 and em.state.restarts == 3


def test_a_new_driver_knows_the_last_size_from_the_history():
    history = [ev.make_event("worker_group_restarted", seq=1, attempt=1, resumed_from="/a",
                             world_size=3)]
    assert ev.fold(history).world_size == 3
    resized = Emitter([], history=history).worker_group_started("/b", 2, 5, world_size=2)
    assert (resized["from"], resized["to"]) == (3, 2)


def test_a_fresh_runs_first_group_size_survives_the_driver():
    """A fresh run's first start sends no group event: its first progress carries world_size
    (training.gpt2.loop), so the next driver session still sees a resize."""
    history = [ev.make_event("progress", seq=1, epoch=1, step=1, loss=5.0, tokens_per_sec=1.0,
                             lr=1e-3, world_size=4),
               ev.make_event("progress", seq=2, epoch=1, step=2, loss=4.9, tokens_per_sec=1.0,
                             lr=1e-3)]
    assert ev.fold(history).world_size == 4
    resized = Emitter([], history=history).worker_group_started("/b", 1, 2, world_size=2)
    assert (resized["from"], resized["to"]) == (4, 2)


def test_resized_folds_and_reads_as_one_line():
    event = ev.make_event("worker_group_resized", seq=4, resumed_from="/s/j/ck", epoch=1,
                          step=12, global_batch_size=16, **{"from": 2, "to": 1})
    assert ev.fold([event]).world_size == 1
    assert describe(event) == ("worker group resized: 2 -> 1 worker(s), 16 sequences per step, "
                               "resumed from /s/j/ck")
    with pytest.raises(ev.EventError, match="lacks from"):
        ev.validate_event({"type": "worker_group_resized", "time": "t", "to": 1})


def test_the_reports_curve_marks_each_resize():
    events = [ev.make_event("progress", seq=1, epoch=1, step=20, loss=3.0, tokens_per_sec=1.0,
                            lr=1e-3),
              ev.make_event("worker_group_resized", seq=2, step=20, **{"from": 2, "to": 1}),
              ev.make_event("worker_group_resized", seq=3, step=40, **{"from": 1, "to": 2})]
    assert ev.curve_fold(events)["resizes"] == [[20, 2, 1], [40, 1, 2]]
    old = {k: v for k, v in ev.empty_curve().items() if k != "resizes"}  # a curve from before
    assert ev.curve_fold(events[1:2], old)["resizes"] == [[20, 2, 1]]


def _pod_offers(rendered_group: dict) -> dict[str, float]:
    """What one worker pod of the rendered group gives Ray: `--num-cpus` (its CPU limit rounded
    up, as KubeRay adds it), its GPUs, and the `--resources` of its rayStartParams (bash-quoted)."""
    import json
    import math
    import shlex

    limits = rendered_group["template"]["spec"]["containers"][0]["resources"]["limits"]
    cpu = limits["cpu"]
    offers = {"CPU": float(math.ceil(int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu))),
              "GPU": float(limits.get("nvidia.com/gpu", 0))}
    [arg] = shlex.split(f"--resources={rendered_group['rayStartParams']['resources']}")
    offers.update(json.loads(arg.split("=", 1)[1]))
    return offers


@pytest.mark.parametrize("replicas, gpus, cpu", [("1:2", 0, "2"), ("2:3", 0, "4"), (3, 0, "2"),
                                                 ("1:4", 2, "6"), (2, 8, "64"), (1, 0, "4500m")])
def test_a_pod_holds_exactly_the_train_workers_it_was_rendered_for(replicas, gpus, cpu):
    """Ray fits as many workers on a pod as every reserved resource allows: with the train slot,
    that is the pod's rendered workers, never more, so Ray Data keeps its CPUs even when an
    elastic group that lost a pod restarts on the pods left (the hang the stand-in found)."""
    from submitter.render import render
    from submitter.contract.spec import JobSpec
    from training.gpt2.config import TrainConfig
    from training.driver import train_resources

    spec = JobSpec.build(name="job", replicas=replicas, gpu_per_pod=gpus, cpu_per_pod=cpu,
                         memory_per_pod="64Gi")
    [rayjob] = [o for o in render(spec) if o["kind"] == "RayJob"]
    [group] = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    offers = _pod_offers(group)
    cfg = TrainConfig.from_spec(spec, "/tmp/run", cpus_per_worker=cpus_per_worker(
        spec.elastic, spec.cpus_per_train_worker, 1.0))
    each = train_resources(cfg)
    fits = min(int(offers.get(k, 0) // v) for k, v in each.items())
    assert fits == spec.workers_per_pod
    assert offers["CPU"] - fits * each["CPU"] >= spec.data_cpus_per_pod  # Ray Data's, untouched
    assert fits * group["maxReplicas"] == cfg.num_workers  # a full group fits, fixed or elastic
