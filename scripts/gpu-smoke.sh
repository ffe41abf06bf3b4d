#!/usr/bin/env bash
# GPU smoke test, <= 5 minutes on one CUDA GPU with this project installed
# (pip install -e ".[train]" with a CUDA build of torch):
#   1. benchmarks/gpu_smoke.py: DDP and FSDP2 x tiny and gpt2-small x bf16 and fp16 steps,
#      tokens/s and model FLOPs utilisation for gpt2-small, an FSDP save -> resume check;
#   2. the real entrypoint on the GPU through Ray Train (tiny, auto precision): one epoch,
#      then the same run extended to two epochs, which must resume from the checkpoint.
#
#   scripts/gpu-smoke.sh            # STEPS=20 WORK=~/.cache/submitter-gpu-smoke
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$HOME/.cache/submitter-gpu-smoke}
STEPS=${STEPS:-20}
DATA=${DATA:-$ROOT/../shared/data/wikitext-2/valid.txt}
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$WORK"

echo "== 1/2 training steps on this GPU"
timeout 240 python "$ROOT/benchmarks/gpu_smoke.py" --steps "$STEPS"

echo "== 2/2 python -m training on 1 GPU: 1 epoch, then extended to 2 (resume)"
if [[ ! -f $DATA ]]; then
  python - "$WORK/corpus.txt" <<'PY'
import sys, sysconfig, pathlib
files = sorted(pathlib.Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
pathlib.Path(sys.argv[1]).write_text("".join(f.read_text(errors="replace") for f in files))
PY
  DATA=$WORK/corpus.txt
fi
rm -rf "$WORK/runs/gpu-smoke"
common=(--name gpu-smoke --storage-path "$WORK/runs" --allow-ephemeral-storage
        --model tiny --tokenizer byte --data "$DATA" --replicas 1 --gpu-per-pod 1
        --max-steps-per-epoch 30 --progress-every 10 --val-steps 2
        --batch-size-per-worker 8 --global-batch-size 8)  # not the GPU default's 0.5 M-token steps
(cd "$WORK" && timeout 120 python -m training "${common[@]}" --epochs 1) | tee "$WORK/run1.log" | grep -E 'run_started|progress|run_finished|run_failed|error' || true
grep -q '"type":"run_finished"' "$WORK/run1.log" || { echo "FAIL: first run did not finish"; exit 1; }
(cd "$WORK" && timeout 120 python -m training "${common[@]}" --epochs 2) | tee "$WORK/run2.log" | grep -E 'run_resumed|progress|run_finished|run_failed|error' || true
grep -q '"type":"run_resumed"' "$WORK/run2.log" || { echo "FAIL: the extended run did not resume"; exit 1; }
grep -q '"type":"run_finished"' "$WORK/run2.log" || { echo "FAIL: the extended run did not finish"; exit 1; }
grep -o '"precision":"[a-z0-9]*"' "$WORK/run1.log" | head -1
echo "GPU smoke: OK"
