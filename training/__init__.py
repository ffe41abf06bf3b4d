"""The GPT-2 pre-training entrypoint (`python -m training`) that runs inside the RayJob.

The programs a pod or a user runs sit here at the top: `python -m training` (`__main__`, `args`,
`driver`, and `run_plan` + `gpu_check`, what the driver decides before the workers start),
`python -m training.run_script` (a user's own Ray Train script), `python -m training.prestop`
(the pods' preStop hook) and `python -m training.gpu_smoke`. Under them, the rooms (each
package's opening lines say what it holds and what it may import; docs/contributing.md maps them):

- `gpt2/`: the model and its step, the loop each worker runs;
- `data/`: the corpus, its tokenizers, the pipeline to the workers;
- `run/`: a run on its storage (identity, mounts, checkpoints, logs, preemption);
- `events/`: the emitter and its sinks, the poller, the metrics trackers;
- `script/`: a user's own script (its public `should_stop`/`Preempted`, and the hooks);
- `smoke/`: the GPU smoke run's parts (nothing in the job imports it).

Light on import: the heavy modules (ray, torch, transformers) load inside the functions that
need them, so `--help`, argument errors and the event schema stay fast. The old flat module
names still import (training._moved).
"""

from training import _moved

_moved.install()
