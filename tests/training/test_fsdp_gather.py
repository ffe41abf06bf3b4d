"""FSDP2 with gradient accumulation gathers the parameters once per optimizer step (issue 28
item 3): two processes over gloo, the tiny GPT-2, the loop's own `training.gpt2.parallel.gradient_sync`.
`torch.distributed.all_gather_single` (what FSDP2 calls) is wrapped to count. The same batches
also run through a second model with FSDP2's defaults (`gather_once` off: every micro-batch
gathers each block in forward and again in backward): the counts differ as the docstring of
training.gpt2.parallel says, and the trained parameters do not.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.support import gloo

torch = pytest.importorskip("torch")

VOCAB, EOT, BLOCK, MICRO, ACCUM, STEPS = 257, 256, 16, 2, 4, 2


def _worker(rank: int, world: int, rendezvous: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from training.gpt2.model import build_model, gpt2_config
    from training.gpt2.parallel import shard_fsdp
    from training.gpt2.precision import choose_precision

    gloo.join(rank, world, rendezvous)
    gathers = [0]
    real = dist.all_gather_single

    def counting_all_gather(*args, **kwargs):
        gathers[0] += 1
        return real(*args, **kwargs)

    dist.all_gather_single = counting_all_gather
    result = {}
    for mode in ("once", "default"):
        torch.manual_seed(0)
        model = shard_fsdp(build_model(gpt2_config("tiny", VOCAB, EOT, BLOCK)),
                           choose_precision("fp32", "cpu", False))
        result[f"{mode}_flag"] = model.gather_once
        model.gather_once = mode == "once"
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        generator = torch.Generator().manual_seed(rank)
        per_micro = []
        for _ in range(STEPS):
            for last, x in gloo.micro_batches(generator, ACCUM, MICRO, VOCAB, BLOCK):
                gathers[0] = 0
                gloo.backward(model, x, ACCUM, last)
                per_micro.append(gathers[0])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():  # an evaluation outside a step: FSDP2's defaults, shards after
            model(input_ids=x, labels=x)
        block = model.transformer.h[0]
        result[mode] = per_micro
        result[f"{mode}_sharded_after_eval"] = isinstance(block.attn.c_attn.weight, DTensor)
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        result[f"{mode}_params"] = [v.double().sum().item() for v in full.values()]
        result["units"] = sum(isinstance(m, FSDPModule) for m in model.modules())
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    gloo.leave()


@pytest.mark.slow  # two processes, each importing torch and transformers
def test_fsdp2_gathers_each_unit_once_per_optimizer_step(tmp_path):
    gloo.spawn(_worker, 2, tmp_path, str(tmp_path))
    for rank in range(2):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        units = r["units"]
        assert units == 3 and r["once_flag"] is True  # two GPT2Blocks and the root; CPU: fits
        steps = [r["once"][i:i + ACCUM] for i in range(0, len(r["once"]), ACCUM)]
        assert steps == [[units] + [0] * (ACCUM - 1)] * STEPS  # once a step, all units
        # FSDP2's defaults: each block in forward and again in backward, the root once
        assert r["default"] == [2 * (units - 1) + 1] * (ACCUM * STEPS)
        assert r["once_sharded_after_eval"] and r["default_sharded_after_eval"]
        assert r["once_params"] == pytest.approx(r["default_params"], rel=1e-5, abs=1e-6)


def test_gather_once_only_where_the_unsharded_model_fits_an_eighth_of_the_card():
    from training.gpt2.parallel import gather_once_fits

    gpt2_small = 124_475_904
    assert gather_once_fits(gpt2_small, 2, 80 * 2**30)         # 250 MB of an H100's 80 GiB
    assert gather_once_fits(gpt2_small, 2, None)                # CPU
    assert not gather_once_fits(7_000_000_000, 2, 80 * 2**30)  # 14 GB of 80 GiB: keep FSDP's
