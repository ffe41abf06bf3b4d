"""The batch rule (submitter.contract.batch) and the checkpoint interval: pure functions of the
settings, the same in `submitter render` and in the pod (issue #18 items 2 and 5)."""

from __future__ import annotations

import json

import pytest

from submitter.contract import batch
from submitter.contract.errors import SpecError
from submitter.contract.spec import JobSpec, global_batch_problem


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


def test_fp32_activations_take_twice_the_bytes_so_fewer_sequences_fit():
    for gib in (16, 40, 80, 141):
        half = batch.sequences_that_fit("gpt2-small", 256, gib * 2**30, "bf16")
        full = batch.sequences_that_fit("gpt2-small", 256, gib * 2**30, "fp32")
        assert full < half and full <= half * 0.65  # 4-byte activations, 8-byte logits
    assert batch.sequences_that_fit("gpt2-small", 256, 2**30, "fp32") == 1  # never 0
    spec = JobSpec.build(name="j", replicas=8, gpu_per_pod=1, gpu_type="NVIDIA-H100-80GB-HBM3")
    fp32 = JobSpec.build(name="j", replicas=8, gpu_per_pod=1, gpu_type="NVIDIA-H100-80GB-HBM3",
                         precision="fp32")
    assert fp32.micro_batch_size < spec.micro_batch_size
    assert fp32.resolved_global_batch_size == spec.resolved_global_batch_size  # the same step


@pytest.mark.parametrize("n, limit, expected", [
    (2048, 64, 64), (704, 256, 176), (683, 64, 1), (683, 683, 683), (12, 5, 4), (1, 8, 1)])
def test_a_micro_batch_is_the_largest_divisor_of_the_share_that_fits(n, limit, expected):
    assert batch.largest_divisor_at_most(n, limit) == expected


# --- the grid: every group a user can ask for ------------------------------------------------------

GPU_TYPES = (None, "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-A100-SXM4-40GB", "NVIDIA-L40S",
             "NVIDIA-L4", "NVIDIA-A10G", "Tesla-T4", "Tesla-V100-SXM2-32GB", "something-else")


def _shares_ok(global_batch: int, n: int) -> bool:
    """A group of n splits the step into balanced shares of at least one sequence each."""
    s = batch.shares(global_batch, n)
    if sum(s) != global_batch or min(s) < 1 or s != sorted(s, reverse=True):
        return False
    if global_batch >= batch.SPLIT_UNITS * n:  # near-equal: at most 1/8 apart
        return (s[0] - s[-1]) * batch.SPLIT_UNITS <= s[0]
    return s[0] - s[-1] <= 1


@pytest.mark.parametrize("model", ["gpt2-small", "tiny"])
def test_every_group_1_to_64_pods_of_1_to_8_gpus_gets_a_fixed_step_of_a_quarter_to_2_m_tokens(model):
    """The whole grid (2,080 ranges x 8 GPU counts x every GPU type), not samples: the default
    step is 0.25-2 M tokens or refused naming a --global-batch-size that is accepted, every
    size of the range splits it, and --gpu-type changes nothing but the micro-batch estimate."""
    block = batch.MODEL_BLOCK[model]
    steps, refused, checked = [], [], {}
    for gpus in range(1, 9):
        for lo in range(1, 65):
            for hi in range(lo, 65):
                first, last = lo * gpus, hi * gpus
                common = dict(gpu=True, model=model, block=block, micro=None, global_batch=None,
                              min_workers=first, max_workers=last, step=gpus)
                resolved = [batch.resolve(**common, gpu_type=t) for t in GPU_TYPES]
                g = resolved[0].global_batch
                assert {r.global_batch for r in resolved} == {g}, (lo, hi, gpus)
                problem = batch.default_problem(block, g, first, last, None, False, gpus)
                if problem is not None:
                    refused.append(problem)
                    continue
                steps.append(g * block)
                for n in range(first, last + 1, gpus):
                    if (g, n) not in checked:
                        checked[g, n] = _shares_ok(g, n)
                    assert checked[g, n], (g, n)
                share = batch.shares(g, last)[0]
                for fits in {r.fits for r in resolved}:  # the estimate divides rank 0's share
                    if (share, fits) not in checked:
                        micro = batch.largest_divisor_at_most(share, fits)
                        checked[share, fits] = share % micro == 0 and micro <= fits
                    assert checked[share, fits], (share, fits)
    assert len(steps) + len(refused) == 8 * 64 * 65 // 2
    assert not refused  # no default had to be refused at the presets' blocks
    assert batch.MIN_TOKENS_PER_STEP <= min(steps) and max(steps) <= batch.MAX_TOKENS_PER_STEP
    print(f"{model}: default steps {min(steps):,} to {max(steps):,} tokens")


