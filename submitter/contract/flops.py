"""Model FLOPs and the GPUs' dense peaks: model FLOPs utilisation (MFU) without torch.

The one way the project counts MFU: `flops_per_token` (with the attention term) and `mfu`,
used by the trackers (training.events.trackers, `train/mfu`), the GPU smoke run (training.gpu_smoke)
and the scaling model (benchmarks/scaling_model.py); `preset_flops_per_token` looks the
shapes up by preset name for callers that hold only run_started's facts. Stdlib only:
importable where torch is not installed.

How it compares (gpt2-small, N = 124.5 M with tied embeddings, L = 12, d = 768, T = block):
- nanoGPT's `estimate_mfu`: 6N + 12 L d T, N without the position embedding
  (`get_num_params(non_embedding=True)`). The same formula as ours; our N keeps `wpe`
  (T x d: 0.2 M at T = 256, +0.16% FLOPs).
- llm.c's `gpt2_estimate_mfu`: 6N + 6 L d T, N all parameters: half our attention term (it
  counts the causal half of the score matrix). At T = 256 ours is 1.9% higher (775 vs 761
  MFLOP a token); at T = 1,024, 7.0% (860 vs 803).
- The trackers counted 6N until issue 24 (no attention term): 3.8% below ours at T = 256.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional


class Peak(NamedTuple):
    """A GPU model's dense tensor-core peak for the 16-bit format it trains in."""
    label: str
    tflops: float
    dtype: str  # "bf16", or "fp16" where the card has no native bf16 (T4, V100)


#: Dense (no 2:4 sparsity) 16-bit tensor-core peaks, TFLOP/s, from NVIDIA's data sheets: half of
#: the "with sparsity" figure where the sheet gives only that (H100 SXM 1,979 -> 989; PCIe 1,513
#: -> 756; NVL 1,671 -> 835; H200 as H100; A100 312 for 40GB and 80GB, SXM and PCIe; L40S 362,
#: L40 181, L4 121 (Ada sheets: "BF16 Tensor TFLOPS" 733/362/242 with sparsity); A10 125; T4 65
#: and V100 SXM2 125 / PCIe 112 / V100S 130 are fp16 mixed-precision figures). A10G (AWS's A10
#: variant, no NVIDIA sheet) is the commonly quoted 70: 80 SMs at 1.71 GHz with GA10x's
#: half-rate fp32-accumulate tensor math, not the A10's 125.
#: Rules are matched on the words of torch.cuda.get_device_name() (split on space, '-' and '_'),
#: most specific first, all of a rule's words required: "L4" never matches "L40" or "L40S".
PEAK_RULES: tuple[tuple[tuple[str, ...], Peak], ...] = (
    (("H100", "NVL"), Peak("H100 NVL", 835.0, "bf16")),
    (("H100", "PCIE"), Peak("H100 PCIe", 756.0, "bf16")),
    (("H100",), Peak("H100 SXM", 989.0, "bf16")),   # "NVIDIA H100 80GB HBM3"
    (("H200", "NVL"), Peak("H200 NVL", 835.0, "bf16")),
    (("H200",), Peak("H200 SXM", 989.0, "bf16")),
    (("A100",), Peak("A100", 312.0, "bf16")),        # 40GB and 80GB, SXM4 and PCIe alike
    (("L40S",), Peak("L40S", 362.0, "bf16")),
    (("L40",), Peak("L40", 181.0, "bf16")),
    (("L4",), Peak("L4", 121.0, "bf16")),
    (("A10G",), Peak("A10G", 70.0, "bf16")),
    (("A10",), Peak("A10", 125.0, "bf16")),
    (("T4",), Peak("T4", 65.0, "fp16")),
    (("V100S",), Peak("V100S", 130.0, "fp16")),
    (("V100", "PCIE"), Peak("V100 PCIe", 112.0, "fp16")),
    (("V100",), Peak("V100 SXM2", 125.0, "fp16")),
)


def device_words(name: str) -> frozenset[str]:
    return frozenset(w for w in re.split(r"[\s\-_]+", name.upper()) if w)


def peak_for(device_name: str) -> Optional[Peak]:
    """The dense 16-bit peak of the GPU torch names `device_name`, or None for one not in the
    table (its MFU is then shown as n/a rather than against a wrong peak)."""
    words = device_words(device_name)
    for needed, peak in PEAK_RULES:
        if words.issuperset(needed):
            return peak
    return None


def flops_per_token(params: int, n_layer: int, n_embd: int, block: int) -> float:
    """Training FLOPs per token: 6 x parameters (forward 2, backward 4, per multiply-add) plus
    attention's score and value products, 12 x layers x block x width (PaLM's appendix B, as
    nanoGPT's estimate_mfu counts them)."""
    return 6.0 * params + 12.0 * n_layer * n_embd * block


def preset_flops_per_token(model: str, params: int, block: int) -> Optional[float]:
    """`flops_per_token` for a preset named in submitter.contract.batch.MODEL_SHAPES (None for
    one that is not: no MFU rather than a wrong one)."""
    from submitter.contract.batch import MODEL_SHAPES

    if model not in MODEL_SHAPES:
        return None
    n_layer, n_embd, _ = MODEL_SHAPES[model]
    return flops_per_token(params, n_layer, n_embd, block)


def mfu(tokens_per_sec: float, per_token: float, peak_tflops: Optional[float]) -> Optional[float]:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak, or None without a peak."""
    if not peak_tflops:
        return None
    return tokens_per_sec * per_token / (peak_tflops * 1e12)


def gpt2_parameters(vocab: int, block: int, n_layer: int = 12, n_embd: int = 768) -> int:
    """GPT-2's parameter count with tied embeddings (the same formula as
    training.gpt2.model.expected_parameters, without importing torch)."""
    d = n_embd
    return vocab * d + block * d + n_layer * (12 * d * d + 13 * d) + 2 * d
