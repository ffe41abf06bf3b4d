"""A user's Ray Train script, as a submitter test runs it: y = 3x + 1 learned by a TorchTrainer.

It knows nothing of submitter (no storage_path, no run name): the runner gives those. It
resumes with the pattern of docs/own-script.md, reports `loss` and its own `mse`, and
checkpoints on SIGTERM with training.script.should_stop(). Test knobs (arguments):
--epochs N, --workers N, --crash-once FILE (rank 1 dies once at epoch 2: a worker failure;
with --crash-after-saved EVENTS, only once that events file says a checkpoint was registered),
--storage-path P (the script sets its own, which the runner checks), --sleep S per epoch,
--checkpoint-every N epochs (and whenever should_stop() says so), --fail-at N (rank 1 raises
ValueError at epoch N, every time: a failing run), --max-failures N (FailureConfig's, 2).
"""

import argparse
import os
import tempfile
import time

import ray.train
import torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from training.script import Preempted, should_stop


def _wait_for_a_registered_checkpoint(events_file, timeout=120.0):
    """A test's crash comes after Ray Train registered a checkpoint (under load its controller
    may not have seen the reports yet when rank 1 reaches epoch 2)."""
    deadline = time.monotonic() + timeout
    while events_file and time.monotonic() < deadline:
        if os.path.exists(events_file) and '"checkpoint_saved"' in open(events_file).read():
            return
        time.sleep(0.1)


def train_func(config):
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    start = 0
    checkpoint = ray.train.get_checkpoint()             # the resume pattern
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["epoch"] + 1
    model = ray.train.torch.prepare_model(model)
    x = torch.linspace(-1, 1, 64).unsqueeze(1)
    y = 3 * x + 1
    rank = ray.train.get_context().get_world_rank()
    for epoch in range(start, config["epochs"]):
        if config["crash_once"] and epoch == 2 and rank == 1 and not os.path.exists(config["crash_once"]):
            _wait_for_a_registered_checkpoint(config["crash_after_saved"])
            open(config["crash_once"], "w").close()
            os._exit(1)                                   # a worker dies mid-run
        if epoch == config["fail_at"] and rank == 1:
            raise ValueError(f"bad batch at epoch {epoch}")  # a user's bug: the run fails
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(config["sleep"])
        stop = should_stop()
        save = rank == 0 and (stop or (epoch + 1) % config["checkpoint_every"] == 0)
        with tempfile.TemporaryDirectory() as d:
            if save:
                inner = model.module if hasattr(model, "module") else model
                torch.save({"model": inner.state_dict(), "opt": opt.state_dict(), "epoch": epoch},
                           os.path.join(d, "state.pt"))
            ray.train.report({"epoch": epoch, "loss": loss.item(), "mse": loss.item()},
                             checkpoint=Checkpoint.from_directory(d) if save else None)
        if stop:
            raise Preempted("checkpointed on SIGTERM")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--crash-once", default="")
    p.add_argument("--crash-after-saved", default="")
    p.add_argument("--storage-path", default=None)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--checkpoint-every", type=int, default=1)
    p.add_argument("--fail-at", type=int, default=-1)
    p.add_argument("--max-failures", type=int, default=2)
    a = p.parse_args()
    run_config = RunConfig(storage_path=a.storage_path,
                           failure_config=FailureConfig(max_failures=a.max_failures))
    trainer = TorchTrainer(train_func,
                           train_loop_config={"epochs": a.epochs, "crash_once": a.crash_once,
                                              "crash_after_saved": a.crash_after_saved,
                                              "sleep": a.sleep,
                                              "checkpoint_every": a.checkpoint_every,
                                              "fail_at": a.fail_at},
                           scaling_config=ScalingConfig(num_workers=a.workers,
                                                        resources_per_worker={"CPU": 0.5}),
                           run_config=run_config)
    result = trainer.fit()
    print("final loss", result.metrics.get("loss"))
