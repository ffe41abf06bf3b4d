"""`--compile auto|on|off`: torch.compile for the model and its loss, with the compiler's
cache on the run's storage.

What is compiled (`compile_model`), by layout:
- one GPU and DDP: the whole model and the loss as ONE region (`model.compile()`, as nanoGPT
  compiles its model): embeddings, the 12 blocks, `ln_f` and the fused loss
  (`training.gpt2.loss.lm_loss`, traced inline) in one graph, so inductor fuses across block
  boundaries and the loss's log-softmax into the kernels around the LM-head matmuls. It is
  compiled in place before DDP wraps the model: DDP then calls the compiled module, and dynamo,
  seeing the call inside DDP's forward, splits the graph at DDP's bucket boundaries
  (DDPOptimizer) so each bucket's all-reduce still starts while backward runs.
- FSDP2: per block (`block.compile()` on every GPT2Block, the torchtitan pattern) and the loss
  on its own; FSDP2's hooks (gather a block's parameters before it, free them after) stay
  outside the graphs (dynamo skips them), all blocks share one graph (the same code and
  shapes), and the embeddings and `ln_f` stay eager.
`nn.Module.compile` compiles in place: the parameter names (and so the checkpoints) do not
change (`torch.compile(model)` would prefix them with `_orig_mod.`). Shapes are static (every
micro-batch has the same shape): the graphs compile once, at the first step; evaluation
(`no_grad`, `eval()`) compiles once more. tests/training/test_compute.py counts the graphs,
recompiles and the blocks that run compiled for both layouts on a 12-layer model.
Compilation is lazy: the first step pays it; `compile_seconds` says how long, and the first
progress event of every start carries it (`compile_s`).

The cache: inductor's FX-graph and AOTAutograd caches turn a restart's compile from tens of
seconds into a few. Where they live:
- a run directory on a filesystem (a PVC, a local run): `<run dir>/.compile-cache` is
  `TORCHINDUCTOR_CACHE_DIR` (Triton's kernels go under it too), shared by every worker and
  every restart of the run;
- a run directory in an object store: there is no directory to point inductor at, so each
  worker starts from `torch.compiler.load_cache_artifacts` of `<run dir>/compile-cache.bin`
  (PyTorch's "mega-cache"), which rank 0 writes with `save_cache_artifacts` after a first
  step that compiled anything new.
The cache holds compiled code that the workers load and run: whoever can write the run's
storage can run code in the next start. That is the same trust the storage needs anyway for a
resume to be meaningful, but unlike the checkpoints (read `weights_only`), it is code; use
`--compile off` where the storage is writable by others.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from submitter.contract.spec import COMPILE_MODES
from training.run.identity import is_local, join

#: Inductor's cache directory under a run directory on a filesystem.
CACHE_DIR = ".compile-cache"
#: The mega-cache object beside the checkpoints of a run in an object store.
CACHE_ARTIFACTS = "compile-cache.bin"


#: Triton, inductor's GPU backend, needs compute capability 7.0 (V100) or later.
MIN_CAPABILITY = (7, 0)


def compile_enabled(mode: str, device_type: str,
                    capability: Optional[tuple[int, int]] = None) -> bool:
    """auto: on for CUDA (where launch overhead and unfused kernels cost most of the step)
    from sm70 (V100, T4 and later; Triton has no older target), off on CPU (compiling costs
    more than it saves for a tiny CPU run). `capability`: the GPU's (None: not known)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile {mode!r} is not one of {', '.join(COMPILE_MODES)}")
    if mode != "auto":
        return mode == "on"
    return device_type == "cuda" and (capability is None or tuple(capability) >= MIN_CAPABILITY)


def cache_location(run_dir: str) -> tuple[str, str]:
    """("dir", path) for a run on a filesystem, ("artifacts", uri) for an object store."""
    if is_local(run_dir):
        return "dir", join(run_dir, CACHE_DIR)
    return "artifacts", join(run_dir, CACHE_ARTIFACTS)


