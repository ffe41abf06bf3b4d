"""The precision table (`--precision`) and the learning-rate plan across re-plans."""

from __future__ import annotations

import pytest

from training.gpt2.model import lr_factor
from training.gpt2.precision import PrecisionError, choose_precision
from training.gpt2.schedule import LRPlan, first_plan, resumed_plan


@pytest.mark.parametrize("requested, device, bf16, expected", [
    ("auto", "cpu", False, "fp32"),
    ("auto", "cuda", True, "bf16"),
    ("auto", "cuda", False, "fp16"),
    ("bf16", "cuda", True, "bf16"),
    ("bf16", "cpu", False, "bf16"),
    ("fp16", "cuda", True, "fp16"),
    ("fp16", "cuda", False, "fp16"),
    ("fp32", "cuda", True, "fp32"),
    ("fp32", "cpu", False, "fp32"),
])
def test_precision_table(requested, device, bf16, expected):
    p = choose_precision(requested, device, bf16)
    assert p.name == expected and p.requested == requested
    assert p.needs_scaler == (expected == "fp16")
    assert p.describe()["precision"] == expected


@pytest.mark.parametrize("requested, device, bf16, word", [
    ("bf16", "cuda", False, "fp16"), ("fp16", "cpu", False, "CUDA"), ("fp8", "cuda", True, "auto")])
def test_impossible_precisions_are_refused_with_the_fix(requested, device, bf16, word):
    with pytest.raises(PrecisionError, match=word) as e:
        choose_precision(requested, device, bf16)
    assert "\n" not in str(e.value)


def test_the_first_plan_is_warmup_then_cosine():
    plan = first_plan(100, 10, 0.1)
    assert [plan.factor(s) for s in range(120)] == pytest.approx(
        [lr_factor(s, 10, 100, 0.1) for s in range(120)])


def test_an_extended_run_continues_without_a_jump():
    """3 epochs of 100 steps, then extended to 5: the LR never rises after the warm-up, the
    first 300 steps are unchanged, and the step after the extension is the next cosine value."""
    plan = first_plan(300, 15, 0.1)
    before = [plan.factor(s) for s in range(300)]
    extended = LRPlan.from_dict(plan.to_dict()).replan(250, 500)  # extended mid-run at step 250
    seq = [plan.factor(s) for s in range(250)] + [extended.factor(s) for s in range(250, 500)]
    assert seq[:250] == before[:250]
    assert extended.factor(250) == pytest.approx(plan.factor(250))
    steps = [b - a for a, b in zip(seq[15:], seq[16:])]
    assert all(d <= 1e-12 for d in steps)                      # monotone after warm-up
    assert max(abs(d) for d in steps) < 0.02                   # smooth: no jump anywhere
    assert seq[-1] == pytest.approx(0.1, abs=1e-3) and extended.factor(600) == 0.1


def test_extending_a_finished_run_stays_at_the_floor():
    plan = first_plan(300, 15, 0.1)
    more = resumed_plan(plan.to_dict(), 300, 500, 15, 0.1)
    assert all(more.factor(s) == pytest.approx(0.1) for s in range(300, 520))


def test_a_replan_inside_the_warmup_keeps_warming_up():
    plan = first_plan(100, 10, 0.1).replan(5, 1000)
    assert [plan.factor(s) for s in range(10)] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert plan.total == 1000 and plan.factor(10) == pytest.approx(1.0)


def test_the_same_total_keeps_the_plan_and_a_new_run_gets_a_first_plan():
    plan = first_plan(100, None, 0.1)
    assert plan.warmup == 5
    assert resumed_plan(plan.to_dict(), 40, 100, None, 0.1) == plan
    assert resumed_plan(None, 0, 100, None, 0.1) == plan
    assert resumed_plan({"last_epoch": 3}, 3, 100, None, 0.1) == plan  # an old LambdaLR state


