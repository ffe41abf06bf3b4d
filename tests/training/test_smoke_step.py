"""The smoke run's in-process cases on CPU, tiny shapes (#28 item 1): the nanoGPT-style
reference and the project's own step count the same tokens at the same batch and really
train; the 2-process DDP case keeps its ranks' weights equal."""

from __future__ import annotations

import subprocess
import sys

import pytest

from training.smoke import step as smoke_step


def _args(case: str, **kw) -> object:
    argv = ["--case", case, "--micro", "2", "--accum", "4", "--steps", "2", "--warmup", "1",
            "--compile", "off", "--cpu"]
    for k, v in kw.items():
        argv += [f"--{k}", str(v)]
    return smoke_step.parse_args(argv)


@pytest.mark.parametrize("case", ["reference", "step"])
def test_a_case_times_the_plans_batch_at_the_same_shapes(case):
    out = smoke_step.run_steps(case, _args(case))
    assert (out["micro"], out["accum"], out["world"]) == (2, 4, 1)
    assert out["tokens_per_step"] == 2 * 128 * 4  # micro x block x micro-batches
    assert out["tokens_per_s"] == pytest.approx(out["tokens_per_step"] / out["step_s"], rel=1e-3)
    assert (out["n_layer"], out["n_embd"], out["block"], out["vocab"]) == (2, 128, 128, 320)
    assert out["parallel"] == "single" and out["precision"] == "fp32" and out["peak_mem_gib"] > 0
    assert 4.0 < out["loss"] < 7.0  # ~ln(257) at init: a real next-token loss on random ids


def test_both_models_have_the_same_parameters_and_the_reference_is_nanogpts():
    import torch

    from training.smoke.reference_gpt import build_reference, next_token_targets

    ref = smoke_step.run_steps("reference", _args("reference"))
    own = smoke_step.run_steps("step", _args("step"))
    assert ref["params"] == own["params"]  # tied embeddings, biases, padded vocab: same model size
    model = build_reference(320, 16, n_layer=2, n_head=4, n_embd=32)
    assert model.lm_head.weight is model.wte.weight
    proj = [p for n, p in model.named_parameters() if n.endswith("c_proj.weight")]
    assert float(torch.stack([p.detach().std() for p in proj]).mean()) == pytest.approx(0.02 / 2, rel=0.15)
    x = torch.tensor([[5, 6, 7]])
    assert next_token_targets(x).tolist() == [[6, 7, -1]]


def test_a_step_lowers_the_loss_on_a_repeated_batch():
    a = _args("step", steps=6)
    first = smoke_step.run_steps("step", _args("step", steps=1))["loss"]
    assert smoke_step.run_steps("step", a)["loss"] < first


def test_ddp2_needs_an_even_number_of_micro_batches(capsys):
    code = smoke_step.main(["--case", "ddp2", "--micro", "2", "--accum", "3", "--cpu"])
    assert code == 2 and "ddp2 needs an even number" in capsys.readouterr().err


@pytest.mark.slow
def test_ddp2_runs_two_processes_that_agree():
    proc = subprocess.run([sys.executable, "-m", "training.smoke.step", "--case", "ddp2", "--micro", "2",
                           "--accum", "4", "--steps", "2", "--compile", "off", "--cpu"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    import json

    line = next(x for x in proc.stdout.splitlines() if x.startswith(smoke_step.RESULT_PREFIX))
    out = json.loads(line[len(smoke_step.RESULT_PREFIX):])
    assert (out["world"], out["parallel"], out["backend"]) == (2, "ddp", "gloo")
    assert out["tokens_per_step"] == 2 * 128 * 4 and out["weights_agree"] is True
    assert out["grad_compression"] is None  # CPU: the hook is CUDA's (training.gpt2.parallel)
