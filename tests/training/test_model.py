"""Model presets: GPT-2 small is the tutorial's 123.8M parameters; tiny follows the tokenizer."""

from __future__ import annotations

import pytest
import torch

from training.gpt2.model import (PRESETS, build_model, build_optimizer, count_parameters, decays,
                            expected_parameters, gpt2_config, padded_vocab, unpad_state_dict)


def _meta_model(preset: str, vocab: int, eot: int, block: int | None = None):
    with torch.device("meta"):  # no memory, no init time
        return build_model(gpt2_config(preset, vocab, eot, block))


def test_gpt2_small_has_123_8m_parameters():
    model = _meta_model("gpt2-small", 50257, 50256)
    n = count_parameters(model)
    assert abs(n - 123.8e6) <= 0.1e6, n
    cfg = model.config
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.n_positions) == (12, 12, 768, 256)
    # the embedding is padded to a multiple of 64; the tokenizer's size is kept for export
    assert (cfg.vocab_size, cfg.tokenizer_vocab_size) == (50304, 50257)
    assert n == expected_parameters("gpt2-small", 50257)


def test_padding_and_unpadding_the_vocabulary():
    assert [padded_vocab(n) for n in (1, 64, 65, 257, 50257)] == [64, 64, 128, 320, 50304]
    model = build_model(gpt2_config("tiny", 257, 256, 16))
    sd = unpad_state_dict(model.state_dict(), model.config.tokenizer_vocab_size)
    assert sd["transformer.wte.weight"].shape[0] == 257 == sd["lm_head.weight"].shape[0]
    assert sd["transformer.wpe.weight"].shape == model.transformer.wpe.weight.shape


@pytest.mark.parametrize("vocab, eot", [(257, 256), (50257, 50256)])
def test_tiny_takes_the_tokenizers_vocabulary(vocab, eot):
    model = _meta_model("tiny", vocab, eot, 64)
    assert model.config.tokenizer_vocab_size == vocab and model.config.eos_token_id == eot
    assert model.config.vocab_size == padded_vocab(vocab)
    assert count_parameters(model) == expected_parameters("tiny", vocab, 64)


def test_a_tokenizer_larger_than_the_preset_is_refused():
    with pytest.raises(ValueError):
        gpt2_config("gpt2-small", 60000, 59999)


def test_weight_decay_spares_biases_layernorms_and_embeddings():
    model = build_model(gpt2_config("tiny", 257, 256, 32))
    decay, no_decay = build_optimizer(model, 1e-3, 0.1, (0.9, 0.95)).param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"])  # only the attention/MLP matrices
    assert {"transformer.wte.weight", "transformer.wpe.weight"} <= set(no_decay["names"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert len(decay["params"]) == 4 * model.config.n_layer


@pytest.mark.parametrize("name, expected", [
    ("transformer.h.3.attn.c_attn.weight", True),
    ("module.transformer.h.3.mlp.c_proj.weight", True),
    ("_fsdp_wrapped_module.transformer.h.0._fsdp_wrapped_module.mlp.c_fc.weight", True),
    ("transformer.h.3.attn.c_attn.bias", False),
    ("module.transformer.h.0.ln_1.weight", False),
    ("transformer.ln_f.weight", False),
    ("transformer.wte.weight", False),
    ("_orig_mod.transformer.wpe.weight", False),
])
def test_decay_is_decided_by_name_whatever_the_wrapper(name, expected):
    assert decays(name) is expected


def test_presets_are_the_models_jobspec_accepts():
    from submitter.contract.spec import MODELS

    assert set(PRESETS) == set(MODELS)
