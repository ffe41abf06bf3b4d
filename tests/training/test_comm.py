"""training.gpt2.comm over gloo, 2 processes on CPU (as tests/training/test_grad_sync.py): the tied
embedding/LM-head gradient has its own all-reduce, launched once per optimizer step, on the last
micro-batch only, finished before `backward()` returns; DDP's buckets carry every other gradient
once; and the gradients equal plain DDP's."""

from __future__ import annotations

import json
import os

import pytest

from tests.support import gloo

torch = pytest.importorskip("torch")

VOCAB, EOT, BLOCK, MICRO, ACCUM, STEPS = 257, 256, 16, 2, 3, 2


def _worker(rank: int, world: int, rendezvous: str, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from training.gpt2.comm import BUCKET_CAP_MB, pod_network_ddp
    from training.gpt2.model import build_model, gpt2_config

    gloo.join(rank, world, rendezvous)
    config = gpt2_config("tiny", VOCAB, EOT, BLOCK)
    torch.manual_seed(1)
    reference = DistributedDataParallel(build_model(config))
    torch.manual_seed(1 + rank)  # rank 1 builds other weights: the broadcasts must align them
    model = pod_network_ddp(build_model(config), None, wrap=DistributedDataParallel)
    tied = model.tied_gradient.param
    tied_bytes = tied.numel() * tied.element_size()
    grad_bytes = sum(p.numel() * p.element_size() for p in model.module.parameters())

    events: list[list] = []
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):  # what training.gpt2.comm calls
        events.append(["tied", tensor.numel() * tensor.element_size()])
        return real_all_reduce(tensor, *args, **kwargs)

    def counting_hook(state, bucket):  # DDP's buckets (allreduce_hook, counted once)
        buffer = bucket.buffer()
        events.append(["bucket", buffer.numel() * buffer.element_size()])
        buffer.div_(world)
        return real_all_reduce(buffer, async_op=True).get_future().then(lambda f: f.value()[0])

    model.register_comm_hook(None, counting_hook)
    dist.all_reduce = counting_all_reduce

    per_micro, max_diff = [], 0.0
    generator = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        for last, x in gloo.micro_batches(generator, ACCUM, MICRO, VOCAB, BLOCK):
            for net in (model, reference):
                gloo.backward(net, x, ACCUM, last)
            # what backward() left: the tied gradient already reduced (or not, under no_sync)
            if last:
                ours = dict(model.module.named_parameters())
                for name, p in reference.module.named_parameters():
                    max_diff = max(max_diff, float((ours[name].grad - p.grad).abs().max()))
            per_micro.append(list(events))
            events.clear()
        for net in (model, reference):
            for p in net.parameters():
                p.grad = None
    dist.all_reduce = real_all_reduce
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"per_micro": per_micro, "tied_bytes": tied_bytes, "grad_bytes": grad_bytes,
                   "max_diff": max_diff, "launches": model.tied_gradient.launches,
                   "bucket_cap": model.bucket_bytes_cap, "cap_mb": BUCKET_CAP_MB}, f)
    gloo.leave()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("comm")
    gloo.spawn(_worker, 2, out, str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow  # two processes, each importing torch and transformers
def test_the_tied_gradient_is_reduced_once_per_step_on_its_own(ranks):
    for rank in ranks:
        steps = [rank["per_micro"][i:i + ACCUM] for i in range(0, len(rank["per_micro"]), ACCUM)]
        for step in steps:
            assert all(m == [] for m in step[:-1])  # no_sync: nothing sent, the tied one neither
            last = step[-1]
            tied = [e for e in last if e[0] == "tied"]
            buckets = [e for e in last if e[0] == "bucket"]
            assert tied == [["tied", rank["tied_bytes"]]]  # one all-reduce, the whole weight
            # DDP's buckets carry every other gradient exactly once
            assert sum(b for _, b in buckets) == rank["grad_bytes"] - rank["tied_bytes"]
        assert rank["launches"] == STEPS
        assert rank["bucket_cap"] == rank["cap_mb"] * 2**20


@pytest.mark.slow
def test_the_gradients_equal_plain_ddps(ranks):
    for rank in ranks:
        assert rank["max_diff"] < 1e-6


def test_tied_names_finds_the_shared_weight_under_every_name():
    from training.gpt2.comm import tied_names
    from training.gpt2.model import build_model, gpt2_config

    model = build_model(gpt2_config("tiny", VOCAB, EOT, BLOCK))
    assert tied_names(model) == ["transformer.wte.weight", "lm_head.weight"]
    assert tied_names(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))) == []


def _cuda_worker(rank: int, world: int, rendezvous: str, out: str) -> None:
    """Both ranks on one GPU (gloo carries CUDA tensors): the tied all-reduce in bf16 next to
    DDP's `bf16_compress_hook`, against plain DDP with the same hook."""
    import contextlib

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    from training.gpt2.comm import pod_network_ddp
    from training.gpt2.model import build_model, gpt2_config

    gloo.join(rank, world, rendezvous)
    device, hook = torch.device("cuda", 0), "bf16_compress_hook"
    config = gpt2_config("tiny", VOCAB, EOT, 64)
    torch.manual_seed(1)
    reference = DistributedDataParallel(build_model(config).to(device))
    torch.manual_seed(1 + rank)
    model = pod_network_ddp(build_model(config).to(device), hook, wrap=DistributedDataParallel)
    for net in (reference, model):
        net.register_comm_hook(None, getattr(default_hooks, hook))
    generator, max_diff = torch.Generator().manual_seed(rank), 0.0
    for _ in range(STEPS):
        for k in range(ACCUM):
            x = torch.randint(0, VOCAB, (MICRO, 64), generator=generator).to(device)
            for net in (model, reference):
                with net.no_sync() if k < ACCUM - 1 else contextlib.nullcontext():
                    with torch.autocast("cuda", torch.bfloat16):
                        loss = net(input_ids=x, labels=x).loss / ACCUM
                    loss.backward()
        ours = dict(model.module.named_parameters())
        for name, p in reference.module.named_parameters():
            max_diff = max(max_diff, float((ours[name].grad - p.grad).abs().max()))
        for net in (model, reference):
            net.zero_grad(set_to_none=True)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"max_diff": max_diff, "launches": model.tied_gradient.launches,
                   "dtype": str(model.tied_gradient.dtype)}, f)
    gloo.leave()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bf16 on CUDA tensors)")
def test_on_cuda_the_tied_gradient_travels_in_bf16_and_equals_plain_ddps(tmp_path):
    gloo.spawn(_cuda_worker, 2, tmp_path, str(tmp_path))
    for r in range(2):
        rank = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert rank["launches"] == STEPS and rank["dtype"] == "torch.bfloat16"
        assert rank["max_diff"] == 0.0  # two ranks: a + b in either layout, rounded as DDP rounds
