"""How a run tells what it does: the emitter actor and its sinks (stdout, `events.jsonl`, the
progress ConfigMap: the one module here that talks to Kubernetes), the driver's poller, and the
metrics trackers (TensorBoard, MLflow, W&B).

Event names and fields are `submitter.contract.events`. May import `training.run` (where the
run's files are); never the model, the data or a user's script.
"""
