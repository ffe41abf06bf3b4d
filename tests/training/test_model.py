"""Model presets: GPT-2 small is the tutorial's 123.8M parameters; tiny follows the tokenizer."""

from __future__ import annotations

import pytest
import torch

from training.model import (PRESETS, build_model, build_optimizer, count_parameters,
                            expected_parameters, gpt2_config)


def _meta_model(preset: str, vocab: int, eot: int, block: int | None = None):
    with torch.device("meta"):  # no memory, no init time
        return build_model(gpt2_config(preset, vocab, eot, block))


def test_gpt2_small_has_123_8m_parameters():
    model = _meta_model("gpt2-small", 50257, 50256)
    n = count_parameters(model)
    assert abs(n - 123.8e6) <= 0.1e6, n
    cfg = model.config
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.n_positions) == (
        12, 12, 768, 50257, 256)
    assert n == expected_parameters("gpt2-small", 50257)


@pytest.mark.parametrize("vocab, eot", [(257, 256), (50257, 50256)])
def test_tiny_takes_the_tokenizers_vocabulary(vocab, eot):
    model = _meta_model("tiny", vocab, eot, 64)
    assert model.config.vocab_size == vocab and model.config.eos_token_id == eot
    assert count_parameters(model) == expected_parameters("tiny", vocab, 64)


def test_a_tokenizer_larger_than_the_preset_is_refused():
    with pytest.raises(ValueError):
        gpt2_config("gpt2-small", 60000, 59999)


def test_weight_decay_spares_biases_and_layernorms():
    model = build_model(gpt2_config("tiny", 257, 256, 32))
    decay, no_decay = build_optimizer(model, 1e-3, 0.1, (0.9, 0.95)).param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_presets_are_the_models_jobspec_accepts():
    from submitter.contract.spec import MODELS

    assert set(PRESETS) == set(MODELS)
