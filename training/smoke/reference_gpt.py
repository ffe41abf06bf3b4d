"""A nanoGPT-style GPT-2, written here as the yardstick for the project's own step.

The GPU smoke run (training.gpu_smoke) times one optimizer step of this model beside the
project's (`training.smoke.step`): same card, same micro-batch, same tokens per step. It is
nanoGPT's `model.py` architecture, as an engineer coming from nanoGPT would write the baseline:
- tied `wte` / `lm_head` weights, biases in every Linear and LayerNorm;
- attention through `F.scaled_dot_product_attention(is_causal=True)` (flash/efficient kernels);
- the MLP's GELU in its tanh form (GPT-2's `gelu_new`), one fused kernel;
- the vocabulary padded to 50,304 (a multiple of 64) for tensor-core shapes;
- GPT-2's init: N(0, 0.02), the residual projections `c_proj` scaled by 1/sqrt(2 n_layer),
  zero biases;
- the loss: plain `F.cross_entropy` on the (bf16, under autocast) logits of the whole
  micro-batch, next-token targets;
- trained with `torch.compile` of the whole model and fused AdamW (decay on the matrices only),
  gradient clipping at 1.0 (training.smoke.step does the step).
It lives in `training/` (not `benchmarks/`) because the smoke run must import it from an
installed package.
"""

from __future__ import annotations

import math
from typing import Any

#: nanoGPT's padded GPT-2 vocabulary (50,257 rounded up to a multiple of 64).
REFERENCE_VOCAB = 50_304


def build_reference(vocab: int, block: int, n_layer: int = 12, n_head: int = 12,
                    n_embd: int = 768) -> Any:
    """The model (an nn.Module): `model(idx, targets)` is the mean next-token loss."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class CausalSelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn = nn.Linear(n_embd, 3 * n_embd)
            self.c_proj = nn.Linear(n_embd, n_embd)

        def forward(self, x: Any) -> Any:
            B, T, C = x.shape
            q, k, v = self.c_attn(x).split(n_embd, dim=2)
            q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_fc = nn.Linear(n_embd, 4 * n_embd)
            self.c_proj = nn.Linear(4 * n_embd, n_embd)

        def forward(self, x: Any) -> Any:
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(n_embd), CausalSelfAttention()
            self.ln_2, self.mlp = nn.LayerNorm(n_embd), MLP()

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block, n_embd)
            self.h = nn.ModuleList(Block() for _ in range(n_layer))
            self.ln_f = nn.LayerNorm(n_embd)
            self.lm_head = nn.Linear(n_embd, vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied

        def forward(self, idx: Any, targets: Any) -> Any:
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.h:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)

    model = GPT()
    for name, p in model.named_parameters():  # nanoGPT's init
        if name.endswith("bias"):
            torch.nn.init.zeros_(p)
        elif p.dim() >= 2:
            residual = name.endswith("c_proj.weight")
            torch.nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer) if residual else 0.02)
    return model


def reference_optimizer(model: Any, lr: float, weight_decay: float,
                        betas: tuple[float, float], fused: bool) -> Any:
    """nanoGPT's `configure_optimizers`: AdamW, decay on the >= 2-D parameters only."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused or None)


def next_token_targets(idx: Any) -> Any:
    """Targets for `idx` (B, T): the next token, -1 (ignored) after the last, as the project's
    loss shifts its labels (both models then count the same B x (T - 1) tokens)."""
    import torch

    return torch.nn.functional.pad(idx[:, 1:], (0, 1), value=-1)
