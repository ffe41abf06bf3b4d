"""The training loop each Ray Train worker runs: read it top to bottom.

resume (epoch AND step) -> per epoch: steps over this worker's data shard (skipping the batches
a mid-epoch checkpoint already covered) -> validation -> checkpoint (model, optimizer,
scheduler, epoch, step, config) with `ray.train.report`. Rank 0 sends the status events to the
run's emitter actor (see training.emitter). No code path exists only for tests.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from typing import Any, Optional

from training.config import TrainConfig
from training.object_store import as_uri

STATE_FILE = "state.pt"


def checkpoint_name(epoch: int, step: int) -> str:
    """Checkpoint directory name: sortable and meaningful (epoch is 1-based)."""
    return f"checkpoint_epoch{epoch:03d}_step{step:07d}"


def resume_point(state: Optional[dict[str, Any]]) -> tuple[int, int, int]:
    """(epoch to start, batches of it already done, global step) from a checkpoint's state."""
    if state is None:
        return 0, 0, 0
    if state["epoch_done"]:
        return state["epoch"] + 1, 0, state["step"]
    return state["epoch"], state["step_in_epoch"], state["step"]


class _Events:
    """Rank 0's line to the emitter actor (fire and forget; other ranks stay silent)."""

    def __init__(self, hub: Any, rank: int) -> None:
        self.hub = hub if rank == 0 else None

    def emit(self, etype: str, **fields: Any) -> None:
        if self.hub is not None:
            self.last = self.hub.emit.remote(etype, **fields)

    def flush(self) -> None:
        """Wait until the emitter has our last event (before the driver says run_finished)."""
        import ray

        if self.hub is not None and getattr(self, "last", None) is not None:
            ray.get(self.last)

    def started(self, resumed_from: Optional[str], epoch: int, step: int) -> None:
        if self.hub is not None:
            import ray

            ray.get(self.hub.worker_group_started.remote(resumed_from, epoch, step))


