"""GPT-2's training loss: next-token cross-entropy that never holds the whole micro-batch's
fp32 logits.

For gpt2-small a micro-batch of 8 x 256 tokens has 8 x 256 x 50,304 logits: 412 MB in fp32,
and as much again for their gradient, where the plain loss (`logits.float()` then
`cross_entropy`) keeps both alive until the backward pass. Here the tokens are cut into
chunks (`loss_chunk_rows`); each chunk's logits are computed in the compute dtype, upcast to
fp32 locally for a stable log-softmax, and the chunk's gradients for the hidden states and the
LM head are computed right there (the forward pass does the backward's work, as fused
linear-cross-entropy kernels do), so at most one chunk's logits exist at a time. The backward
only scales the stored gradients (by the loss scale under fp16, by 1/tokens). torch.compile
traces the autograd.Function whole (training.compiling compiles this function).
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

#: fp32 logit elements one loss chunk may hold (2**25: 128 MiB, 667 GPT-2 tokens), and the most
#: chunks a micro-batch is cut into (a compiled loss unrolls them; beyond it, chunks grow).
LOSS_CHUNK_ELEMENTS = 2**25
MAX_LOSS_CHUNKS = 16
IGNORE_INDEX = -100


def loss_chunk_rows(rows: int, vocab: int, max_elements: int = LOSS_CHUNK_ELEMENTS,
                    max_chunks: int = MAX_LOSS_CHUNKS) -> int:
    """Token rows per loss chunk: as many as `max_elements` fp32 logits allow, but no more
    than `max_chunks` chunks in all."""
    by_memory = max(1, max_elements // vocab)
    return min(rows, max(by_memory, -(-rows // max_chunks)))


def _chunk_loss_and_grads(hidden, weight, targets, chunk: int, want_grad: bool):
    """Sum of token losses over `hidden` (N, d) x `weight` (V, d) against `targets` (N),
    chunk by chunk; with `want_grad`, d(sum)/d hidden and d(sum)/d weight, in fp32 (fp64 for fp64 inputs)."""
    acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32 (fp64 stays fp64)
    total = hidden.new_zeros((), dtype=acc)
    grad_h, grad_w = [], None
    for start in range(0, hidden.shape[0], chunk):
        h, t = hidden[start:start + chunk], targets[start:start + chunk]
        logits = (h @ weight.t()).to(acc)  # (chunk, V): the only logits alive, fp32 here only
        valid = t != IGNORE_INDEX
        safe = torch.where(valid, t, 0)
        lse = torch.logsumexp(logits, dim=-1)
        picked = logits.gather(1, safe[:, None])[:, 0]
        total = total + torch.where(valid, lse - picked, 0.0).sum()
        if want_grad:
            g = torch.exp(logits - lse[:, None])  # softmax - one_hot(target), rows of ignored
            g = g.scatter_add(1, safe[:, None], torch.full_like(lse[:, None], -1.0))
            g = (g * valid[:, None]).to(h.dtype)  # targets zeroed
            grad_h.append((g @ weight).to(acc))
            gw = g.t().to(acc) @ h.to(acc)
            grad_w = gw if grad_w is None else grad_w + gw
    return total, (torch.cat(grad_h) if want_grad else None), grad_w


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """The mean loss; its gradients are computed in the forward pass, chunk by chunk, and
    only scaled in the backward (see the module docstring)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, count, chunk):
        total, grad_h, grad_w = _chunk_loss_and_grads(hidden, weight, targets, chunk, True)
        ctx.save_for_backward(grad_h, grad_w, count)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return total / count

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, count = ctx.saved_tensors
        scale = grad_out.to(grad_h.dtype) / count.to(grad_h.dtype)
        return ((grad_h * scale).to(ctx.dtypes[0]), (grad_w * scale).to(ctx.dtypes[1]),
                None, None, None)


def lm_loss(hidden, weight, labels, chunk: Optional[int] = None):
    """Mean next-token cross-entropy of `hidden` (B, T, d) through the LM head `weight` (V, d)
    against `labels` (B, T) (shifted here, as Hugging Face's `ForCausalLM` loss shifts them;
    -100 ignored), chunked (see the module docstring). Under autocast the logits are computed
    in its dtype; otherwise in `hidden`'s (FSDP2's param dtype). (Meta tensors, which have
    no autocast, let benchmarks/bench_compute.py size the loss for gpt2-small for free.)"""
    device_type = hidden.device.type
    autocast = device_type != "meta" and torch.is_autocast_enabled(device_type)
    dtype = torch.get_autocast_dtype(device_type) if autocast else hidden.dtype
    targets = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX).reshape(-1)
    with torch.autocast(device_type, enabled=False) if autocast else contextlib.nullcontext():
        h = hidden.reshape(-1, hidden.shape[-1]).to(dtype)
        w = weight.to(dtype)
        rows = loss_chunk_rows(h.shape[0], w.shape[0]) if chunk is None else chunk
        count = (targets != IGNORE_INDEX).sum().clamp(min=1).float()
        if torch.is_grad_enabled() and (h.requires_grad or w.requires_grad):
            return ChunkedLinearCrossEntropy.apply(h, w, targets, count, rows)
        total, _, _ = _chunk_loss_and_grads(h, w, targets, rows, False)
        return total / count
