"""Scaling on paper (#18 item 6, moved here from benchmarks/scaling_model.py for #38): the
expected data-parallel efficiency of a GPU job on n GPUs at a given bandwidth per GPU, and
where it breaks. Pure arithmetic, stdlib only: `submitter estimate` uses it for the step time
on the GPUs asked for; `python benchmarks/scaling_model.py` prints its table.

The model, stated so it can be argued with:
- Compute. Training FLOPs per token = 6 N + 12 L d T (submitter.contract.flops.flops_per_token: N
  parameters, L layers, width d, block T). A micro-batch of m tokens takes
  m x FLOPs/token / (peak x MFU), but never less than a launch floor (a micro-step's ~1,000
  kernels cost time however few tokens they touch: the regime of tiny micro-batches).
- Batch. A fixed global batch per optimizer step (GPT-2's ~0.5 M tokens), split over n GPUs;
  each GPU accumulates ceil(tokens per GPU / largest micro-batch) equal micro-batches, the
  largest micro-batch being the batch rule's for the card (submitter.contract.batch:
  `micro_batch_that_fits`, `gpu_memory_gib`). DDP all-reduces once per optimizer step (no_sync
  on all micro-batches but the last).
- Communication. bf16 gradients (2 N bytes). DDP's buckets are sized in fp32 gradient bytes
  (training.gpt2.comm.BUCKET_CAP_MB; half that on the wire in bf16); each bucket is a ring
  all-reduce: 2 (n-1)/n x bucket bytes / bandwidth + 2 (n-1) x latency (the ring's 2 (n-1)
  steps; over TCP between pods a step costs tens of microseconds). Bandwidth is per GPU: 8
  one-GPU pods send every byte over the pod network.
- Overlap, as DDP overlaps it. Every gradient but the tied embedding/LM-head weight becomes
  ready evenly through the last micro-batch's backward (2/3 of its time); buckets are reduced
  one after another as they are ready. The tied weight's gradient (V x d: 31% of gpt2-small's
  bytes) is complete only when the embedding's backward, the backward's last op, adds its part:
  its all-reduce (training.gpt2.comm launches it at once, on its own) starts at the end of the
  backward, after the buckets still in flight. What shows is the time from the end of the
  backward to the end of the last all-reduce (exposed_comm_s); `tied_tail_s` is the part of it
  the tied weight adds. Earlier micro-batches and the forward pass hide nothing.
- Optimizer. Every GPU runs the whole AdamW step (DDP replicates it): ~28 bytes of HBM traffic
  per parameter (fp32 weights, gradients and two moments read, three written).
- Efficiency(n) = time of one optimizer step on 1 GPU / (n x time on n GPUs), same global batch.

Assumptions the model does not capture: NCCL's tree algorithm (fewer latency steps at large n),
faster links between GPUs of one pod (NVLink) than between pods, stragglers and data waits,
FSDP's extra all-gathers (the model is DDP's), and clocks below the data sheet's peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from submitter.contract import batch
from submitter.contract.flops import flops_per_token, gpt2_parameters

#: DDP's bucket size (MiB of fp32 gradients) the training side uses: training.gpt2.comm's
#: BUCKET_CAP_MB (the contract cannot import training; tests/test_scaling_model.py checks they agree).
BUCKET_CAP_MB = 50

GPUS = (1, 8, 64, 512)
BANDWIDTHS_GBPS = (25.0, 100.0, 400.0)
#: DDP's default bucket_cap_mb (fp32 gradient bytes per bucket).
DDP_BUCKET_MB = 25.0
#: HBM bytes an AdamW step moves per parameter (fp32 param r/w, grad r, exp_avg r/w, exp_avg_sq r/w).
ADAMW_BYTES_PER_PARAM = 28


@dataclass(frozen=True)
class Settings:
    """The job and the hardware; the defaults are the default GPU job on an H100 SXM."""
    vocab: int = 50304                # GPT-2's 50,257 padded to a multiple of 64 (training/gpt2/model.py)
    n_layer: int = 12
    n_embd: int = 768
    block: int = 256                  # gpt2-small's preset block (training/gpt2/model.py)
    global_batch_tokens: int = 2**19  # ~0.5 M tokens per optimizer step (GPT-2's)
    gpu_type: str = "H100"            # the card the batch rule sizes the micro-batch for
    micro_batch_tokens: int = 0       # 0: the batch rule's largest micro-batch for gpu_type
    grad_bytes_per_param: int = 2     # bf16 gradients (DDP's bf16 compression hook)
    peak_tflops: float = 989.0        # H100 SXM dense bf16 (submitter.contract.flops)
    mfu: float = 0.40                 # the goal; measure it with scripts/gpu-smoke.sh
    launch_floor_ms: float = 4.0      # least time of one micro-step (fwd + bwd), however small
    hbm_tbs: float = 3.35             # H100 SXM HBM3, TB/s (for the optimizer step)
    latency_us: float = 50.0          # per ring step (NCCL over RDMA: a few us; pod TCP: tens)
    bucket_cap_mb: float = float(BUCKET_CAP_MB)  # DDP buckets, MiB of fp32 gradients

    @property
    def params(self) -> int:
        return gpt2_parameters(self.vocab, self.block, self.n_layer, self.n_embd)

    @property
    def grad_bytes(self) -> int:
        return self.params * self.grad_bytes_per_param

    @property
    def tied_bytes(self) -> int:
        """The tied embedding/LM-head gradient on the wire (its own all-reduce)."""
        return self.vocab * self.n_embd * self.grad_bytes_per_param

    @property
    def bucket_bytes(self) -> int:
        """One DDP bucket on the wire: its fp32 cap in the compressed dtype."""
        return int(self.bucket_cap_mb * 2**20 * self.grad_bytes_per_param / 4)

    @property
    def micro_tokens(self) -> int:
        """The largest micro-batch in tokens: the batch rule's for the card unless given."""
        if self.micro_batch_tokens:
            return self.micro_batch_tokens
        memory = batch.gpu_memory_gib(self.gpu_type)
        return batch.micro_batch_that_fits("gpt2-small", self.block, memory) * self.block

    @property
    def per_token(self) -> float:
        return flops_per_token(self.params, self.n_layer, self.n_embd, self.block)