def _all_mean(values: list[float], device: Any) -> list[float]:
    """Average floats across workers (identity when training in one process)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t / dist.get_world_size()).tolist()


def train_func(loop_config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch
    import torch
    from ray.train import Checkpoint
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                         set_state_dict)

    from training.model import (BETAS, MIN_LR_RATIO, build_model, build_optimizer, build_scheduler,
                                gpt2_config)

    cfg = TrainConfig.from_dict(loop_config["config"])
    total_steps, warmup = loop_config["total_steps"], loop_config["warmup_steps"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    events = _Events(loop_config.get("hub"), rank)
    device = ray.train.torch.get_device()
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
                else contextlib.nullcontext())

    # --- model, optimizer, schedule; then the checkpoint on top ----------------------------
    torch.manual_seed(cfg.seed)
    model_config = gpt2_config(cfg.model, loop_config["vocab_size"], loop_config["eot_id"],
                               cfg.block_size)
    block = model_config.n_positions
    model = build_model(model_config)
    if world > 1 or cfg.use_gpu:
        model = ray.train.torch.prepare_model(
            model, parallel_strategy="fsdp" if cfg.fsdp else "ddp")
    else:
        model = model.to(device)
    optimizer = build_optimizer(model, cfg.learning_rate, cfg.weight_decay, BETAS)
    scheduler = build_scheduler(optimizer, warmup, total_steps, MIN_LR_RATIO)

    state, resumed_from = None, None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, STATE_FILE), map_location="cpu", weights_only=False)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"],
                       options=StateDictOptions(full_state_dict=True))
        scheduler.load_state_dict(state["scheduler"])
        resumed_from = as_uri(cfg.storage_path, checkpoint.path)
    start_epoch, skip, step = resume_point(state)
    events.started(resumed_from, epoch=start_epoch + 1, step=step)

    def save(metrics: dict[str, Any], epoch: int, step_in_epoch: int, epoch_done: bool) -> None:
        """All ranks: gather the full state (a collective under FSDP); rank 0 writes it."""
        model_sd, optim_sd = get_state_dict(
            model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        name = checkpoint_name(epoch + 1, step)
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if rank == 0:
                torch.save({"model": model_sd, "optimizer": optim_sd,
                            "scheduler": scheduler.state_dict(), "epoch": epoch,
                            "step": step, "step_in_epoch": step_in_epoch,
                            "epoch_done": epoch_done, "config": cfg.to_dict(),
                            "model_config": model_config.to_dict()},
                           os.path.join(tmp, STATE_FILE))
                ckpt = Checkpoint.from_directory(tmp)
            ray.train.report(metrics, checkpoint=ckpt, checkpoint_dir_name=name)
        events.emit("checkpoint_saved", epoch=epoch + 1, step=step,
                    path=os.path.join(cfg.storage_path, cfg.run_name, name),
                    val_loss=metrics.get("val_loss"))

    def evaluate() -> Optional[float]:
        """Mean loss over (up to val_steps) validation batches of every worker."""
        shard = ray.train.get_dataset_shard("val")
        net = getattr(model, "module", model) if not cfg.fsdp else model
        net.eval()
        total, count = 0.0, 0
        with torch.no_grad(), autocast:
            for i, batch in enumerate(shard.iter_torch_batches(
                    batch_size=cfg.batch_size_per_worker, drop_last=True, dtypes=torch.long,
                    device=device)):
                if cfg.val_steps and i >= cfg.val_steps:
                    break
                x = batch["input_ids"]
                total += net(input_ids=x, labels=x).loss.item()
                count += 1
        net.train()
        total, count = _all_mean([total, float(count)], device)
        return total / count if count else None

    # --- the loop ------------------------------------------------------------------------
    tokens_per_step = cfg.batch_size_per_worker * block * world
    model.train()
    train_shard = ray.train.get_dataset_shard("train")
    first_step = True  # report the first step of every start (time to first/resumed step)
    for epoch in range(start_epoch, cfg.epochs):
        done_in_epoch = skip if epoch == start_epoch else 0
        epoch_loss, epoch_steps, epoch_time = 0.0, 0, 0.0
        window_loss, window_steps, window_start = 0.0, 0, time.perf_counter()
        batches = train_shard.iter_torch_batches(
            batch_size=cfg.batch_size_per_worker, drop_last=True, dtypes=torch.long,
            device=device)
        for i, batch in enumerate(batches):
            if i < done_in_epoch:
                continue  # covered by the mid-epoch checkpoint we resumed from
            if cfg.max_steps_per_epoch and done_in_epoch >= cfg.max_steps_per_epoch:
                break
            t0 = time.perf_counter()
            x = batch["input_ids"]
            with autocast:
                loss = model(input_ids=x, labels=x).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip and hasattr(model, "clip_grad_norm_"):
                model.clip_grad_norm_(cfg.grad_clip)  # FSDP: the norm across all shards
            elif cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            scheduler.step()
            loss_value = loss.item()
            epoch_time += time.perf_counter() - t0
            step += 1
            done_in_epoch += 1
            epoch_loss, epoch_steps = epoch_loss + loss_value, epoch_steps + 1
            window_loss, window_steps = window_loss + loss_value, window_steps + 1

            if step % cfg.progress_every == 0 or first_step:
                first_step = False
                (mean_loss,) = _all_mean([window_loss / window_steps], device)
                elapsed = time.perf_counter() - window_start
                events.emit("progress", epoch=epoch + 1, step=step, loss=round(mean_loss, 5),
                            tokens_per_sec=round(tokens_per_step * window_steps / elapsed, 1),
                            lr=scheduler.get_last_lr()[0])
                window_loss, window_steps, window_start = 0.0, 0, time.perf_counter()
            last_of_epoch = bool(cfg.max_steps_per_epoch) and done_in_epoch >= cfg.max_steps_per_epoch
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and not last_of_epoch:
                val_loss = evaluate()
                save({"epoch": epoch + 1, "step": step, "val_loss": val_loss,
                      "train_loss": epoch_loss / epoch_steps}, epoch, done_in_epoch, False)

        # --- end of epoch: validate, report, checkpoint --------------------------------------
        val_loss = evaluate()
        train_loss, tok_s = _all_mean(
            [epoch_loss / max(1, epoch_steps),
             tokens_per_step * epoch_steps / epoch_time if epoch_time else 0.0], device)
        metrics = {"epoch": epoch + 1, "step": step, "train_loss": train_loss,
                   "val_loss": val_loss, "tokens_per_sec": tok_s,
                   "lr": scheduler.get_last_lr()[0]}
        events.emit("epoch_finished", epoch=epoch + 1, epochs=cfg.epochs, step=step,
                    train_loss=round(train_loss, 5),
                    val_loss=None if val_loss is None else round(val_loss, 5),
                    tokens_per_sec=round(tok_s, 1), steps=epoch_steps)
        save(metrics, epoch, done_in_epoch, True)
    events.flush()
