"""The compute path (issue #18): one-kernel GELU, a chunked loss equal to the plain one that
never holds the batch's fp32 logits, `--compile` (same loss curve as eager; the second start
reuses the run's compile cache), and FSDP2's policy as the only cast."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from tests.conftest import ROOT
from tests.support import gloo
from training.gpt2.compiling import CACHE_DIR, cache_location, compile_enabled
from training.gpt2.loss import IGNORE_INDEX, lm_loss, loss_chunk_rows
from training.gpt2.model import GELU, build_model, gpt2_config

VOCAB, EOT, BLOCK = 257, 256, 32


def _plain_loss(hidden, weight, labels):
    """Hugging Face's ForCausalLM loss: all logits, upcast to fp32 (fp64 stays), shifted labels."""
    logits = hidden @ weight.t()
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                           labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX)


def test_gelu_pytorch_tanh_is_gpt2s_gelu_new_in_one_kernel():
    from transformers.activations import ACT2FN

    x = torch.cat([torch.linspace(-12, 12, 10_001), torch.randn(100_000) * 3])
    new, fused = ACT2FN["gelu_new"](x), ACT2FN[GELU](x)
    assert torch.allclose(fused, new, rtol=0, atol=1e-6), (fused - new).abs().max()
    assert torch.equal(fused, F.gelu(x, approximate="tanh"))  # one op, no pow chain
    assert gpt2_config("tiny", VOCAB, EOT).activation_function == GELU


