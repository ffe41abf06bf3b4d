"""GPT-2 presets and the model/optimizer/schedule built from them.

Vocabulary padding: the embedding (and the tied LM head) has `padded_vocab(n)` rows, a multiple
of 64 (50,257 -> 50,304 for GPT-2): the LM-head matmul then runs on tensor-core friendly shapes.
The padded ids never occur in the data; their logits are learned down like any unused token.
The tokenizer's own size is kept in the config as `tokenizer_vocab_size`; an exported model must
drop the extra rows: `unpad_state_dict(sd, config.tokenizer_vocab_size)` and
`vocab_size=tokenizer_vocab_size` in the exported config (`lm_head` is tied to `wte`).

Weight decay (one rule for DDP and FSDP, by parameter NAME, never by shape: FSDP may flatten or
shard a parameter so its `dim()` says nothing): decay on the Linear/Conv1D weight matrices of
attention and MLP; no decay on biases, LayerNorm weights, and the embeddings `wte`/`wpe`
(as in most GPT reproductions after nanoGPT's first version: decaying the token embedding,
which is also the tied output layer, pulls rare tokens' rows to zero).

GELU: `gelu_pytorch_tanh`, the same tanh approximation as GPT-2's `gelu_new` but one fused
kernel (`F.gelu(approximate="tanh")`) instead of a chain of Python-level ops whose `pow` CUDA
autocast runs in fp32 over the whole tokens x 3072 activation.

Loss: `training.gpt2.loss.lm_loss`, a fused linear cross-entropy (bf16 matmuls, fp32 softmax, its
gradients computed in the forward, chunk by chunk) that never holds the micro-batch's fp32
logits (`model(input_ids=x, labels=x).loss`, see `model_class`).
"""

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


#: The embedding's rows are padded to a multiple of this.
VOCAB_MULTIPLE = 64


