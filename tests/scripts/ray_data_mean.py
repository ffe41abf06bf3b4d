"""A user's Ray Train script that feeds its workers through Ray Data (a shard per worker).

It fits the mean of a column and reports `loss` each epoch, checkpointing a small JSON.
"""

import json
import os
import sys
import tempfile

import ray
import ray.train
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def train_func(config):
    estimate, start = 0.0, 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            state = json.load(f)
        estimate, start = state["estimate"], state["epoch"] + 1
    shard = ray.train.get_dataset_shard("train")
    for epoch in range(start, config["epochs"]):
        values = [row["value"] for row in shard.iter_rows()]
        loss = sum((v - estimate) ** 2 for v in values) / max(len(values), 1)
        estimate += 0.5 * (sum(values) / max(len(values), 1) - estimate)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"estimate": estimate, "epoch": epoch}, f)
            ray.train.report({"epoch": epoch, "loss": loss, "estimate": estimate},
                             checkpoint=Checkpoint.from_directory(d))


if __name__ == "__main__":
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    ray.data.DataContext.get_current().enable_progress_bars = False
    data = ray.data.from_items([{"value": float(i % 10)} for i in range(200)])
    trainer = TorchTrainer(train_func, train_loop_config={"epochs": epochs},
                           scaling_config=ScalingConfig(num_workers=1,
                                                        resources_per_worker={"CPU": 0.5}),
                           datasets={"train": data}, run_config=RunConfig())
    trainer.fit()
