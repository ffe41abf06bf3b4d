#!/usr/bin/env bash
# GPU smoke test, <= 8 minutes on one CUDA GPU: the real entrypoint (`python -m training`, Ray
# Train, gpt2-small, the default job but 12 steps an epoch) as
#   ddp-eager, ddp-compiled, fsdp-eager, fsdp-compiled (bf16; fp16 on T4/V100), and ddp-resume
#   (the ddp-eager job again with one more epoch: it must resume from its checkpoint),
# then a table of tokens/s, MFU (against the card's dense peak, training/flops.py; n/a for a card
# not in it) and data_wait_fraction per case. Exit 1 when a case failed.
#
# Needs only the project installed with its train extra (pip install ".[train]" with a CUDA
# build of torch), or the project's GPU image (there: python -m training.gpu_smoke); no tests/,
# no pytest. Arguments go to training/gpu_smoke.py:
#   scripts/gpu-smoke.sh                         # all cases, 12 steps each
#   scripts/gpu-smoke.sh --steps 10 --cases ddp-eager,ddp-resume --work /scratch/smoke
set -euo pipefail

if ! python -c "import training.gpu_smoke" 2>/dev/null; then  # a checkout that is not installed
  ROOT=$(cd "$(dirname "$0")/.." && pwd)
  export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
fi
exec timeout 540 python -m training.gpu_smoke "$@"
