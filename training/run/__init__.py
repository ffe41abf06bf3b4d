"""A run on its storage: where it lives and who drives it (`identity`), the storage checks
inside the pod (`mounts`), object stores, the checkpoint files and the `checkpoint_saved` event,
the one-upload-at-a-time slot, the stored logs, a failed run's one line (`failure`), and
preemption (SIGTERM -> checkpoint -> exit 143; the pods' preStop hook is
`python -m training.prestop`).

Knows nothing of GPT-2, the events' sinks or a user's script: imports nothing else of `training`.
"""