def test_gradient_accumulation_reaches_the_global_batch_or_says_what_would():
    from submitter.contract.errors import SpecError
    from submitter.contract.spec import JobSpec

    with pytest.raises(SpecError, match="use 64 or 96") as e:
        JobSpec.build(name="j", replicas=4, batch_size_per_worker=8, global_batch_size=80)
    assert "\n" not in str(e.value)
    with pytest.raises(SpecError, match="use 32"):
        JobSpec.build(name="j", replicas=2, batch_size_per_worker=16, global_batch_size=20)
    assert JobSpec.build(name="j", replicas=2, global_batch_size=64).global_batch_size == 64


def test_fp16_needs_gpus_at_render_time():
    from submitter.contract.errors import SpecError
    from submitter.contract.spec import JobSpec

    with pytest.raises(SpecError, match="gpu-per-pod"):
        JobSpec.build(name="j", precision="fp16")
    assert JobSpec.build(name="j", precision="fp16", gpu_per_pod=1).precision == "fp16"


def test_run_started_precision_on_cpu_gpu_and_unknown_gpu():
    from training.run_plan import precision_fact

    assert precision_fact("auto", False, None)["precision"] == "fp32"
    assert precision_fact("auto", True, {"bf16": False, "gpu": "T4"}) == {
        "precision": "fp16", "precision_requested": "auto",
        "precision_reason": "this GPU has no bf16: fp16 with loss scaling", "gpu": "T4"}
    assert precision_fact("auto", True, None)["precision"] == "auto"


def test_gpu_jobs_on_the_wrong_image_fail_with_the_fix():
    from training.gpu_check import GpuFacts, gpu_problem

    good = GpuFacts(cuda_built=True, nccl_available=True, cluster_gpus=8)
    assert gpu_problem(False, 8, GpuFacts(False, False, 0)) is None  # CPU jobs: nothing to check
    assert gpu_problem(True, 8, good) is None
    no_cuda = gpu_problem(True, 8, GpuFacts(False, False, 8))
    assert "no CUDA" in no_cuda and "-gpu image" in no_cuda and "\n" not in no_cuda
    assert "NCCL" in gpu_problem(True, 8, GpuFacts(True, False, 8))
    short = gpu_problem(True, 8, GpuFacts(True, True, 4))
    assert "8 GPU worker(s)" in short and "4 GPU(s)" in short
    assert gpu_problem(True, 8, GpuFacts(True, True, 0), autoscaling=True) is None


def test_each_epoch_and_rank_gets_its_own_stable_shuffle_seed():
    from training.gpt2.loop import shuffle_seed

    seeds = {shuffle_seed(1337, e, r) for e in range(5) for r in range(4)}
    assert len(seeds) == 20
    assert shuffle_seed(1337, 2, 1) == shuffle_seed(1337, 2, 1) != shuffle_seed(1338, 2, 1)


def test_the_run_plan_estimates_steps_caps_them_and_says_so():
    from submitter.contract.spec import JobSpec
    from training.gpt2.config import TrainConfig
    from training.data.pipeline import Corpus
    from training.run_plan import plan_run
    from training.data.tokens import TokenizerSpec

    def plan(corpus, **settings):
        cfg = TrainConfig.from_spec(JobSpec.build(name="p", model="tiny", **settings), "/x")
        return plan_run(cfg, corpus, TokenizerSpec("byte"), 64, lambda line: None)

    big = Corpus(None, None, "x", text_bytes=64 * 16 * 1000)  # 1000 steps of 2 x 8 blocks
    p = plan(big, val_percent=0.0)
    assert (p.steps_per_epoch, p.estimated, p.accumulation) == (1000, True, 1)
    assert p.warmup_steps == 2 * 1000 // 20 and p.facts["precision"] == "fp32"
    assert plan(big, val_percent=0.0, global_batch_size=64).steps_per_epoch == 250
    capped = plan(big, val_percent=0.0, max_steps_per_epoch=30)
    assert (capped.steps_per_epoch, capped.estimated) == (30, False)
    short = plan(Corpus(None, None, "x", text_bytes=64 * 16 * 10), val_percent=0.0,
                 max_steps_per_epoch=30)
    assert (short.steps_per_epoch, short.estimated) == (10, True)
    unknown = plan(Corpus(None, None, "x"), max_steps_per_epoch=30)
    assert unknown.steps_per_epoch == 30 and unknown.loop_config() == {
        "steps_per_epoch": 30, "warmup_steps": unknown.warmup_steps}


