"""The step-time estimate on a named GPU and the grace-period warning of `submitter render`
(issue 23 item 2: a preemption checkpoint must fit what the grace period leaves)."""

from __future__ import annotations

import pytest

from submitter.contract import step_time
from submitter.contract.spec import JobSpec


def _spec(gpu_type, replicas=1, gpus=1, grace=120, **extra):
    return JobSpec.build(name="j", replicas=replicas, gpu_per_pod=gpus, gpu_type=gpu_type,
                         termination_grace_period=grace, cpu_per_pod=str(2 * gpus + 2),
                         memory_per_pod="64Gi", **extra)


def test_a_step_takes_longer_on_a_slower_card_and_on_fewer_gpus():
    t4, h100 = step_time.estimate(_spec("Tesla-T4")), step_time.estimate(_spec("NVIDIA-H100-80GB-HBM3"))
    assert 15 < t4.step_s < 40 and t4.gpu == "T4"  # 0.5 M tokens x 0.77 GFLOP at 25% of 65 TFLOP/s
    assert t4.step_s / h100.step_s == pytest.approx(989 / 65)
    eight = step_time.estimate(_spec("NVIDIA-H100-80GB-HBM3", replicas=8, gpus=8))
    assert h100.step_s / eight.step_s == pytest.approx(64)
    elastic = step_time.estimate(_spec("Tesla-T4", replicas="1:8"))
    assert elastic.workers == 1 and elastic.step_s == t4.step_s  # the smallest group's step
    assert 10 < t4.save_s < 20  # ~1.5 GB of state at 100 MB/s


def test_no_named_or_no_known_gpu_no_estimate():
    assert step_time.estimate(_spec(None)) is None
    assert step_time.estimate(_spec("Some-New-Card")) is None
    assert step_time.grace_warning(_spec(None, grace=0), 10) is None


def test_a_grace_period_too_short_for_a_step_and_the_save_warns_naming_the_flag():
    assert step_time.grace_warning(_spec("Tesla-T4"), 10) is None  # 120 s leaves 110
    line = step_time.grace_warning(_spec("Tesla-T4", grace=30), 10)
    assert "\n" not in line and "--termination-grace-period 50 or more" in line
    assert "--global-batch-size" in line
    assert step_time.grace_warning(_spec("Tesla-T4", grace=50), 10) is None  # the fix works
    # more GPUs make the step short: the same grace period is enough
    assert step_time.grace_warning(_spec("NVIDIA-H100-80GB-HBM3", 8, 8, grace=30), 10) is None
    # a smaller step is the other fix
    assert step_time.grace_warning(_spec("Tesla-T4", grace=30, global_batch_size=64), 10) is None
