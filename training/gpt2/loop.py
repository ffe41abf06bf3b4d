"""The training loop each Ray Train worker runs: read it top to bottom.

resume (epoch AND step) -> per epoch: steps over this worker's data shard (skipping the batches
a mid-epoch checkpoint already covered) -> validation -> checkpoint (model, optimizer,
LR plan, epoch, step, config) with `ray.train.report`. Rank 0 sends the status events to the
run's emitter actor (see training.events.emitter). No code path exists only for tests.

A step is one optimizer step: `accumulation` micro-batches per worker (the job's resolved
global batch: ~0.5 M tokens on GPUs, submitter.contract.batch), gradients communicated only on
the last (training.gpt2.parallel.gradient_sync: DDP `no_sync`, FSDP2 `set_requires_gradient_sync`).
Per step nothing waits for the GPU: the loss is summed on the device and read (`.item()`, one
all-reduce) every `progress_every` steps. Batches arrive as NumPy and are copied to the device
only when used. Two data paths: a prepared corpus (`loop_config["corpus"]`,
training.data.reader) is read by position: each rank computes its slice of every global step
from (seed, epoch, sequences consumed in the epoch), which the checkpoint carries, so a resume
reads nothing before its position and a resized group continues the same global sequence.
Otherwise Ray Data's shard: its order is a seeded local shuffle (seed, epoch, rank), the same on
every (re)start, so a resume that skips k batches (read on the host, never copied to the device)
sees exactly the batches the interrupted run would have seen next.
`tokens_per_sec` is over wall time, data waits included; `data_wait_fraction` is each step's
wait for data over that step's time, summed over the window's steps (training.gpt2.input_path).
Checkpoints: at every epoch end, every `checkpoint_every` steps, and every `checkpoint_minutes`
of wall time (30 on GPUs: what a hard fault loses at most), decided at a progress window from
an all-reduced flag so every rank saves at the same step. Saving pauses training only for the
state's copy into host memory (`stall_s` in checkpoint_saved); writing `state.pt` and the upload
run in Ray Train's upload thread behind training (`CheckpointUploadMode.ASYNC` with our
`checkpoint_upload_fn`; one in flight at most, training.run.upload_slot; flushed when the loop
returns); the preemption checkpoint's upload is waited for before the worker leaves.
"""

from __future__ import annotations

import tempfile
import threading
import time
import zlib
from typing import Any, Iterator, Optional

from submitter.contract.shutdown import exit_chain
from training.run.checkpoint_io import interval_due, load_state, save_state, snapshot
from training.gpt2.config import TrainConfig
from training.gpt2.input_path import InputPath, WaitShare
from training.run.object_store import as_uri
from training.run.preempt import (StepGate, clear_limit_stop, leave, limit_reason,
                                   preemption_metrics, request_limit_stop, requested,
                                   seconds_left)
from training.run.upload_slot import UploadSlot

STATE_FILE = "state.pt"
#: Blocks in each worker's local shuffle buffer, in micro-batches.
SHUFFLE_BATCHES = 16


def shuffle_seed(seed: int, epoch: int, rank: int) -> int:
    """The local shuffle's seed for one worker's epoch (a new order every epoch, the same
    order on every restart)."""
    return zlib.crc32(f"{seed}/{epoch}/{rank}".encode())


def planned_total(steps_per_epoch: int, epochs: int) -> int:
    return steps_per_epoch * epochs


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


def resume_position(state: Optional[dict[str, Any]], global_batch: int) -> int:
    """Sequences of the resumed epoch already trained (a prepared corpus's reader starts
    there): the checkpoint's count, else its steps in the epoch times the step (a checkpoint
    from before positions were saved)."""
    if state is None or state["epoch_done"]:
        return 0
    return int(state.get("sequences_in_epoch", state["step_in_epoch"] * global_batch))


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

    def limit_stop(self, reason: str, step: int) -> None:
        """Tell the driver this run stops for a limit (it records run_stopped after fit())."""
        if self.hub is not None:
            import ray

            ray.get(self.hub.stop_for_limit.remote(reason, step))

    def started(self, resumed_from: Optional[str], epoch: int, step: int,
                **group: Any) -> None:
        if self.hub is not None:
            import ray

            ray.get(self.hub.worker_group_started.remote(resumed_from, epoch, step, **group))