def test_fsdp_needs_equal_shares_and_refuses_in_one_line_naming_a_batch_that_works():
    spec = JobSpec.build(name="j", replicas="1:8", gpu_per_pod=1, fsdp=True, cpu_per_pod="4",
                         memory_per_pod="64Gi")
    g = spec.resolved_global_batch_size
    assert all(g % n == 0 for n in range(1, 9)) and 0.25e6 <= g * spec.block <= 2e6
    with pytest.raises(SpecError) as info:
        JobSpec.build(name="j", replicas="1:64", gpu_per_pod=1, fsdp=True, memory_per_pod="64Gi")
    line = str(info.value)
    assert "\n" not in line and info.value.exit_code == 2
    works = int(line.split("--global-batch-size ")[1].split()[0])
    assert global_batch_problem(works, 1, 64, 1, None, True) is None


def test_a_default_outside_the_range_is_refused_naming_a_global_batch_that_works():
    # 8 workers at block 262,144 cannot take less than 8 sequences = 2 M tokens a step
    with pytest.raises(SpecError) as info:
        JobSpec.build(name="j", replicas=16, gpu_per_pod=1, block_size=262_144)
    assert "--global-batch-size 16" in str(info.value) and "\n" not in str(info.value)
    assert JobSpec.build(name="j", replicas=16, gpu_per_pod=1, block_size=262_144,
                         global_batch_size=16).resolved_global_batch_size == 16


@pytest.mark.parametrize("replicas, gpus, gpu_type, expected", [
    (8, 1, None, (64, 4, 2048)), (1, 1, None, (64, 32, 2048)),
    (8, 1, "NVIDIA-H100-80GB-HBM3", (256, 1, 2048)), (2, 4, None, (64, 4, 2048)),
    (3, 1, None, (64, 11, 2112)),  # a fixed group of 3: equal shares of 704
    ("1:8", 1, None, (64, 32, 2048)), ("1:8", 1, "NVIDIA-H100-80GB-HBM3", (256, 8, 2048)),
    (8, 8, "NVIDIA-H100-80GB-HBM3", (32, 1, 2048))])
def test_gpu_jobs_default_to_half_a_million_tokens_by_accumulation(replicas, gpus, gpu_type, expected):
    spec = JobSpec.build(name="j", replicas=replicas, gpu_per_pod=gpus, gpu_type=gpu_type,
                         cpu_per_pod=str(2 * gpus + 2), memory_per_pod="64Gi")
    plan = spec.batch_plan(spec.min_train_workers)
    assert (plan.micro_batch, plan.accumulation, plan.global_batch) == expected
    assert plan.global_batch == plan.micro_batch * plan.accumulation * spec.min_train_workers
    assert abs(plan.tokens_per_step - batch.TARGET_TOKENS_PER_STEP) <= 0.05 * 524_288


def test_gpu_type_only_schedules_it_never_changes_the_step():
    """Issue 23: `--replicas 1:8 --gpu-per-pod 1` was 13.8 M tokens a step, 55 M with an 80 GB
    --gpu-type; `--replicas 8 --gpu-per-pod 8` with one, 4.2 M."""
    for replicas, gpus in (("1:8", 1), ("8", 8), ("2:16", 4)):
        docs = {t: JobSpec.build(name="j", replicas=replicas, gpu_per_pod=gpus, gpu_type=t,
                                 cpu_per_pod=str(2 * gpus + 2), memory_per_pod="64Gi")
                for t in GPU_TYPES[:4]}
        assert {s.resolved()["batch"]["fixed"]["tokensPerStep"] for s in docs.values()} == {524_288}
        if replicas == "1:8":  # only the estimate of the micro-batch moves
            assert len({s.micro_batch_size for s in docs.values()}) > 1


