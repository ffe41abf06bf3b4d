"""What the driver decides before the workers start: GPU/image checks, precision, gradient
accumulation, steps per epoch (estimated, never counted), the warm-up, and Ray Train's
DataConfig. One call from the driver (`plan_run`); everything here but the GPU probe is pure
or cheap, so start-up does not grow with the corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from submitter.contract.errors import SpecError
from training.gpt2.config import TrainConfig
from training.gpt2.precision import choose_precision


#: The first plan's epoch length when the data's size is unknown, and its warm-up.
UNKNOWN_STEPS_PER_EPOCH = 1_000_000
UNKNOWN_WARMUP = 100


@dataclass(frozen=True)
class RunPlan:
    steps_per_epoch: int          # optimizer steps (the cap, or the estimate)
    estimated: bool               # True: from the data's size; the loop corrects it
    warmup_steps: int
    accumulation: int             # micro-batches per optimizer step per worker
    facts: dict[str, Any] = field(default_factory=dict)  # for run_started

    def loop_config(self) -> dict[str, Any]:
        """The keys the training loop reads."""
        return {"steps_per_epoch": self.steps_per_epoch, "warmup_steps": self.warmup_steps}


def precision_fact(requested: str, use_gpu: bool, probe: Optional[dict]) -> dict[str, Any]:
    """run_started's precision fields. CPU jobs and GPU jobs whose GPU node answered the probe
    get the precision the workers will use; otherwise the request (the workers resolve it)."""
    if not use_gpu:
        return choose_precision(requested, "cpu", False).describe()
    if probe is None:
        return {"precision": requested, "precision_requested": requested,
                "precision_reason": "resolved on the GPU workers"}
    out = choose_precision(requested, "cuda", probe["bf16"]).describe()
    return {**out, "gpu": probe.get("gpu")}


def compile_fact(mode: str, use_gpu: bool) -> str:
    """run_started's `compile`: on | off as the workers will resolve it (training.gpt2.compiling;
    a GPU older than sm70 turns auto off there, which the first progress event's `compile`
    says); the seconds it took ride on that event too (`compile_s`)."""
    from training.gpt2.compiling import compile_enabled

    return "on" if compile_enabled(mode, "cuda" if use_gpu else "cpu") else "off"


def too_short(blocks: Optional[int], global_batch: int, workers: int,
              block: int) -> Optional[str]:
    """The one-line problem when the training data (an estimate: `blocks` sequences of `block`
    tokens) holds less than one optimizer step (`global_batch` sequences over `workers`): zero
    steps would "succeed" with an untrained model. None when it is long enough, or its size is
    unknown."""
    if blocks is None or blocks >= global_batch:
        return None
    fits = blocks // workers * workers  # at least one sequence per worker
    fix = (f"lower --global-batch-size to {fits} or less" if fits else
           "lower --block-size, or use fewer workers")
    return (f"the training data has ~{blocks * block:,} tokens, less than one optimizer step "
            f"({global_batch * block:,} tokens: {global_batch} sequences x {block}); add data, or {fix}")


def no_validation(val_sequences: Optional[int], where: str) -> Optional[str]:
    """The run's line when it will validate nothing (`val_sequences` 0: none of the job's
    block; None: unknown, say nothing): said at the start, not found out from a `val_loss` of
    n/a at the end. Checkpoints are then kept by recency (training.run.checkpoint_events)."""
    if val_sequences is None or val_sequences > 0:
        return None
    return (f"validation: none ({where}): no val_loss is computed and checkpoints are kept by "
            f"recency")


def warmup_for(total: int, warmup_steps: Optional[int]) -> int:
    return warmup_steps if warmup_steps is not None else max(1, total // 20)


def plan_run(cfg: TrainConfig, corpus: Any, tok_spec: Any, block: int,
             notice: Callable[[str], None], sequences: Optional[int] = None) -> RunPlan:
    """Checks and decisions before `TorchTrainer.fit`; raises GpuImageError / SpecError (one
    line), the latter also for data shorter than one optimizer step. `sequences`: a prepared
    corpus's exact count of training sequences (then the steps per epoch are exact)."""
    from training.data.pipeline import estimate_blocks, steps_per_epoch_estimate
    from training.gpu_check import check_gpus_here, probe_gpu_node

    check_gpus_here(cfg.use_gpu, cfg.num_workers)
    probe = probe_gpu_node() if cfg.use_gpu else None
    # the step of the largest group as rank 0 makes it (on GPUs each worker sizes its own
    # micro-batch, training.gpt2.microbatch: the accumulation is render's estimate)
    step = cfg.job.batch_plan()
    accum = step.accumulation
    exact = sequences is not None
    blocks = sequences if exact else estimate_blocks(corpus, tok_spec, block, cfg.val_percent)
    short = too_short(blocks, step.global_batch, cfg.num_workers, block)
    if short:
        raise SpecError(short)
    estimate = steps_per_epoch_estimate(blocks, step.global_batch, 1)
    warmup = None
    if exact:
        spe = min(estimate, cfg.max_steps_per_epoch or estimate)
        estimated = False
        notice(f"steps per epoch: {spe} (exact: {blocks:,} sequences of {block} tokens in the "
               f"corpus's manifest, {step.global_batch} a step)")
    elif cfg.max_steps_per_epoch:
        spe, estimated = cfg.max_steps_per_epoch, False
        if blocks is not None:
            spe = min(spe, estimate)
            estimated = spe < cfg.max_steps_per_epoch
    elif blocks is None:
        # Nothing to estimate from (e.g. unreadable metadata): a long first plan keeps the LR
        # near its peak until the first epoch ends and says how long an epoch is.
        spe, estimated, warmup = UNKNOWN_STEPS_PER_EPOCH, True, UNKNOWN_WARMUP
        notice("steps per epoch: unknown until the first epoch ends (the LR stays near its "
               "peak until then)")
    else:
        spe, estimated = estimate, True
        notice(f"steps per epoch: ~{spe} (estimated from {corpus.text_bytes or 0:,} bytes of "
               "text; corrected after the first epoch)")
    total = spe * cfg.epochs
    facts = {**precision_fact(cfg.precision, cfg.use_gpu, probe),
             "compile": compile_fact(cfg.compile, cfg.use_gpu),
             "accumulation_steps": accum,
             "global_batch_size": step.global_batch,
             "steps_per_epoch_estimated": estimated}
    if spe == UNKNOWN_STEPS_PER_EPOCH and blocks is None:
        facts["steps_per_epoch"] = None  # unknown: no total, no ETA, until an epoch ends
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else warmup
    return RunPlan(spe, estimated, warmup if warmup is not None else warmup_for(total, None),
                   accum, facts)


def data_config() -> Any:
    """Ray Train's dataset sharding without locality hints: which blocks a rank gets then
    depends only on the data and the rank, not on where Ray ran the read tasks, so a resumed
    run on other nodes reads the same samples per rank (a sample-exact resume)."""
    import ray.train

    return ray.train.DataConfig(enable_shard_locality=False)