def _all_mean(values: list[float], device: Any) -> list[float]:
    """Average floats across workers (identity when training in one process)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t / dist.get_world_size()).tolist()


def _open_reader(corpus: Optional[dict[str, Any]]) -> Any:
    """The prepared corpus's reader (the driver checked its files and tokenizer), a mixture's
    (several corpora by weight), or None."""
    if not corpus:
        return None
    from training.data.reader import open_corpus, open_mixture

    if corpus.get("mixture"):
        return open_mixture(corpus["mixture"], corpus["block"])
    return open_corpus(corpus["uri"], corpus["block"])


def _norm_value(norm: Any) -> Optional[float]:
    """A gradient norm as a float (FSDP's is a DTensor: its full value), None if none yet."""
    if norm is None:
        return None
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    return round(float(norm), 5)


class Prefetched:
    """An iterator whose first item is fetched at once in a background thread, so that the
    source (a Ray Data pipeline: processes to start, blocks to read and tokenize) warms up
    while the caller does other work (builds the model). Iterating joins that thread first;
    after it, items come from the source in the caller's thread, in order."""

    def __init__(self, source: Iterator[Any]) -> None:
        self._source = source
        self._first: list[Any] = []
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._fetch, name="prefetch-first", daemon=True)
        self._thread.start()

    def _fetch(self) -> None:
        try:
            self._first.append(next(self._source))
        except StopIteration:
            pass
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            self._error = e

    def __iter__(self) -> "Prefetched":
        return self

    def __next__(self) -> Any:
        self._thread.join()  # at once after the first call
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._first:
            return self._first.pop()
        return next(self._source)


