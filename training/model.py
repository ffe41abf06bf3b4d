"""GPT-2 presets and the model/optimizer/schedule built from them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional


#: AdamW betas (GPT-2/3's) and where the cosine schedule ends (a fraction of the peak LR).
BETAS = (0.9, 0.95)
MIN_LR_RATIO = 0.1


@dataclass(frozen=True)
class Preset:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: Optional[int]  # None: the tokenizer's vocabulary


PRESETS = {
    # GPT-2 small as the tutorial builds it: 123.8M parameters (tied embeddings).
    "gpt2-small": Preset(n_layer=12, n_head=12, n_embd=768, block_size=256, vocab_size=50257),
    # Small enough to train visibly on 2 CPU cores in a minute.
    "tiny": Preset(n_layer=2, n_head=4, n_embd=128, block_size=128, vocab_size=None),
}


def gpt2_config(preset_name: str, vocab_size: int, eot_id: int, block_size: Optional[int] = None):
    """A transformers GPT2Config for a preset; the tokenizer decides the vocab for `tiny`."""
    from transformers import GPT2Config

    p = PRESETS[preset_name]
    vocab = p.vocab_size or vocab_size
    if vocab < vocab_size:
        raise ValueError(f"model {preset_name} has {vocab} token ids, the tokenizer needs {vocab_size}")
    block = block_size or p.block_size
    return GPT2Config(vocab_size=vocab, n_positions=block, n_embd=p.n_embd, n_layer=p.n_layer,
                      n_head=p.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      bos_token_id=eot_id, eos_token_id=eot_id,
                      use_cache=False)  # training never decodes: no KV cache to fill each step


def build_model(config):
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    return model


def expected_parameters(preset_name: str, vocab_size: int, block_size: Optional[int] = None) -> int:
    """Parameters of a preset without building it (the driver need not import transformers):
    embeddings + per block (2 LayerNorms, attention 4d^2, MLP 8d^2 and biases) + final LN."""
    p = PRESETS[preset_name]
    d, vocab, block = p.n_embd, p.vocab_size or vocab_size, block_size or p.block_size
    return vocab * d + block * d + p.n_layer * (12 * d * d + 13 * d) + 2 * d


def count_parameters(model) -> int:
    """Unique parameters (the tied wte/lm_head weight counts once)."""
    return sum(p.numel() for p in model.parameters())


def build_optimizer(model, learning_rate: float, weight_decay: float, betas: tuple[float, float]):
    """AdamW; decay only on >=2-D weights (matrices, embeddings), as GPT-2/nanoGPT do."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine down to min_ratio at `total` (and flat after)."""
    if step < warmup:
        return (step + 1) / warmup
    if step >= total:
        return min_ratio
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + 0.5 * (1.0 - min_ratio) * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer, warmup: int, total: int, min_ratio: float):
    import torch

    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup, total, min_ratio))