@dataclass(frozen=True)
class Step:
    """One optimizer step on each of n GPUs, in seconds, and what it is made of."""
    gpus: int
    gbps: float
    tokens_per_gpu: float
    micro_batches: int
    micro_tokens: float
    compute_s: float
    exposed_comm_s: float
    tied_tail_s: float
    comm_s: float
    optimizer_s: float
    launch_bound: bool

    @property
    def total_s(self) -> float:
        return self.compute_s + self.exposed_comm_s + self.optimizer_s


def ring_allreduce_s(nbytes: float, n: int, bytes_per_s: float, latency_s: float) -> float:
    """A ring all-reduce of `nbytes` over n ranks: 2 (n-1) steps, each moving nbytes / n per
    rank and paying one latency."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bytes_per_s + 2 * (n - 1) * latency_s


def bucket_sizes(total: int, cap: int) -> list[int]:
    full, rest = divmod(total, cap)
    return [cap] * full + ([rest] if rest else [])


def exposed_comm_s(bucket_times: Sequence[float], backward_s: float, tail_s: float = 0.0) -> float:
    """Communication left after the backward: bucket i (of k) is ready at (i+1)/k of the
    backward and is reduced once it is ready and the previous bucket is done; then `tail_s`
    (the tied weight's all-reduce), ready at the end of the backward."""
    k = len(bucket_times)
    done = 0.0
    for i, t in enumerate(bucket_times):
        ready = (i + 1) / k * backward_s
        done = max(done, ready) + t
    if tail_s:
        done = max(done, backward_s) + tail_s
    return max(0.0, done - backward_s) if k or tail_s else 0.0


def micro_step_s(s: Settings, tokens: float) -> float:
    return max(tokens * s.per_token / (s.peak_tflops * 1e12 * s.mfu), s.launch_floor_ms / 1e3)


def step(s: Settings, gpus: int, gbps: float) -> Step:
    """The optimizer step on `gpus` data-parallel GPUs with `gbps` Gb/s each."""
    tokens = s.global_batch_tokens / gpus
    micro = max(1, math.ceil(tokens / s.micro_tokens))
    micro_tokens = tokens / micro
    one = micro_step_s(s, micro_tokens)
    ring = [ring_allreduce_s(b, gpus, gbps * 1e9 / 8, s.latency_us / 1e6)
            for b in [*bucket_sizes(s.grad_bytes - s.tied_bytes, s.bucket_bytes), s.tied_bytes]]
    buckets, tied = ring[:-1], ring[-1]
    exposed = exposed_comm_s(buckets, one * 2 / 3, tied) if gpus > 1 else 0.0
    without_tied = exposed_comm_s(buckets, one * 2 / 3) if gpus > 1 else 0.0
    optimizer = s.params * ADAMW_BYTES_PER_PARAM / (s.hbm_tbs * 1e12)
    floor = s.launch_floor_ms / 1e3
    return Step(gpus, gbps, tokens, micro, micro_tokens, micro * one, exposed,
                exposed - without_tied, sum(ring), optimizer, launch_bound=one <= floor * (1 + 1e-9))


def efficiency(s: Settings, gpus: int, gbps: float) -> float:
    """Tokens/s per GPU on `gpus` GPUs over tokens/s on one GPU (same global batch)."""
    return step(s, 1, gbps).total_s / (gpus * step(s, gpus, gbps).total_s)


def table(s: Settings, gpus: Sequence[int] = GPUS,
          bandwidths: Sequence[float] = BANDWIDTHS_GBPS) -> list[dict]:
    rows = []
    for n in gpus:
        steps = [step(s, n, b) for b in bandwidths]
        rows.append({"gpus": n, "tokens_per_gpu": steps[0].tokens_per_gpu,
                     "micro_batches": steps[0].micro_batches, "micro_tokens": steps[0].micro_tokens,
                     "compute_ms": steps[0].compute_s * 1e3, "optimizer_ms": steps[0].optimizer_s * 1e3,
                     "comm_ms": [x.comm_s * 1e3 for x in steps],
                     "exposed_ms": [x.exposed_comm_s * 1e3 for x in steps],
                     "tied_ms": [x.tied_tail_s * 1e3 for x in steps],
                     "efficiency": [efficiency(s, n, b) for b in bandwidths],
                     "launch_bound": steps[0].launch_bound})
    return rows


def format_table(rows: list[dict], bandwidths: Sequence[float] = BANDWIDTHS_GBPS) -> str:
    """A Markdown table (docs/gpus/multi-node.md carries it)."""
    bw = " | ".join(f"{b:g} Gb/s" for b in bandwidths)
    out = [f"| GPUs | tokens/GPU/step | micro-batches x tokens | compute ms | all-reduce ms "
           f"(exposed; of it the tied tail) at {', '.join(f'{b:g}' for b in bandwidths)} Gb/s "
           f"| efficiency {bw} |",
           "|---:|---:|---:|---:|---|" + "---:|" * len(bandwidths)]
    for r in rows:
        comm = ", ".join(f"{c:.0f} ({e:.1f}; {t:.1f})"
                         for c, e, t in zip(r["comm_ms"], r["exposed_ms"], r["tied_ms"]))
        eff = " | ".join(f"{e:.0%}" for e in r["efficiency"])
        out.append(f"| {r['gpus']} | {r['tokens_per_gpu']:,.0f} | {r['micro_batches']} x "
                   f"{r['micro_tokens']:,.0f} | {r['compute_ms']:.1f} | "
                   f"{comm if r['gpus'] > 1 else '-'} | {eff} |")
    return "\n".join(out)


def breaks(s: Settings, gpus: Sequence[int] = GPUS,
           bandwidths: Sequence[float] = BANDWIDTHS_GBPS) -> list[str]:
    """Where the model says scaling stops, one sentence each."""
    notes = []
    for n in gpus:
        x = step(s, n, bandwidths[0])
        if x.tokens_per_gpu < s.block:
            notes.append(f"{n} GPUs: {x.tokens_per_gpu:,.0f} tokens per GPU is less than one "
                         f"sequence of {s.block}: the global batch must grow with the GPUs")
        elif x.launch_bound:
            notes.append(f"{n} GPUs: the global batch of {s.global_batch_tokens:,} tokens gives "
                         f"each GPU only {x.tokens_per_gpu:,.0f} tokens per step "
                         f"({x.tokens_per_gpu / s.block:,.0f} sequences): the micro-batch is too "
                         f"small to keep a GPU busy (launch floor {s.launch_floor_ms:g} ms); grow "
                         "the global batch with the GPUs")
        if n > 1 and x.optimizer_s > 0.1 * x.total_s:
            notes.append(f"{n} GPUs: the AdamW step every GPU repeats ({x.optimizer_s * 1e3:.1f} ms) "
                         f"is {x.optimizer_s / x.total_s:.0%} of the step: shard it (FSDP)")
        for b in bandwidths:
            y = step(s, n, b)
            if n > 1 and y.exposed_comm_s > 0.1 * y.total_s:
                latency = 2 * (n - 1) * s.latency_us / 1e3 * (
                    len(bucket_sizes(s.grad_bytes - s.tied_bytes, s.bucket_bytes)) + 1)
                notes.append(f"{n} GPUs at {b:g} Gb/s: {y.exposed_comm_s * 1e3:.0f} ms of the "
                             f"all-reduce shows ({y.exposed_comm_s / y.total_s:.0%} of the step, "
                             f"{y.tied_tail_s * 1e3:.0f} ms of it the tied embedding's tail)"
                             + (f"; {latency:.0f} ms of it is the ring's latency (NCCL's tree "
                                f"pays ~2 log2(n) steps instead)" if latency > 0.3 * y.comm_s * 1e3 else ""))
    return notes