def train_func(loop_config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch
    import torch
    from ray.train import Checkpoint

    from training.gpt2.microbatch import choose as choose_worker_batch
    from training.gpt2.compiling import CompileCache, compile_enabled, compile_model, compile_seconds, counters
    from training.gpt2.elastic import group_batch
    from training.gpt2.evaluation import evaluate_loss
    from training.gpt2.model import BETAS, MIN_LR_RATIO, build_model, build_optimizer, gpt2_config
    from training.gpt2.parallel import gradient_sync, is_fsdp, unwrapped, wrap_model
    from training.gpt2.precision import apply_gradients, make_scaler, precision_here
    from training.run.identity import join
    from training.gpt2.schedule import resumed_plan

    cfg = TrainConfig.from_dict(loop_config["config"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    events = _Events(loop_config.get("hub"), rank)
    device = ray.train.torch.get_device()
    precision = precision_here(cfg.precision, device)
    # this worker's part of the job's fixed step: its micro-batch from the GPU's free memory,
    # accumulation = its share / micro-batch, the loss weight that keeps a token mean
    mine = choose_worker_batch(cfg.job, world, rank, device, precision.name,
                               loop_config["vocab_size"])
    micro_size, accum = mine.micro, mine.accumulation

    def autocast() -> Any:  # FSDP2's MixedPrecisionPolicy casts instead (training.gpt2.precision)
        return precision.autocast(device.type, params_cast=is_fsdp(model))

    # --- the checkpoint's state first: it says which epoch's data to start streaming -------
    state, resumed_from = None, None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = load_state(d)  # weights_only: the storage is shared (training.run.checkpoint_io)
        resumed_from = as_uri(cfg.storage_path, checkpoint.path)
    start_epoch, skip, step = resume_point(state)
    # A prepared corpus (training.data.reader) is read by position: each rank computes its
    # slice of every global step from (seed, epoch, sequences consumed), so a resume reads
    # nothing before its position and a resized group continues the same sequence. Otherwise
    # the Ray Data pipeline's shard, whose resume replays the epoch up to its step.
    reader = _open_reader(loop_config.get("corpus"))
    position = resume_position(state, mine.global_batch)
    data_seed = (state or {}).get("seed", cfg.seed)  # the order the checkpoint was trained in
    data_pin = None  # what the order depends on (training.data.order.order_pin): checkpointed
    if reader is not None:
        from training.data.order import resume_order

        data_pin = reader.pin(reader.order(data_seed, start_epoch))
        # a changed corpus/block/order refuses mid-epoch (the driver said so before Ray
        # started), or with --restart-epoch starts the epoch afresh
        position = resume_order((state or {}).get("data_order"), data_pin, position,
                                start_epoch, cfg.job.restart_epoch)
        skip = skip if position else 0
    train_shard = ray.train.get_dataset_shard("train") if reader is None else None

    def epoch_batches(epoch: int, start: int = 0) -> Iterator[dict[str, Any]]:
        if reader is not None:
            return reader.batches(reader.order(data_seed, epoch), start, mine.global_batch,
                                  mine.offset, mine.share, mine.micro)
        return mine.paced(iter(train_shard.iter_batches(  # unequal shares end together
            batch_size=micro_size, drop_last=mine.equal, batch_format="numpy",
            local_shuffle_buffer_size=micro_size * SHUFFLE_BATCHES,
            local_shuffle_seed=shuffle_seed(cfg.seed, epoch, rank))))

    # The data starts now and fills while the model is built (start-up, issue #12).
    first_batches = (Prefetched(epoch_batches(start_epoch, position))
                     if start_epoch < cfg.epochs else None)

    # --- model, optimizer, schedule; then the checkpoint on top ----------------------------
    torch.manual_seed(cfg.seed)
    model_config = gpt2_config(cfg.model, loop_config["vocab_size"], loop_config["eot_id"],
                               cfg.block_size)
    block = model_config.n_positions
    model = build_model(model_config)
    compile_cache = None
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    if compile_enabled(cfg.compile, device.type, capability):  # before DDP/FSDP wrap the model
        compile_cache = CompileCache(join(cfg.storage_path, cfg.run_name), rank)
        compile_facts = compile_cache.open()
        model = compile_model(model, per_block=cfg.fsdp)  # FSDP2: per block (torchtitan)
    model, worker_facts = wrap_model(model, fsdp=cfg.fsdp, precision=precision,
                                     world=world, device=device)
    worker_facts["compile"] = compile_cache is not None
    optimizer = build_optimizer(model, cfg.learning_rate, cfg.weight_decay, BETAS)
    scaler = make_scaler(precision, device.type, sharded=is_fsdp(model))

    if state is not None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"],
                       options=StateDictOptions(full_state_dict=True))
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
    # Steps per epoch: the driver's estimate until an epoch has ended (then the real figure,
    # kept in the checkpoint); the LR plan re-plans from the current LR when it changes.
    # An estimate that proves too low while the first epoch runs is doubled (and the plan
    # re-planned from the current LR) each time the epoch outlasts it.
    saved = state or {}
    steps_per_epoch = saved.get("steps_per_epoch") or loop_config["steps_per_epoch"]
    measured = bool(saved.get("steps_per_epoch_measured", saved.get("steps_per_epoch"))
                    or reader is not None)  # a prepared corpus's manifest says it exactly
    plan = resumed_plan(saved.get("scheduler"), step,
                        planned_total(steps_per_epoch, cfg.epochs), loop_config["warmup_steps"],
                        MIN_LR_RATIO)
    # this group's size and its optimizer step (training.gpt2.elastic: the emitter tells a resize)
    events.started(resumed_from, epoch=start_epoch + 1, step=step,
                   **group_batch(mine, world, block),
                   **({"sequences_in_epoch": position} if reader is not None else {}))

    def save(metrics: dict[str, Any], epoch: int, step_in_epoch: int, epoch_done: bool,
             budget_s: Optional[float] = None) -> None:
        """All ranks: gather the full state into host memory (a collective under FSDP); rank 0
        hands it to Ray Train, whose upload thread writes it to a local directory, uploads that
        and deletes it, behind training. At most one upload is in flight (`slot`): rank 0 first
        waits for the previous one, before it makes a second host copy (the wait is part of
        stall_s); the preemption checkpoint waits at most what is left of `budget_s` (then it
        is not handed over: the process leaves next, `leave` waits for its upload)."""
        from ray.train import CheckpointUploadMode
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        from training.run.checkpoint_events import scored

        nonlocal last_save
        t_save = time.perf_counter()
        free = rank != 0 or slot.wait(None if budget_s is None else seconds_left(budget_s))
        model_sd, optim_sd = get_state_dict(
            model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        name = checkpoint_name(epoch + 1, step)
        ckpt, upload = None, None
        if rank == 0 and free:
            state = snapshot({
                "model": model_sd, "optimizer": optim_sd, "scheduler": plan.to_dict(),
                "epoch": epoch, "step": step, "step_in_epoch": step_in_epoch,
                "epoch_done": epoch_done, "config": cfg.to_dict(),
                # the data's position: a resume computes every rank's next slice from it
                "seed": data_seed, "sequences_in_epoch": consumed, "data_order": data_pin,
                "model_config": model_config.to_dict(), "steps_per_epoch": steps_per_epoch,
                "steps_per_epoch_measured": measured, "accumulation": accum,
                "precision": precision.name,
                "scaler": scaler.state_dict() if scaler is not None else None}, device.type)
            # Ray's own upload (a DeveloperAPI: StorageContext), after writing the file there
            storage = ray.train.get_context().get_storage()

            def write_and_upload(local: Any, dir_name: str) -> Any:  # Ray Train's upload thread
                if state.get("data_order") is not None:  # the driver checks a resume with it
                    from training.data.reader import write_order_note

                    write_order_note(local.path, state)
                save_state(local.path, **state)
                state.clear()  # the host copy goes as soon as it is on disk
                return storage.persist_current_checkpoint(local, dir_name)

            upload = slot.hold(write_and_upload)
            # an empty local directory: Ray Train deletes it once uploaded
            ckpt = Checkpoint.from_directory(tempfile.mkdtemp(prefix="checkpoint-"))
        # what training waited for (the upload runs behind it): checkpoint_saved's stall_s
        stall = time.perf_counter() - t_save
        # checkpoint_saved comes from the controller once registered (training.run.checkpoint_events)
        try:
            # no val_loss (no validation split): ranked by recency, not a TypeError in Ray
            ray.train.report({**scored(metrics), "epoch_done": epoch_done,
                              "stall_s": round(stall, 3)},
                             checkpoint=ckpt, checkpoint_dir_name=name,
                             checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
                             checkpoint_upload_fn=upload, delete_local_checkpoint_after_upload=True)
        except BaseException:
            slot.release()  # never handed over
            raise
        last_save = time.perf_counter()

    feed = InputPath(device)  # pinned, side-stream copies one micro-batch ahead (CUDA)
    to_device = feed.to_device

    def evaluate() -> Optional[float]:
        """Mean loss over (up to val_steps) validation batches of every worker."""
        if reader is not None:  # the val shard(s) in order, micro-batches dealt to the ranks
            val_batches = reader.val_batches(rank, world, micro_size, cfg.val_steps)
        else:
            val_batches = ray.train.get_dataset_shard("val").iter_batches(
                batch_size=micro_size, drop_last=True, batch_format="numpy")
        net = model if is_fsdp(model) else unwrapped(model)  # DDP's forward would sync buffers
        # the same number of batches on every rank (training.gpt2.evaluation: FSDP cannot hang)
        loss, _ = evaluate_loss(net, val_batches, device, to_device, autocast, cfg.val_steps)
        return loss

    def step_once(micro: list[dict[str, Any]]) -> Any:
        """One optimizer step over `accum` micro-batches; the mean loss, on the device."""
        nonlocal step, last_lr, grad_norm
        last_lr = plan.apply(optimizer, cfg.learning_rate, step)
        step_loss = torch.zeros((), device=device)
        for k, batch in enumerate(micro):
            x = to_device(batch)
            with gradient_sync(model, sync=k == len(micro) - 1):  # one all-reduce a step
                with autocast():
                    loss = model(input_ids=x, labels=x).loss
                    if mine.loss_weight != 1:  # a token mean over the step's shares
                        loss = loss * mine.loss_weight
                (scaler.scale(loss) if scaler is not None else loss).backward()
            step_loss += loss.detach().float()
        # the norm before clipping, read with the progress window's sync
        grad_norm = apply_gradients(model, optimizer, scaler, cfg.grad_clip)
        step += 1
        return step_loss

    # --- the loop ------------------------------------------------------------------------
    last_lr = cfg.learning_rate * plan.factor(step)
    grad_norm: Any = None  # the last step's (a tensor on the device; training.events.trackers logs it)
    last_save = time.perf_counter()  # the interval clock: wall time since the last checkpoint
    timed_due = False
    tokens_per_step = mine.global_batch * block
    model.train()
    optimizer.zero_grad(set_to_none=True)
    first_step = True  # report the first step of every start (time to first/resumed step)
    cap = cfg.max_steps_per_epoch
    # SIGTERM -> checkpoint at the next step boundary (training.run.preempt): the ranks agree on
    # the flag every step, on the host, overlapped with the step. Only rank 0 asks the
    # driver's actor: the max-reduce hands its answer to every rank. A worker's share of the
    # grace period (submitter.contract.shutdown) bounds its save; one upload in flight at most.
    gate = StepGate(loop_config.get("hub") if rank == 0 else None)
    budget = exit_chain(cfg.termination_grace_period).worker_save_s
    slot = UploadSlot()
    # the job's --deadline / --max-cost over the whole run (submitter.contract.run_limits):
    # rank 0 measures, the step's flag reduce tells every rank (a limit's code, not SIGTERM's)
    from submitter.contract.run_limits import Limits, passed

    limits = Limits.from_dict(loop_config.get("limits")) if rank == 0 else None
    stopped = False
    for epoch in range(start_epoch, cfg.epochs):
        done_in_epoch = skip if epoch == start_epoch else 0
        consumed = position if epoch == start_epoch else 0  # sequences of the epoch trained
        epoch_loss = torch.zeros((), device=device, dtype=torch.float64)
        epoch_steps, epoch_start, epoch_wait = 0, time.perf_counter(), WaitShare()
        window_loss = torch.zeros((), device=device, dtype=torch.float64)
        window_steps, window_start, window_wait = 0, time.perf_counter(), WaitShare()
        batches = first_batches if epoch == start_epoch else epoch_batches(epoch)
        for _ in range(0 if reader is not None else done_in_epoch * accum):  # covered by the
            if next(batches, None) is None:  # checkpoint: read on the host, never copied to
                break                        # the device (a prepared corpus starts past them)
        while not (cap and done_in_epoch >= cap):
            if not measured and done_in_epoch >= steps_per_epoch:  # the estimate was low
                steps_per_epoch *= 2
                plan = plan.replan(step, planned_total(steps_per_epoch, cfg.epochs))
            t_wait = time.perf_counter()
            micro = feed.take(batches, accum)  # host arrays; the first copy starts
            waited = time.perf_counter() - t_wait
            if len(micro) < accum:
                break  # the epoch's data ran out (a partial accumulation is dropped)
            if limits is not None and not requested():
                reason = passed(limits, time.time(), world)
                if reason is not None:
                    request_limit_stop(reason)
            gate.begin()
            step_loss = step_once(micro)
            if first_step and compile_cache is not None:  # the first step compiled (or loaded)
                compile_cache.after_first_step()
                worker_facts.update(compile_facts, compile_s=compile_seconds(), **counters())
            done_in_epoch += 1
            consumed += mine.global_batch
            epoch_loss += step_loss
            window_loss += step_loss
            epoch_steps, window_steps = epoch_steps + 1, window_steps + 1
            epoch_wait.add(waited, time.perf_counter() - t_wait)  # this step's wait / its time
            window_wait.add(waited, time.perf_counter() - t_wait)

            if step % cfg.progress_every == 0 or first_step:
                loss_sum = window_loss.item()  # the one host sync per window
                elapsed = time.perf_counter() - window_start
                # the interval flag rides on the same all-reduce: every rank sees one decision
                mean_loss, wait_fraction, due = _all_mean(
                    [loss_sum / window_steps, window_wait.fraction(),
                     float(interval_due(time.perf_counter() - last_save,
                                        cfg.checkpoint_minutes))], device)
                timed_due = due > 0
                # the first report of a start also says how the workers train
                how = ({"precision": precision.name, "accumulation_steps": accum,
                        "micro_batch_size": micro_size, "world_size": world, **worker_facts}
                       if first_step else {})
                events.emit("progress", epoch=epoch + 1, step=step, loss=round(mean_loss, 5),
                            tokens_per_sec=round(tokens_per_step * window_steps / elapsed, 1),
                            data_wait_fraction=round(wait_fraction, 4), lr=last_lr,
                            grad_norm=_norm_value(grad_norm), **how)
                window_loss.zero_()
                window_steps, window_start, window_wait = 0, time.perf_counter(), WaitShare()
                first_step = False
            last_of_epoch = bool(cap) and done_in_epoch >= cap
            interval_save = (bool(cfg.checkpoint_every) and step % cfg.checkpoint_every == 0
                             or timed_due) and not last_of_epoch
            timed_due = False
            if interval_save:
                t_pause = time.perf_counter()
                val_loss = evaluate()
                save({"epoch": epoch + 1, "step": step, "val_loss": val_loss,
                      "train_loss": epoch_loss.item() / epoch_steps}, epoch, done_in_epoch, False)
                paused = time.perf_counter() - t_pause  # not training time: out of tokens/s
                epoch_start, window_start = epoch_start + paused, window_start + paused
            stop = gate.stop()  # every rank the same answer, at the same step
            if stop and limit_reason() is not None:  # a limit: save, end training normally
                reason = limit_reason()
                if not interval_save:
                    save({**preemption_metrics(epoch, step, epoch_loss.item() / epoch_steps),
                          "reason": reason}, epoch, done_in_epoch, False)
                events.limit_stop(reason, step)
                clear_limit_stop()
                stopped = True
                break
            if stop:  # preempted: save where we are (unless just saved), retryable exit
                if not interval_save:
                    save(preemption_metrics(epoch, step, epoch_loss.item() / epoch_steps), epoch,
                         done_in_epoch, False, budget_s=budget)
                leave(step, checkpoint_name(epoch + 1, step), budget,
                      slot.wait if rank == 0 else lambda timeout: True)

        if stopped:
            break
        # --- end of epoch: the real steps per epoch, validate, report, checkpoint -------------
        if not measured and done_in_epoch:  # (skipped steps of a resumed epoch count too)
            measured = True
            if done_in_epoch != steps_per_epoch:
                steps_per_epoch = done_in_epoch
                plan = plan.replan(step, planned_total(steps_per_epoch, cfg.epochs))
        epoch_time = time.perf_counter() - epoch_start
        val_loss = evaluate()
        train_loss, tok_s, wait_fraction = _all_mean(
            [epoch_loss.item() / max(1, epoch_steps),
             tokens_per_step * epoch_steps / epoch_time if epoch_time else 0.0,
             epoch_wait.fraction()], device)
        metrics = {"epoch": epoch + 1, "step": step, "train_loss": train_loss,
                   "val_loss": val_loss, "tokens_per_sec": tok_s, "lr": last_lr}
        events.emit("epoch_finished", epoch=epoch + 1, epochs=cfg.epochs, step=step,
                    train_loss=round(train_loss, 5),
                    val_loss=None if val_loss is None else round(val_loss, 5),
                    tokens_per_sec=round(tok_s, 1), data_wait_fraction=round(wait_fraction, 4),
                    steps=epoch_steps)
        save(metrics, epoch, done_in_epoch, True)
    gate.close()
    events.flush()
    if reader is not None:
        reader.close()
