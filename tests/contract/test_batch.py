"""The batch rule (submitter.contract.batch) and the checkpoint interval: pure functions of the
settings, the same in `submitter render` and in the pod (issue #18 items 2 and 5)."""

from __future__ import annotations

import json

import pytest

from submitter.contract import batch
from submitter.contract.errors import SpecError
from submitter.contract.spec import JobSpec


@pytest.mark.parametrize("gpu_type, gib", [
    (None, 16.0), ("NVIDIA-H100-80GB-HBM3", 80.0), ("NVIDIA-A100-SXM4-40GB", 40.0),
    ("NVIDIA-A100-SXM4-80GB", 80.0), ("Tesla-T4", 16.0), ("Tesla-V100-SXM2-32GB", 32.0),
    ("NVIDIA-L4", 24.0), ("NVIDIA-L40S", 48.0), ("NVIDIA-A10G", 24.0), ("NVIDIA-H200", 141.0),
    ("nvidia-tesla-t4", 16.0), ("something-else", 16.0), ("NVIDIA-H100-PCIe", 80.0)])
def test_gpu_memory_from_the_gpu_type_else_the_smallest_card(gpu_type, gib):
    assert batch.gpu_memory_gib(gpu_type) == gib


def test_the_largest_micro_batch_that_fits_grows_with_memory_and_shrinks_with_the_block():
    fits = {gib: batch.micro_batch_that_fits("gpt2-small", 256, gib) for gib in (16, 24, 40, 80)}
    assert fits == {16: 64, 24: 64, 40: 128, 80: 256}  # 80 GB: 65,536 tokens, llm.c's B=64 x 1024
    assert batch.micro_batch_that_fits("gpt2-small", 1024, 80) == 64
    assert batch.micro_batch_that_fits("gpt2-small", 256, 4) == 1  # never 0
    for gib, micro in fits.items():  # the rule's own budget holds
        n_layer, n_embd, vocab = batch.MODEL_SHAPES["gpt2-small"]
        used = (micro * 256 * batch.activation_bytes_per_token(n_layer, n_embd, vocab)
                + batch.param_count(n_layer, n_embd, vocab, 256) * batch.STATE_BYTES_PER_PARAM)
        assert used <= batch.USABLE_SHARE * gib * 2**30 - batch.WORKSPACE_GIB * 2**30


@pytest.mark.parametrize("replicas, gpus, gpu_type, expected", [
    (8, 1, None, (64, 4, 2048)), (1, 1, None, (64, 32, 2048)),
    (8, 1, "NVIDIA-H100-80GB-HBM3", (256, 1, 2048)), (2, 4, None, (64, 4, 2048)),
    (3, 1, None, (64, 11, 2112))])  # 3 x 64 does not divide 2048: the nearest multiple
def test_gpu_jobs_default_to_half_a_million_tokens_by_accumulation(replicas, gpus, gpu_type, expected):
    spec = JobSpec.build(name="j", replicas=replicas, gpu_per_pod=gpus, gpu_type=gpu_type,
                         cpu_per_pod=str(2 * gpus + 2), memory_per_pod="64Gi")
    plan = spec.batch_plan()
    assert (plan.micro_batch, plan.accumulation, plan.global_batch) == expected
    assert plan.global_batch == plan.micro_batch * plan.accumulation * spec.num_train_workers
    assert abs(plan.tokens_per_step - batch.TARGET_TOKENS_PER_STEP) <= plan.micro_batch * \
        spec.num_train_workers * spec.block / 2


def test_cpu_jobs_keep_the_small_defaults():
    spec = JobSpec.build(name="j", replicas=3)
    assert (spec.micro_batch_size, spec.resolved_global_batch_size) == (8, None)
    assert spec.batch_plan().to_dict() == {"microBatchSize": 8, "accumulationSteps": 1,
                                           "globalBatchSize": 24, "tokensPerStep": 24 * 256}


def test_explicit_settings_win_and_an_explicit_global_batch_picks_a_micro_batch_that_divides_it():
    spec = JobSpec.build(name="j", replicas=8, gpu_per_pod=1, batch_size_per_worker=16)
    assert (spec.micro_batch_size, spec.batch_plan().accumulation) == (16, 16)
    spec = JobSpec.build(name="j", replicas=8, gpu_per_pod=1, global_batch_size=96)
    assert (spec.micro_batch_size, spec.batch_plan().accumulation) == (12, 1)
    spec = JobSpec.build(name="j", replicas=8, gpu_per_pod=1, global_batch_size=1024)
    assert (spec.micro_batch_size, spec.batch_plan().accumulation) == (64, 2)
    with pytest.raises(SpecError, match="--global-batch-size 12 is not a multiple of 8"):
        JobSpec.build(name="j", replicas=8, gpu_per_pod=1, global_batch_size=12)


def test_an_elastic_gpu_job_gets_a_global_batch_every_group_size_reaches():
    spec = JobSpec.build(name="j", replicas="2:4", gpu_per_pod=1)
    g, micro = spec.resolved_global_batch_size, spec.micro_batch_size
    assert all(g % (n * micro) == 0 for n in (2, 3, 4))
    assert spec.batch_plan(2).global_batch == spec.batch_plan(4).global_batch == g


def test_the_job_document_shows_what_the_defaults_resolve_to_and_the_pod_reads_the_settings():
    spec = JobSpec.build(name="j", replicas=8, gpu_per_pod=1)
    doc = json.loads(spec.document())
    assert doc["resolved"] == {"microBatchSize": 64, "accumulationSteps": 4,
                               "globalBatchSize": 2048, "tokensPerStep": 524_288,
                               "checkpointIntervalMinutes": 30.0, "dataCpusPerPod": 1}
    assert doc["batchSizePerWorker"] is None and doc["globalBatchSize"] is None  # settings
    assert JobSpec.from_document(spec.document()) == spec


@pytest.mark.parametrize("gpus, setting, minutes", [
    (0, None, 0.0), (1, None, 30.0), (1, 0, 0.0), (0, 5, 5.0), (1, 0.5, 0.5)])
def test_checkpoint_interval_defaults_to_30_minutes_on_gpus(gpus, setting, minutes):
    spec = JobSpec.build(name="j", gpu_per_pod=gpus, checkpoint_interval=setting)
    assert spec.checkpoint_minutes == minutes


@pytest.mark.parametrize("value", [-1, 10_081, "soon", float("nan"), float("inf")])
def test_a_bad_checkpoint_interval_is_refused_in_one_line(value):
    with pytest.raises(SpecError) as info:
        JobSpec.build(name="j", checkpoint_interval=value)
    assert "\n" not in str(info.value) and "checkpoint" in str(info.value).replace("_", "-")
    assert info.value.exit_code == 2
