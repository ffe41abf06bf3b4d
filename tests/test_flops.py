"""One MFU (issue 24 item 4): the trackers and the scaling model count FLOPs with
submitter.contract.flops (the GPU smoke run calls the same `flops_per_token` and `mfu`), and
the count sits where its docstring says against nanoGPT's and llm.c's formulas."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from submitter.contract.flops import flops_per_token, gpt2_parameters, mfu, peak_for, preset_flops_per_token
from tests.conftest import ROOT

N = gpt2_parameters(50304, 256)  # gpt2-small, padded vocab, block 256


def test_the_count_against_nanogpt_and_llm_c():
    ours = flops_per_token(N, 12, 768, 256)
    nanogpt = 6 * (N - 256 * 768) + 12 * 12 * 768 * 256  # estimate_mfu: N without wpe
    llm_c = 6 * N + 6 * 12 * 768 * 256                   # gpt2_estimate_mfu
    assert ours == pytest.approx(nanogpt, rel=0.002)
    assert ours / llm_c == pytest.approx(1.019, abs=0.001)
    assert flops_per_token(N, 12, 768, 1024) / (6 * N + 6 * 12 * 768 * 1024) == pytest.approx(1.070, abs=0.001)
    assert preset_flops_per_token("gpt2-small", N, 256) == ours
    assert preset_flops_per_token("gpt-j", N, 256) is None  # unknown shapes: no MFU


def test_the_trackers_mfu_is_the_contracts():
    from training.events.trackers import points_of

    facts = {"model": "gpt2-small", "params": N, "block_size": 256, "gpu": "NVIDIA H100 80GB HBM3"}
    [(step, values)] = points_of({"type": "progress", "step": 7, "tokens_per_sec": 800_000.0},
                                 facts, world_size=2)
    expected = mfu(400_000.0, flops_per_token(N, 12, 768, 256), peak_for(facts["gpu"]).tflops)
    assert step == 7 and values["train/mfu"] == pytest.approx(expected)
    [(_, without)] = points_of({"type": "progress", "step": 7, "tokens_per_sec": 800_000.0},
                               {**facts, "block_size": None}, world_size=2)
    assert "train/mfu" not in without  # a figure it cannot count is left out, not guessed


def test_the_scaling_model_counts_the_same_flops():
    spec = importlib.util.spec_from_file_location("scaling_model", ROOT / "benchmarks" / "scaling_model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["scaling_model"] = module
    spec.loader.exec_module(module)
    s = module.Settings()
    assert s.per_token == flops_per_token(s.params, s.n_layer, s.n_embd, s.block)