@pytest.mark.parametrize("chunk", [1, 7, 64, None])
def test_the_chunked_loss_equals_the_plain_loss_and_its_gradients(chunk):
    torch.manual_seed(0)
    hidden = torch.randn(3, 40, 48, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(320, 48, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 320, (3, 40))
    labels[1, 5:9] = IGNORE_INDEX  # ignored targets count for nothing
    chunked = lm_loss(hidden, weight, labels, chunk=chunk)
    gh, gw = torch.autograd.grad(chunked * 3.0, (hidden, weight))  # upstream scale, as a GradScaler
    plain = _plain_loss(hidden, weight, labels)
    ph, pw = torch.autograd.grad(plain * 3.0, (hidden, weight))
    assert chunked.item() == pytest.approx(plain.item(), rel=1e-6)
    assert torch.allclose(gh, ph, rtol=1e-6, atol=1e-9) and torch.allclose(gw, pw, rtol=1e-6, atol=1e-9)
    with torch.no_grad():  # evaluation: no gradients computed, the same value
        assert lm_loss(hidden, weight, labels, chunk=chunk).item() == pytest.approx(plain.item())


def test_the_chunked_loss_under_bf16_autocast_matches_the_plain_bf16_loss():
    torch.manual_seed(0)
    hidden = torch.randn(2, 64, 64, requires_grad=True)
    weight = (torch.randn(512, 64) * 0.05).requires_grad_()
    labels = torch.randint(0, 512, (2, 64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        chunked = lm_loss(hidden, weight, labels, chunk=16)
        plain = _plain_loss(hidden.bfloat16(), weight.bfloat16(), labels)
    assert chunked.dtype == torch.float32
    assert chunked.item() == pytest.approx(plain.item(), rel=1e-3)
    gh, gw = torch.autograd.grad(chunked, (hidden, weight))
    ph, pw = torch.autograd.grad(plain, (hidden, weight))
    assert gh.dtype == hidden.dtype and gw.dtype == weight.dtype
    assert torch.allclose(gh, ph, rtol=0.05, atol=1e-4) and torch.allclose(gw, pw, rtol=0.05, atol=1e-4)


def test_the_model_loss_equals_hugging_faces_and_so_do_the_gradients():
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    ours = build_model(gpt2_config("tiny", VOCAB, EOT, BLOCK))
    theirs = GPT2LMHeadModel(ours.config)
    theirs.load_state_dict(ours.state_dict())  # the same names: checkpoints and export unchanged
    x = torch.randint(0, VOCAB, (4, BLOCK))
    a, b = ours(input_ids=x, labels=x).loss, theirs(input_ids=x, labels=x).loss
    a.backward()
    b.backward()
    assert a.item() == pytest.approx(b.item(), rel=1e-5)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), name


class _LargestLogits(TorchDispatchMode):
    """Records the largest tensor any op creates whose last dimension is the vocabulary."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.largest = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.vocab:
                self.largest = max(self.largest, t.numel())
        return out


def test_no_more_than_one_chunk_of_logits_exists_at_a_time():
    """The bound is structural (what each op creates), not a timing or allocator figure: the
    plain loss makes batch x vocab logits, the chunked one at most chunk x vocab, forward and
    backward."""
    vocab, rows = 1024, 4 * 128
    hidden = torch.randn(4, 128, 32, requires_grad=True)
    weight = torch.randn(vocab, 32, requires_grad=True)
    labels = torch.randint(0, vocab, (4, 128))
    with _LargestLogits(vocab) as plain:
        _plain_loss(hidden, weight, labels).backward()
    with _LargestLogits(vocab) as chunked:
        lm_loss(hidden, weight, labels, chunk=64).backward()
    assert plain.largest == rows * vocab
    assert chunked.largest == 64 * vocab


class _VocabOps(TorchDispatchMode):
    """Records the dtype of every (rows, vocab) tensor the ops create (views aside), and the
    input dtypes of every matmul that involves the vocabulary."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.created, self.matmuls = vocab, [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        vocab_sized = [t for t in (out if isinstance(out, (tuple, list)) else [out])
                       if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[-1] == self.vocab]
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            if any(isinstance(a, torch.Tensor) and self.vocab in a.shape for a in args):
                self.matmuls.append(tuple(a.dtype for a in args if isinstance(a, torch.Tensor)))
        elif not func._schema.name.endswith("_"):  # in place: no new tensor
            self.created += [t.dtype for t in vocab_sized if not func.is_view]
        return out


def test_the_bf16_loss_makes_one_fp32_buffer_a_chunk_and_bf16_matmuls():
    """Issue 24: no fp32 copies of `g` and the LM head's weight gradient on bf16 tensor cores
    (fp32 accumulation inside the matmul). Eager, a chunk creates its bf16 logits, one fp32
    log-softmax (turned into `g` in place) and `g` in bf16; every matmul reads bf16."""
    vocab, chunks = 512, 4
    hidden = torch.randn(2, 64, 32, requires_grad=True)
    weight = (torch.randn(vocab, 32) * 0.05).requires_grad_()
    labels = torch.randint(0, vocab, (2, 64))
    with torch.autocast("cpu", dtype=torch.bfloat16), _VocabOps(vocab) as ops:
        lm_loss(hidden, weight, labels, chunk=2 * 64 // chunks).backward()
    assert ops.created.count(torch.float32) == chunks  # the log-softmax, nothing else in fp32
    assert ops.created.count(torch.bfloat16) == chunks  # g (the logits come out of a matmul)
    assert len(ops.matmuls) == 3 * chunks  # logits, grad of hidden, grad of the weight
    assert all(dtypes == (torch.bfloat16, torch.bfloat16) for dtypes in ops.matmuls), ops.matmuls
    assert weight.grad.dtype == torch.float32 and hidden.grad.dtype == torch.float32


def test_the_weight_gradient_keeps_fp32_accumulation_across_chunks():
    """bf16 chunks, summed in fp32 and handed back to the fp32 weight without a bf16 round
    trip: 16 chunks stay as close to an fp64 reference as one chunk does."""
    torch.manual_seed(0)
    hidden = torch.randn(4, 128, 64, requires_grad=True)
    weight = (torch.randn(256, 64) * 0.05).requires_grad_()
    labels = torch.randint(0, 256, (4, 128))
    ref = torch.autograd.grad(_plain_loss(hidden.double().bfloat16().double(),
                                          weight.double().bfloat16().double(), labels), weight)[0]
    errors = {}
    for chunks in (1, 16):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = lm_loss(hidden, weight, labels, chunk=4 * 128 // chunks)
        gw = torch.autograd.grad(loss, weight)[0]
        assert gw.dtype == torch.float32
        errors[chunks] = ((gw.double() - ref).norm() / ref.norm()).item()
    assert errors[1] < 1e-2 and errors[16] < 1e-2, errors
    assert errors[16] < 2 * errors[1] + 1e-4, errors


@pytest.mark.slow  # an inductor compile (~40 s on 2 cores)
def test_the_compiled_loss_keeps_one_bf16_vocabulary_buffer_and_matches_eager():
    """Compiled (as whole-model compile traces it), the fp32 log-softmax is fused into the
    kernels that read the logits and write `g`: the generated code allocates one
    vocabulary-sized buffer, in bf16, and no fp32 one; values and gradients equal eager's."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    rows, vocab, d = 256, 1024, 64
    hidden = torch.randn(2, rows // 2, d, requires_grad=True)
    weight = (torch.randn(vocab, d) * 0.05).requires_grad_()
    labels = torch.randint(0, vocab, (2, rows // 2))
    labels[0, 3:7] = IGNORE_INDEX

    def loss_and_grads(fn):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = fn(hidden, weight, labels, budget=10**9)  # one chunk
        return (loss, *torch.autograd.grad(loss, (hidden, weight)))

    torch._dynamo.reset()
    try:
        compiled, code = run_and_get_code(loss_and_grads, torch.compile(lm_loss))
    finally:
        torch._dynamo.reset()
    eager = loss_and_grads(lm_loss)
    buffers = re.findall(r"empty_strided_cpu\(\((\d+), (\d+)\), \([^)]*\), (torch\.\w+)\)", "\n".join(code))
    vocab_sized = [dtype for _, columns, dtype in buffers if int(columns) == vocab]
    assert vocab_sized == ["torch.bfloat16"], buffers
    for c, e in zip(compiled, eager):
        assert torch.allclose(c, e, rtol=1e-2, atol=1e-5)


def test_the_chunk_count_is_the_fewest_the_budget_allows_and_bounded():
    from training.gpt2.loss import DEFAULT_LOSS_BUDGET, LOSS_MEMORY_SHARE, bytes_per_logit

    v = 50304  # GPT-2's padded vocabulary
    assert bytes_per_logit(2, compiled=True) == 4 and bytes_per_logit(2, compiled=False) == 8
    # 128 MiB at 8 bytes a logit: 333 rows fit, so 2,048 rows take 7 chunks of 293
    assert loss_chunk_rows(8 * 256, v, DEFAULT_LOSS_BUDGET, 8) == 293
    assert loss_chunk_rows(100, v) == 100                            # a small batch: one chunk
    assert loss_chunk_rows(64 * 1024, v, 2**20, 4) == 64 * 1024 // 16  # at most 16 chunks
    # an H200 (141 GB) and its 512 x 256 micro-batch, compiled: two chunks; a T4's 32 x 256: one
    h200, t4 = int(150_000_000_000 * LOSS_MEMORY_SHARE), int(16 * 2**30 * LOSS_MEMORY_SHARE)
    assert loss_chunk_rows(512 * 256, v, h200, 4) == 512 * 256 // 2
    assert loss_chunk_rows(32 * 256, v, t4, 4) == 32 * 256


def test_compile_auto_means_on_cuda_only_and_the_cache_follows_the_storage(tmp_path):
    assert compile_enabled("auto", "cuda") and not compile_enabled("auto", "cpu")
    assert compile_enabled("on", "cpu") and not compile_enabled("off", "cuda")
    assert compile_enabled("auto", "cuda", (7, 5)) and compile_enabled("auto", "cuda", (9, 0))
    assert not compile_enabled("auto", "cuda", (6, 0))  # a P100: Triton has no target for it
    with pytest.raises(ValueError):
        compile_enabled("maybe", "cuda")
    assert cache_location(str(tmp_path / "run")) == ("dir", str(tmp_path / "run" / CACHE_DIR))
    assert cache_location("s3://bucket/runs/run") == ("artifacts",
                                                      "s3://bucket/runs/run/compile-cache.bin")

    from training.run_plan import compile_fact

    assert (compile_fact("auto", True), compile_fact("auto", False), compile_fact("on", False)) == \
        ("on", "off", "on")


def test_fsdp2_with_a_bf16_policy_computes_in_bf16_without_autocast(_process_group):
    """The MixedPrecisionPolicy is the only cast (no autocast in the loop under FSDP2): the
    blocks see bf16 activations and the loss still comes out fp32."""
    from training.gpt2.parallel import shard_fsdp
    from training.gpt2.precision import choose_precision

    torch.manual_seed(0)
    model = shard_fsdp(build_model(gpt2_config("tiny", VOCAB, EOT, BLOCK)),
                       choose_precision("bf16", "cpu", False))
    seen = []
    model.transformer.h[0].mlp.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    x = torch.randint(0, VOCAB, (2, BLOCK))
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    assert seen == [torch.bfloat16] and loss.dtype == torch.float32 and torch.isfinite(loss)


# --- compiled vs eager, and the cache on the run's storage (CPU: inductor's C++ backend) ----------

#: The tiny run both tests make: 2 layers, 4 x 32 tokens, AdamW, 6 steps.
RUN = r"""
import json, os, sys
import torch
from training.gpt2.compiling import CompileCache, compile_model, compile_seconds, counters
from training.gpt2.model import build_model, build_optimizer, gpt2_config

def run(compiled, steps=6, cache=None):
    torch.manual_seed(0)
    model = build_model(gpt2_config("tiny", 257, 256, 32))
    if compiled:
        if cache is not None:
            cache.open()
        compile_model(model)
    opt = build_optimizer(model, 3e-3, 0.1, (0.9, 0.95))
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, 257, (4, 32), generator=g)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if cache is not None and len(losses) == 1:
            cache.after_first_step()
    return losses

if __name__ == "__main__":
    run_dir = sys.argv[1]
    if len(sys.argv) > 2:  # an object-store run: the mega-cache through these two functions
        import training.gpt2.compiling as c
        blob = os.path.join(run_dir, "compile-cache.bin")
        c._read_object = lambda uri: open(blob, "rb").read() if os.path.exists(blob) else None
        c._write_object = lambda uri, data: open(blob, "wb").write(data)
        cache = c.CompileCache("s3://bucket/" + run_dir.strip("/"), 0)
    else:
        cache = CompileCache(run_dir, 0)
    losses = run(True, steps=2, cache=cache)
    print(json.dumps({"losses": losses, "compile_s": compile_seconds(), **counters(),
                      "loaded": cache.loaded}))
"""


def _run_compiled(run_dir, local_cache, *extra) -> dict:
    """One start in a fresh process whose own (pod-local) inductor cache is `local_cache`."""
    script = run_dir.parent / "run_compiled.py"
    script.write_text(RUN)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": str(local_cache)}
    out = subprocess.run([sys.executable, str(script), str(run_dir), *extra], env=env,
                         capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_compiled_tiny_run_follows_the_eager_loss_curve(tmp_path, monkeypatch):
    """Same seed, same batches, 6 AdamW steps: compiled and eager losses agree within 1e-4
    relative (inductor reorders float sums; measured ~1e-6 here)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    namespace: dict = {}
    exec(compile(RUN, "run_compiled", "exec"), namespace)
    torch._dynamo.reset()
    eager = namespace["run"](False)
    compiled = namespace["run"](True)
    torch._dynamo.reset()
    assert compiled == pytest.approx(eager, rel=1e-4)
    assert eager[-1] < eager[0]  # it trains (the curve is a curve)


@pytest.mark.slow
def test_the_second_start_reuses_the_mega_cache_beside_the_checkpoints(tmp_path):
    """A run in an object store: two starts (processes on new pods: their local inductor
    caches empty); the first compiles and writes compile-cache.bin beside the checkpoints,
    the second loads it and finds every graph: no inductor misses. (The time it saves, ~30 s
    -> ~3 s here, is not asserted: timing.) The directory cache of a run on a filesystem is
    proved through the entrypoint: tests/training/test_loop_ray.py."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = _run_compiled(run_dir, tmp_path / "pod-1", "object-store")
    second = _run_compiled(run_dir, tmp_path / "pod-2", "object-store")
    assert first["fxgraph_cache_miss"] > 0 and first["fxgraph_cache_hit"] == 0
    assert not first["loaded"] and second["loaded"]
    assert second["fxgraph_cache_miss"] == 0 and second["fxgraph_cache_hit"] > 0
    assert second["losses"] == first["losses"]
    assert (run_dir / "compile-cache.bin").stat().st_size > 0


# --- the compiled layouts: whole model (one GPU, DDP) and per block (FSDP2) -----------------------

class _Recorder:
    """A torch.compile backend that runs the captured graphs eagerly and counts, per graph,
    the attention calls it holds (one per GPT2Block) and how often it runs."""

    def __init__(self) -> None:
        self.graphs: list[dict] = []

    def __call__(self, gm, example_inputs):
        graph = {"attention": sum("scaled_dot_product" in str(n.target) for n in gm.graph.nodes),
                 "runs": 0}
        self.graphs.append(graph)

        def run(*args):
            graph["runs"] += 1
            return gm.forward(*args)
        return run

    def attention_calls(self) -> int:
        """Blocks that ran compiled: attention calls inside compiled graphs, all runs."""
        return sum(g["attention"] * g["runs"] for g in self.graphs)


def _twelve_layers():
    cfg = gpt2_config("tiny", VOCAB, EOT, BLOCK)
    cfg.n_layer = 12
    torch.manual_seed(0)
    return build_model(cfg)


def _micro_batches(model, steps=2, accum=3):
    """`steps` optimizer steps' forward/backward of `accum` micro-batches each."""
    for _ in range(steps * accum):
        x = torch.randint(0, VOCAB, (2, BLOCK))
        model(input_ids=x, labels=x).loss.backward()
    return steps * accum


@pytest.fixture
def _process_group(tmp_path):
    """A world of one (what FSDP2 and DDP need), with dynamo's caches fresh on both sides."""
    gloo.join(0, 1, gloo.rendezvous(tmp_path))
    torch._dynamo.reset()
    try:
        yield
    finally:
        torch._dynamo.reset()
        gloo.leave()


@pytest.mark.parametrize("layout", ["single", "ddp"])
def test_the_whole_model_and_loss_compile_as_one_region_without_recompiles(layout, _process_group):
    """One GPU and DDP: one graph holds all 12 blocks and the loss; no graph breaks; 6
    micro-batches over 2 steps compile once (any recompile raises). Under DDP the graph is
    split at DDP's bucket boundaries (DDPOptimizer), and the pieces still hold every block.
    The parameter names do not change (checkpoints stay loadable)."""
    from torch._dynamo.utils import counters
    from torch.nn.parallel import DistributedDataParallel

    from training.gpt2.compiling import compile_model

    model = _twelve_layers()
    names = [n for n, _ in model.named_parameters()]
    recorder = _Recorder()
    compile_model(model, backend=recorder)
    if layout == "ddp":
        model = DistributedDataParallel(model, bucket_cap_mb=1)  # ~10 MB of gradients: several buckets
    counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        runs = _micro_batches(model)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert sum(g["attention"] for g in recorder.graphs) == 12  # every block, compiled once
    assert recorder.attention_calls() == 12 * runs              # ... and run compiled each time
    if layout == "single":
        assert len(recorder.graphs) == 1 and counters["stats"]["unique_graphs"] == 1
        assert [n for n, _ in model.named_parameters()] == names
    else:
        assert len(recorder.graphs) > 1  # DDPOptimizer's split: all-reduces overlap backward
        assert [n.removeprefix("module.") for n, _ in model.named_parameters()] == names


def test_fsdp2_compiles_each_block_and_the_loss_without_recompiles(_process_group):
    """FSDP2: every GPT2Block compiled (one shared graph, run 12 times a micro-batch), the loss
    in a graph of its own, FSDP2's hooks outside the graphs; no recompiles, no graph breaks."""
    from torch._dynamo.utils import counters

    from training.gpt2.compiling import compile_model
    from training.gpt2.parallel import shard_fsdp
    from training.gpt2.precision import choose_precision

    model = _twelve_layers()
    names = [n for n, _ in model.named_parameters()]
    recorder = _Recorder()
    compile_model(model, per_block=True, backend=recorder)
    model = shard_fsdp(model, choose_precision("bf16", "cpu", False))
    counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        runs = _micro_batches(model)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert sorted(g["attention"] for g in recorder.graphs) == [0, 1]  # the loss, one block
    assert recorder.attention_calls() == 12 * runs
    assert [n for n, _ in model.named_parameters()] == names
