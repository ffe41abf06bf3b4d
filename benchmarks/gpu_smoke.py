"""GPU smoke test: the training step on one CUDA GPU, every strategy and precision (not a test).

For each of DDP and FSDP2 (a world of one over NCCL, the same wrapping code the workers run:
training.parallel), each of bf16 and fp16 (fp16 with the GradScaler), and each of the tiny and
gpt2-small presets: a few warm-up steps, then timed steps on random tokens. Prints tokens/s and,
for gpt2-small, the model FLOPs utilisation (6 x parameters x tokens/s, plus attention, over
the GPU's dense bf16/fp16 peak). Then an FSDP save -> resume must give the same next-step loss.
Exit 1 on any failure. `scripts/gpu-smoke.sh` runs this and then the real entrypoint.

    python benchmarks/gpu_smoke.py [--steps 20] [--peak-tflops 989]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.trackers import peak_tflops  # noqa: E402 - the table the trackers' MFU uses

GPT2_VOCAB, GPT2_EOT = 50257, 50256


def _init() -> None:
    import torch
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def run_case(strategy: str, preset: str, precision_name: str, steps: int, batch: int) -> dict:
    import torch

    from training.model import build_model, build_optimizer, count_parameters, gpt2_config
    from training.parallel import comm_hook_name, enable_tf32, shard_fsdp
    from training.precision import bf16_native, choose_precision, make_scaler

    enable_tf32("cuda")
    prec = choose_precision(precision_name, "cuda", bf16_native())
    vocab = GPT2_VOCAB if preset == "gpt2-small" else 257
    config = gpt2_config(preset, vocab, vocab - 1)
    torch.manual_seed(0)
    model = build_model(config).cuda()
    params = count_parameters(model)
    if strategy == "fsdp":
        model = shard_fsdp(model, prec)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0],
                                                          gradient_as_bucket_view=True)
        hook = comm_hook_name("ddp", "cuda", 2, bf16_native())  # as on 2+ GPUs
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, getattr(default_hooks, hook))
    opt = build_optimizer(model, 3e-4, 0.1, (0.9, 0.95))
    scaler = make_scaler(prec, "cuda", sharded=strategy == "fsdp")
    block = config.n_positions
    x = torch.randint(0, vocab, (batch, block), device="cuda")
    losses = []

    def step() -> torch.Tensor:
        with prec.autocast("cuda"):
            loss = model(input_ids=x, labels=x).loss
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(3):
        losses.append(step())
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        losses.append(step())
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    values = [v.item() for v in losses]
    if not all(v == v and v < 100 for v in values):
        raise SystemExit(f"{strategy}/{preset}/{prec.name}: loss not finite: {values}")
    tok_s = batch * block * steps / elapsed
    # 6N per token for the dense layers + attention's 12 * layers * block * d per token
    flops_per_token = 6 * params + 12 * config.n_layer * block * config.n_embd
    return {"tok_s": tok_s, "flops": flops_per_token * tok_s, "first_loss": values[0],
            "last_loss": values[-1], "memory_gb": torch.cuda.max_memory_allocated() / 1e9}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16, help="sequences per step (block: the preset's)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the GPU's dense bf16 peak (default: from its name)")
    a = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: run this where one is")
    from training.precision import bf16_native
    name = torch.cuda.get_device_name(0)
    peak = a.peak_tflops or peak_tflops(name)
    print(f"gpu: {name}, bf16: {bf16_native()}, torch {torch.__version__}, "
          f"peak {peak or '?'} TFLOP/s", flush=True)
    _init()
    failed = False
    precisions = ["bf16", "fp16"] if bf16_native() else ["fp16"]
    for strategy in ("ddp", "fsdp"):
        for preset in ("tiny", "gpt2-small"):
            for precision in precisions:
                torch.cuda.reset_peak_memory_stats()
                try:
                    r = run_case(strategy, preset, precision, a.steps, a.batch)
                except Exception as e:  # noqa: BLE001 - report every case
                    failed = True
                    print(f"FAIL {strategy:4} {preset:10} {precision}: {type(e).__name__}: {e}")
                    continue
                mfu = f", MFU {r['flops'] / (peak * 1e12):.1%}" if peak and preset == "gpt2-small" else ""
                print(f"ok   {strategy:4} {preset:10} {precision}: {r['tok_s']:,.0f} tokens/s{mfu}, "
                      f"loss {r['first_loss']:.3f} -> {r['last_loss']:.3f}, "
                      f"peak memory {r['memory_gb']:.1f} GB", flush=True)
    try:
        try:
            from tests.training.test_parallel import _fsdp_save_resume_same_next_loss
        except ImportError as e:  # the checkout's tests need the test extras (pytest)
            raise RuntimeError(f"{e}: pip install -e '.[test]' for this check") from e
        _fsdp_save_resume_same_next_loss("cuda", precisions[0])
        print(f"ok   fsdp save -> resume: same next-step losses ({precisions[0]})")
    except Exception as e:  # noqa: BLE001
        failed = True
        print(f"FAIL fsdp save -> resume: {type(e).__name__}: {e}")
    import torch.distributed as dist

    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