def test_cpu_jobs_keep_the_small_defaults():
    spec = JobSpec.build(name="j", replicas=3)
    assert (spec.micro_batch_size, spec.resolved_global_batch_size) == (8, None)
    assert spec.batch_plan().to_dict() == {"microBatchSize": 8, "accumulationSteps": 1,
                                           "globalBatchSize": 24, "tokensPerStep": 24 * 256}


def test_explicit_settings_win():
    spec = JobSpec.build(name="j", replicas=8, gpu_per_pod=1, batch_size_per_worker=16)
    assert (spec.micro_batch_size, spec.batch_plan().accumulation) == (16, 16)
    spec = JobSpec.build(name="j", replicas=8, gpu_per_pod=1, global_batch_size=96)
    assert (spec.micro_batch_size, spec.batch_plan().accumulation) == (12, 1)
    spec = JobSpec.build(name="j", replicas=8, gpu_per_pod=1, global_batch_size=1024)
    assert (spec.micro_batch_size, spec.batch_plan().accumulation) == (64, 2)
    with pytest.raises(SpecError, match="--global-batch-size 12 is not a multiple of 8 worker"):
        JobSpec.build(name="j", replicas=8, gpu_per_pod=1, global_batch_size=12)


def test_an_elastic_gpu_job_keeps_one_global_batch_that_every_group_size_splits():
    spec = JobSpec.build(name="j", replicas="2:4", gpu_per_pod=1)
    g = spec.resolved_global_batch_size
    assert g == 2048
    for n in (2, 3, 4):
        plan = spec.batch_plan(n)
        assert plan.global_batch == g and sum(batch.shares(g, n)) == g
    assert batch.shares(g, 3) == [704, 704, 640]  # 11, 11 and 10 micro-batches of 64
    # an explicit one only needs a sequence per worker of the largest group
    assert JobSpec.build(name="j", replicas="2:4", gpu_per_pod=1,
                         global_batch_size=100).resolved_global_batch_size == 100
    with pytest.raises(SpecError, match="leaves some of 4 workers without a sequence: use 4"):
        JobSpec.build(name="j", replicas="2:4", gpu_per_pod=1, global_batch_size=3)


@pytest.mark.parametrize("g, n", [(2048, 3), (2112, 5), (100, 7), (32, 3), (2048, 488)])
def test_loss_weights_make_the_all_reduced_gradient_a_token_mean(g, n):
    """DDP averages over n workers: sum_r (accumulation_r x weight_r) / n must be 1, and each
    worker's part of the step its share."""
    parts = []
    for share in batch.shares(g, n):
        micro = batch.largest_divisor_at_most(share, 64)
        parts.append(share // micro * batch.loss_weight(share, micro, n, g) / n)
    assert abs(sum(parts) - 1) < 1e-9
    assert [round(p * g) for p in parts] == batch.shares(g, n)


def test_the_job_document_says_what_is_fixed_and_what_the_device_chooses():
    spec = JobSpec.build(name="j", replicas=8, gpu_per_pod=1)
    doc = json.loads(spec.document())
    assert doc["resolved"] == {
        "batch": {"fixed": {"globalBatchSize": 2048, "tokensPerStep": 524_288},
                  "chosenOnDevice": {"microBatchSize": 64, "accumulationSteps": 4,
                                     "estimateForGpuGiB": 16.0}},
        "checkpointIntervalMinutes": 30.0, "dataCpusPerPod": 1,
        "dataPath": {"kind": "on-the-fly", "why": spec.data_path.why}}
    assert doc["batchSizePerWorker"] is None and doc["globalBatchSize"] is None  # settings
    assert JobSpec.from_document(spec.document()) == spec
    fixed = json.loads(JobSpec.build(name="j", replicas=8, gpu_per_pod=1,
                                     batch_size_per_worker=32).document())["resolved"]["batch"]
    assert fixed == {"fixed": {"globalBatchSize": 2048, "tokensPerStep": 524_288,
                               "microBatchSize": 32, "accumulationSteps": 8}}


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
