"""GPT-2's training loss: next-token cross-entropy through the LM head, fused the way
fused linear-cross-entropy kernels are: the forward pass also computes the gradients.

Per chunk of token rows: the logits `h @ W^T` in the compute dtype (bf16 under autocast), the
logsumexp and softmax computed in fp32 whatever the logits' dtype, the chunk's loss
(`lse - logit[target]`), then `g = softmax - one_hot` cast once to the compute dtype, and the
two matmuls of the backward:
`g @ W` for the hidden states and `g^T @ h` for the LM-head weight, both in bf16 on the tensor
cores with fp32 accumulation (cuBLAS's), the chunks' weight gradients summed in fp32. The
backward pass only scales the stored gradients (by the loss scale under fp16, by 1/tokens).

Memory: only one chunk's logits and its `g` exist at a time, and nothing vocabulary-sized is
kept for the backward (the plain loss keeps the logits from the forward until the backward).
Eager, a chunk costs 2 + 4 + 2 bytes a logit (bf16 logits, one fp32 buffer that becomes the
softmax in place, bf16 `g`);
compiled (whole-model compile traces this function into the model's graph), inductor fuses the
log-softmax into the kernels that read the logits and write `g`: 2 + 2 bytes a logit, no fp32
vocabulary-sized tensor at all. The chunk count is the fewest that fit the loss's memory budget
(`loss_budget_bytes`: an eighth of the card; one chunk for a T4's micro-batch, two for an
H100's or H200's default micro-batch of gpt2-small), at most MAX_LOSS_CHUNKS.

Before issue 24 each chunk also made three fp32 copies of `g` and computed the weight gradient
as an fp32 matmul (TF32 at best); benchmarks/bench_compute.py counts bytes and FLOPs of both.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import torch

#: The loss's memory budget where the card is unknown (CPU, meta): 128 MiB of chunk buffers.
DEFAULT_LOSS_BUDGET = 2**27
#: The share of a GPU's memory the loss's transient buffers may use (see the module docstring;
#: the batch rule, submitter.contract.batch, reserves 6 bytes a logit per token for the loss).
LOSS_MEMORY_SHARE = 1 / 8
#: The most chunks a micro-batch is cut into (a compiled loss unrolls them; beyond it, chunks grow).
MAX_LOSS_CHUNKS = 16
IGNORE_INDEX = -100


def bytes_per_logit(itemsize: int, compiled: bool) -> int:
    """Transient bytes one logit of a chunk costs: the logits and `g` in the compute dtype,
    plus the fp32 softmax buffer when eager (compiled, it is fused away)."""
    return 2 * itemsize + (0 if compiled else 4)


def loss_chunk_rows(rows: int, vocab: int, budget: int = DEFAULT_LOSS_BUDGET,
                    per_logit: int = 4, max_chunks: int = MAX_LOSS_CHUNKS) -> int:
    """Token rows per loss chunk: the fewest chunks whose buffers (`per_logit` bytes a logit)
    fit `budget`, but no more than `max_chunks` chunks in all; equal-sized chunks."""
    by_memory = max(1, budget // (vocab * per_logit))
    chunks = min(max_chunks, -(-rows // by_memory))
    return -(-rows // chunks)


def loss_budget_bytes(device: Any = None) -> int:
    """The loss's memory budget on `device` (None: the current CUDA device, if any): a share
    of a GPU's total memory (total, not free: every process sharing a card gets the same
    answer, so every rank cuts the same chunks), else DEFAULT_LOSS_BUDGET."""
    device = torch.device(device) if device is not None else None
    if device is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    if device is None or device.type != "cuda":
        return DEFAULT_LOSS_BUDGET
    return int(torch.cuda.get_device_properties(device).total_memory * LOSS_MEMORY_SHARE)


def _chunk_loss_and_grads(hidden, weight, targets, chunk: int, want_grad: bool):
    """Sum of token losses over `hidden` (N, d) x `weight` (V, d), both in the compute dtype,
    against `targets` (N), chunk by chunk; with `want_grad`, d(sum)/d hidden in the compute
    dtype and d(sum)/d weight (the compute dtype for one chunk; summed in fp32 over several)."""
    acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32 (fp64 stays fp64)
    total = hidden.new_zeros((), dtype=acc)
    grad_h, grad_w = [], None
    for start in range(0, hidden.shape[0], chunk):
        h, t = hidden[start:start + chunk], targets[start:start + chunk]
        valid = t != IGNORE_INDEX
        safe = torch.where(valid, t, 0)[:, None]
        loss, g = _chunk_loss(h @ weight.t(), safe, valid, acc, want_grad)
        total = total + loss
        if want_grad:
            grad_h.append(g @ weight)
            gw = g.t() @ h                        # (V, d): fp32 accumulation inside the matmul
            grad_w = gw if grad_w is None else grad_w.to(acc).add_(gw)
    if not want_grad:
        return total, None, None
    return total, grad_h[0] if len(grad_h) == 1 else torch.cat(grad_h), grad_w


def _chunk_loss(logits, safe, valid, acc, want_grad: bool):
    """One chunk: the sum of its token losses (lse - logit[target], fp32 math) and, with
    `want_grad`, `g` = softmax - one_hot(target) in the logits' dtype, ignored rows zeroed.

    Compiled: pure expressions of the logits (the one-hot as a column-index compare), which
    inductor fuses into the kernels that read the logits and write `g` (in the logits' own
    buffer where it can): nothing vocabulary-sized in fp32. Eager: one fp32 buffer, turned
    into the softmax in place (a log-softmax with `dtype=float32` would make two: the upcast
    and its output)."""
    dtype = logits.dtype
    picked = logits.gather(1, safe)[:, 0].to(acc)
    if torch.compiler.is_compiling():
        logp = torch.log_softmax(logits, dim=-1, dtype=acc)
        lse = picked - logp.gather(1, safe)[:, 0]
        g = None
        if want_grad:
            cols = torch.arange(logits.shape[1], device=logits.device)
            g = torch.where(valid[:, None], torch.exp(logp) - (cols == safe).to(acc), 0.0)
    else:
        x = logits.to(acc)
        del logits  # the only vocabulary-sized buffer left is x
        top = x.amax(dim=-1, keepdim=True)
        x.sub_(top).exp_()                     # exp(z - max), fp32
        sums = x.sum(dim=-1, keepdim=True)
        lse = (top + sums.log())[:, 0]
        g = None
        if want_grad:  # in place: the softmax (ignored rows zeroed), then - one_hot(target)
            g = x.mul_(valid[:, None] / sums)
            g.scatter_add_(1, safe, -valid[:, None].to(acc))
    loss = torch.where(valid, lse - picked, 0.0).sum()
    return loss, (None if g is None else g.to(dtype))


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """The mean loss; its gradients are computed in the forward pass, chunk by chunk, and
    only scaled in the backward (see the module docstring). `hidden` and `weight` come in
    their own dtypes (fp32 master weights under autocast) and are cast to `dtype` here, so the
    weight's gradient goes back in fp32 without a round trip through bf16."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, count, chunk, dtype):
        total, grad_h, grad_w = _chunk_loss_and_grads(
            hidden.to(dtype), weight.to(dtype), targets, chunk, True)
        ctx.save_for_backward(grad_h, grad_w, count)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return total / count

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, count = ctx.saved_tensors
        scale = grad_out.to(count.dtype) / count  # fp32: a 0-dim factor, exact in the products
        return ((grad_h * scale).to(ctx.dtypes[0]), (grad_w * scale).to(ctx.dtypes[1]),
                None, None, None, None)