def _blocks(model: Any) -> list[Any]:
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    return [m for m in model.modules() if isinstance(m, GPT2Block)]


def compile_model(model: Any, *, per_block: bool = False, backend: str = "inductor") -> Any:
    """Compile `model` in place, before DDP/FSDP wrap it (see the module docstring): the
    whole model and loss as one region, or with `per_block` (FSDP2) each block and the loss.
    `backend`: torch.compile's (tests use a recording one). The loss's memory budget is fixed
    here, from the card, so that tracing reads it as a constant."""
    import torch

    from training.gpt2.loss import lm_loss, loss_budget_bytes

    if getattr(model, "loss_budget", 0) is None:
        model.loss_budget = loss_budget_bytes()
    if per_block:
        for block in _blocks(model):
            block.compile(backend=backend)
        model.loss_fn = torch.compile(lm_loss, backend=backend)
    else:
        model.compile(backend=backend)
    return model


def counters() -> dict[str, int]:
    """Inductor's cache hits and misses in this process so far (FX graphs, AOTAutograd)."""
    from torch._dynamo.utils import counters as c

    return {"fxgraph_cache_hit": int(c["inductor"]["fxgraph_cache_hit"]),
            "fxgraph_cache_miss": int(c["inductor"]["fxgraph_cache_miss"]),
            "autograd_cache_hit": int(c["aot_autograd"]["autograd_cache_hit"]),
            "autograd_cache_miss": int(c["aot_autograd"]["autograd_cache_miss"])}


def compile_seconds() -> Optional[float]:
    """Seconds this process spent compiling (Dynamo's forward compiles, which include
    inductor's, plus the backward graphs compiled at the first backward). None when the
    counters are not there (a torch that renamed them)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics as m
    except ImportError:
        return None
    if "_compile.compile_inner" not in m:
        return None
    return sum(m.get("_compile.compile_inner", [])) + sum(m.get("compile_fx.<locals>.bw_compiler", []))


class CompileCache:
    """The run's compiler cache for this worker (see the module docstring)."""

    def __init__(self, run_dir: str, rank: int) -> None:
        self.kind, self.where = cache_location(run_dir)
        self.rank = rank
        self.loaded = False

    def open(self) -> dict[str, Any]:
        """Before the first compile: point inductor at the cache (or load it); facts for the
        first progress event."""
        import torch

        torch._inductor.config.fx_graph_cache = True
        torch._functorch.config.enable_autograd_cache = True
        if self.kind == "dir":
            os.makedirs(self.where, exist_ok=True)
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = self.where
        else:
            try:
                data = _read_object(self.where)
                if data:
                    self.loaded = torch.compiler.load_cache_artifacts(data) is not None
            except Exception:  # noqa: BLE001 - an unreadable cache: compile afresh
                self.loaded = False
        return {"compile_cache": self.where}

    def after_first_step(self) -> None:
        """Rank 0 writes the mega-cache when this start compiled something new (object store
        only; a directory cache is written by inductor as it compiles)."""
        if self.kind != "artifacts" or self.rank != 0:
            return
        if counters()["fxgraph_cache_miss"] == 0:
            return
        import torch

        try:
            saved = torch.compiler.save_cache_artifacts()
            if saved is not None:
                _write_object(self.where, saved[0])
        except Exception:  # noqa: BLE001 - a cache that cannot be written costs the next start a compile
            pass


def _read_object(uri: str) -> Optional[bytes]:
    from pyarrow import fs

    from training.run.object_store import split_uri

    filesystem, path = split_uri(uri)
    if filesystem.get_file_info(path).type == fs.FileType.NotFound:
        return None
    with filesystem.open_input_stream(path) as f:
        return f.read()


def _write_object(uri: str, data: bytes) -> None:
    from training.run.object_store import split_uri

    filesystem, path = split_uri(uri)
    with filesystem.open_output_stream(path) as f:
        f.write(data)