def padded_vocab(n: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """The smallest multiple of `multiple` that holds n token ids."""
    return -(-n // multiple) * multiple


def gpt2_config(preset_name: str, vocab_size: int, eot_id: int, block_size: Optional[int] = None):
    """A transformers GPT2Config for a preset; the tokenizer decides the vocab for `tiny`.
    The model's vocab is padded (see the module docstring); `tokenizer_vocab_size` keeps the
    real one."""
    from transformers import GPT2Config

    p = PRESETS[preset_name]
    vocab = p.vocab_size or vocab_size
    if vocab < vocab_size:
        raise ValueError(f"model {preset_name} has {vocab} token ids, the tokenizer needs {vocab_size}")
    block = block_size or p.block_size
    return GPT2Config(vocab_size=padded_vocab(vocab), tokenizer_vocab_size=vocab,
                      activation_function=GELU,
                      n_positions=block, n_embd=p.n_embd, n_layer=p.n_layer,
                      n_head=p.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      bos_token_id=eot_id, eos_token_id=eot_id,
                      use_cache=False)  # training never decodes: no KV cache to fill each step


#: GPT-2's `gelu_new` as one kernel (the same tanh approximation; see the module docstring).
GELU = "gelu_pytorch_tanh"
_MODEL_CLASS: list = []


def model_class():
    """`GPT2Pretraining`: GPT2LMHeadModel whose `model(input_ids=x, labels=x).loss` is
    `lm_loss` (the same module tree, parameter names and state dict: export loads its weights
    into a plain GPT2LMHeadModel). Built on first use: importing this module needs no torch."""
    if _MODEL_CLASS:
        return _MODEL_CLASS[0]
    from transformers import GPT2LMHeadModel
    from transformers.modeling_outputs import CausalLMOutputWithCrossAttentions

    import torch

    from training.gpt2.loss import lm_loss, loss_budget_bytes

    class GPT2Pretraining(GPT2LMHeadModel):
        #: the loss function; training.gpt2.compiling swaps in a compiled one for per-block compile
        loss_fn = staticmethod(lm_loss)
        #: bytes the loss's chunk buffers may use (training.gpt2.loss.loss_budget_bytes); None: not
        #: decided yet (set on the first eager CUDA call, or by training.gpt2.compiling before tracing)
        loss_budget = None

        def forward(self, input_ids=None, labels=None, **kwargs):
            if labels is None or kwargs:
                return super().forward(input_ids=input_ids, labels=labels, **kwargs)
            hidden = self.transformer(input_ids).last_hidden_state
            if self.loss_budget is None and hidden.is_cuda and not torch.compiler.is_compiling():
                self.loss_budget = loss_budget_bytes(hidden.device)
            return CausalLMOutputWithCrossAttentions(
                loss=self.loss_fn(hidden, self.lm_head.weight, labels, budget=self.loss_budget))

    _MODEL_CLASS.append(GPT2Pretraining)
    return GPT2Pretraining


def build_model(config):
    """GPT-2 for pre-training (`model_class`)."""
    model = model_class()(config)
    model.loss_type = "ForCausalLM"
    return model


def expected_parameters(preset_name: str, vocab_size: int, block_size: Optional[int] = None) -> int:
    """Parameters of a preset without building it (the driver need not import transformers):
    embeddings + per block (2 LayerNorms, attention 4d^2, MLP 8d^2 and biases) + final LN."""
    p = PRESETS[preset_name]
    d, block = p.n_embd, block_size or p.block_size
    vocab = padded_vocab(p.vocab_size or vocab_size)
    return vocab * d + block * d + p.n_layer * (12 * d * d + 13 * d) + 2 * d


def count_parameters(model) -> int:
    """Unique parameters (the tied wte/lm_head weight counts once)."""
    return sum(p.numel() for p in model.parameters())


def unpad_state_dict(state_dict: dict, vocab_size: int) -> dict:
    """A (full, unwrapped) model state dict with the embedding/LM head cut to the tokenizer's
    `vocab_size` rows: what an exported model (50,257 logits for GPT-2) must hold."""
    out = dict(state_dict)
    for key in ("transformer.wte.weight", "lm_head.weight"):
        if key in out:
            out[key] = out[key][:vocab_size]
    return out


#: Name parts of parameters that get no weight decay (see the module docstring).
_NO_DECAY_PARTS = ("bias", "ln_1", "ln_2", "ln_f", "wte", "wpe")


def canonical_name(name: str) -> str:
    """A parameter's name without the wrappers' prefixes (DDP `module.`, FSDP1/compile
    `_fsdp_wrapped_module.`, `_orig_mod.`, activation checkpointing), the same for every
    parallel strategy."""
    for junk in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(junk, "")
    return name.removeprefix("module.")


def decays(name: str) -> bool:
    """True when the parameter called `name` gets weight decay (weight matrices only)."""
    parts = canonical_name(name).split(".")
    return not any(p in _NO_DECAY_PARTS for p in parts)


def param_groups(named_parameters, weight_decay: float) -> list[dict]:
    """AdamW groups by name: [decayed matrices, everything else]. Each group also lists the
    canonical names (`names`), which the tests compare across DDP and FSDP."""
    decay, rest = ([], []), ([], [])
    for name, p in named_parameters:
        if not p.requires_grad:
            continue
        target = decay if decays(name) else rest
        target[0].append(p)
        target[1].append(canonical_name(name))
    return [{"params": decay[0], "names": decay[1], "weight_decay": weight_decay},
            {"params": rest[0], "names": rest[1], "weight_decay": 0.0}]


def build_optimizer(model, learning_rate: float, weight_decay: float, betas: tuple[float, float],
                    fused: Optional[bool] = None):
    """AdamW over `param_groups` (by name). `fused`: one kernel per step for all parameters;
    the default uses it when the parameters live on CUDA."""
    import torch

    groups = param_groups(model.named_parameters(), weight_decay)
    if fused is None:
        fused = all(p.is_cuda for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=bool(fused) or None)


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
