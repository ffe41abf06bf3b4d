"""GPT-2 and its step: the model, the loss, precision, compiling, DDP/FSDP, the batch and the
learning-rate plan, the input path, and the loop each Ray Train worker runs (`loop.train_func`).

Start at `loop.py`; `model.py` is the model in one file (it imports only `loss`). May import
`training.run` (the run's storage: checkpoints, preemption) and `training.data`'s tokenizers;
never `training.events`, `training.script` or `training.smoke`, and nothing above it.
"""
