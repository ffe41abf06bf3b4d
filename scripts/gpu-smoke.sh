#!/usr/bin/env bash
# GPU smoke run, <= 8 minutes on one CUDA GPU (docs/gpus/smoke-run.md): a nanoGPT-style
# reference step and the project's own step without Ray, then the real entrypoint
# (`python -m training`, Ray Train, gpt2-small, the default job but a few steps) as
# ddp-compiled, resume, a 2-process DDP case on the one GPU, fsdp-compiled; a table of tokens/s,
# the ratio to the reference, MFU, peak memory and which parallel mode each case ran, then the
# targets. Exit 1 when a case failed.
#
# On a bare machine with only Python and pip it first installs what is missing:
#   - the training stack: from .gpu-stack/site.tgz when the checkout has one (offline; built by
#     make-offline-stack.sh), else `pip install ".[train]"` (torch only when absent);
#   - a C compiler and Python's headers for torch.compile (apt-get/dnf/apk as root), else the
#     smoke run names the package and fails its compiled cases.
# Arguments go to training/gpu_smoke.py:
#   scripts/gpu-smoke.sh --bpe-file /path/gpt2.tiktoken          # offline GPT-2 BPE
#   scripts/gpu-smoke.sh --cases reference,step --work /scratch/smoke
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

if [ -f "$ROOT/.gpu-stack/site.tgz" ]; then  # the offline stack: unpacked once, beside the checkout
  SITE=${SMOKE_SITE:-$HOME/.cache/submitter-gpu-site}
  if [ ! -f "$SITE/.unpacked" ]; then
    mkdir -p "$SITE" && tar xzf "$ROOT/.gpu-stack/site.tgz" -C "$SITE" && touch "$SITE/.unpacked"
  fi
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
if ! "$PY" -c "import training.gpu_smoke" 2>/dev/null; then  # a checkout that is not installed
  export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
fi

# what the smoke run's jobs need (python-stdlib data: no `datasets`)
missing=$("$PY" -c "from submitter.contract.stack import missing_training_modules as m, modules_for
print(' '.join(m(modules_for('python-stdlib'))))")
if [ -n "$missing" ]; then
  echo "gpu-smoke: installing the training stack (missing: $missing)"
  if [[ " $missing " == *" torch "* ]]; then
    "$PY" -m pip install -q torch  # PyPI's Linux wheel is a CUDA build
  fi
  "$PY" -m pip install -q "$ROOT[train]"
fi

# Triton's C helper: a compiler and Python.h (training/smoke/toolchain.py says what is missing)
problem=$("$PY" -c "from training.smoke.toolchain import problem_here; print(problem_here() or '')")
if [ -n "$problem" ] && [ "$(id -u)" = 0 ]; then
  fix=${problem##*: }
  echo "gpu-smoke: $problem"
  case "$fix" in
    apt-get*) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $fix -qq ;;
    dnf*|apk*|zypper*|pacman*) $fix ;;
  esac
fi

exec timeout 540 "$PY" -m training.gpu_smoke "$@"