def lm_loss(hidden, weight, labels, chunk: Optional[int] = None, budget: Optional[int] = None):
    """Mean next-token cross-entropy of `hidden` (B, T, d) through the LM head `weight` (V, d)
    against `labels` (B, T) (shifted here, as Hugging Face's `ForCausalLM` loss shifts them;
    -100 ignored), chunked (see the module docstring): `chunk` rows a chunk, else as few chunks
    as `budget` bytes allow (None: DEFAULT_LOSS_BUDGET). Under autocast the logits are computed
    in its dtype; otherwise in `hidden`'s (FSDP2's param dtype). (Meta tensors, which have no
    autocast, let benchmarks/bench_compute.py size the loss for gpt2-small for free.)"""
    device_type = hidden.device.type
    autocast = device_type != "meta" and torch.is_autocast_enabled(device_type)
    dtype = torch.get_autocast_dtype(device_type) if autocast else hidden.dtype
    targets = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX).reshape(-1)
    with torch.autocast(device_type, enabled=False) if autocast else contextlib.nullcontext():
        h = hidden.reshape(-1, hidden.shape[-1])
        if chunk is None:
            per_logit = bytes_per_logit(dtype.itemsize, torch.compiler.is_compiling())
            chunk = loss_chunk_rows(h.shape[0], weight.shape[0],
                                    DEFAULT_LOSS_BUDGET if budget is None else budget, per_logit)
        count = (targets != IGNORE_INDEX).sum().clamp(min=1).to(torch.promote_types(dtype, torch.float32))
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
            return ChunkedLinearCrossEntropy.apply(h, weight, targets, count, chunk, dtype)
        total, _, _ = _chunk_loss_and_grads(h.to(dtype), weight.to(dtype), targets, chunk, False)
        return total / count
