"""Does the micro-batch a worker chooses (training.gpt2.microbatch) fit its GPU? (needs CUDA)

For each precision: the worker's choice from `torch.cuda.mem_get_info` for a one-GPU
gpt2-small job (share 2,048 sequences), then two optimizer steps of one micro-batch each (eager,
AdamW: the second holds the optimizer's moments), printing the peak memory against the card.

    python benchmarks/microbatch_fit.py            # bf16 and fp32
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> None:
    import torch

    from submitter.contract.spec import JobSpec
    from training.gpt2.microbatch import choose
    from training.gpt2.model import build_model, gpt2_config

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    vocab = 50257
    for precision in ("bf16", "fp32"):
        job = JobSpec.build(name="fit", replicas=1, gpu_per_pod=1, precision=precision)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        free, total = torch.cuda.mem_get_info()
        mine = choose(job, 1, 0, device, precision, vocab)
        model = optimizer = None
        out = {"precision": precision, "gpu": torch.cuda.get_device_name(), "free_gib":
               round(free / 2**30, 1), "total_gib": round(total / 2**30, 1), "fits": mine.fits,
               "micro": mine.micro, "accumulation": mine.accumulation}
        try:
            model = build_model(gpt2_config("gpt2-small", vocab, vocab - 1, job.block)).to(device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
            x = torch.randint(0, vocab, (mine.micro, job.block), device=device)
            t0 = time.perf_counter()
            for _ in range(2):
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
                    loss = model(input_ids=x, labels=x).loss * mine.loss_weight
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            out.update(ok=True, step_s=round((time.perf_counter() - t0) / 2, 2),
                       peak_gib=round(torch.cuda.max_memory_reserved() / 2**30, 1))
        except torch.OutOfMemoryError as e:
            out.update(ok=False, error=str(e).splitlines()[0][:200])
        print(json.dumps(out), flush=True)
        del model, optimizer
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