def test_an_unknown_data_size_plans_a_long_first_epoch():
    from submitter.contract.spec import JobSpec
    from training.gpt2.config import TrainConfig
    from training.data.pipeline import Corpus
    from training.run_plan import UNKNOWN_STEPS_PER_EPOCH, UNKNOWN_WARMUP, plan_run
    from training.data.tokens import TokenizerSpec

    cfg = TrainConfig.from_spec(JobSpec.build(name="p", model="tiny"), "/x")
    p = plan_run(cfg, Corpus(None, None, "x"), TokenizerSpec("byte"), 64, lambda line: None)
    assert (p.steps_per_epoch, p.warmup_steps) == (UNKNOWN_STEPS_PER_EPOCH, UNKNOWN_WARMUP)
    assert p.facts["steps_per_epoch"] is None  # run_started: no made-up total for the ETA
    plan = first_plan(p.steps_per_epoch * 2, p.warmup_steps, 0.1)
    assert plan.factor(5000) > 0.99  # near the peak until the first epoch says how long it is


def test_the_gpu_check_waits_for_gpus_but_not_for_a_wrong_image(monkeypatch):
    from training import gpu_check
    from training.gpu_check import GpuFacts, GpuImageError, check_gpus_here

    seen = iter([GpuFacts(True, True, 0), GpuFacts(True, True, 2), GpuFacts(True, True, 4)])
    monkeypatch.setattr(gpu_check, "gather_facts", lambda: next(seen))
    monkeypatch.setattr("time.sleep", lambda s: None)
    check_gpus_here(True, 4, wait_s=60)  # the GPU nodes joined: fine
    monkeypatch.setattr(gpu_check, "gather_facts", lambda: GpuFacts(False, False, 8))
    with pytest.raises(GpuImageError, match="no CUDA"):
        check_gpus_here(True, 4, wait_s=3600)  # at once: waiting cannot fix an image
    monkeypatch.setattr(gpu_check, "gather_facts", lambda: GpuFacts(True, True, 1))
    with pytest.raises(GpuImageError, match="4 GPU worker"):
        check_gpus_here(True, 4, wait_s=0)
    check_gpus_here(False, 4)  # CPU jobs never look


def test_data_shorter_than_one_step_fails_before_training_naming_both_sizes():
    """Issue 23: zero steps used to "succeed" (train_loss 0.0, an untrained model exported)."""
    from submitter.contract.errors import SpecError
    from submitter.contract.spec import JobSpec
    from training.gpt2.config import TrainConfig
    from training.data.pipeline import Corpus
    from training.run_plan import plan_run
    from training.data.tokens import TokenizerSpec

    cfg = TrainConfig.from_spec(JobSpec.build(name="p", model="tiny", replicas=2,
                                              batch_size_per_worker=2, global_batch_size=128,
                                              val_percent=0.0), "/x")
    tiny = Corpus(None, None, "x", text_bytes=64 * 100)  # 100 sequences, a step is 128
    with pytest.raises(SpecError) as e:
        plan_run(cfg, tiny, TokenizerSpec("byte"), 64, lambda line: None)
    message = str(e.value)
    assert "~6,400 tokens" in message and "(8,192 tokens" in message
    assert "--global-batch-size to 100 or less" in message and "\n" not in message
    enough = Corpus(None, None, "x", text_bytes=64 * 128)
    assert plan_run(cfg, enough, TokenizerSpec("byte"), 64, lambda line: None).steps_per_epoch == 1
