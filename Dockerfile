# syntax=docker/dockerfile:1.7
# The images every Ray pod of a submitter job runs: Ray 2.60 + torch + this project, two targets.
#   docker build --target cpu -t ghcr.io/submitter-dev/submitter-gpt2:0.1.0 .       (the default target)
#   docker build --target gpu -t ghcr.io/submitter-dev/submitter-gpt2:0.1.0-gpu .
# = submitter.contract.spec.DEFAULT_IMAGE / DEFAULT_GPU_IMAGE, which a job uses by default (CPU
# image with --gpu-per-pod 0, GPU image otherwise). .github/workflows/images.yml builds and pushes
# both on a version tag. Both carry the GPT-2 BPE ranks at $SUBMITTER_GPT2_BPE, so tokenizing
# needs no download (air-gapped clusters).
ARG RAY_VERSION=2.60.0
ARG TORCH_VERSION=2.13.0

# --- the GPT-2 BPE ranks (tiktoken format), from the openai-whisper sdist on PyPI: tiktoken's own
#     download host is often unreachable from build machines and clusters alike. Checksummed.
FROM python:3.11-slim AS bpe
ARG WHISPER_VERSION=20250625
ARG BPE_SHA256=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
RUN pip download --no-deps --no-binary :all: "openai-whisper==${WHISPER_VERSION}" -d /tmp/w \
 && tar -xzf "/tmp/w/openai_whisper-${WHISPER_VERSION}.tar.gz" -C /tmp/w \
        "openai_whisper-${WHISPER_VERSION}/whisper/assets/gpt2.tiktoken" \
 && install -D -m 0644 "/tmp/w/openai_whisper-${WHISPER_VERSION}/whisper/assets/gpt2.tiktoken" /out/gpt2.tiktoken \
 && echo "${BPE_SHA256}  /out/gpt2.tiktoken" | sha256sum -c - \
 && rm -rf /tmp/w

# --- this project as a wheel (the same for both targets)
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY submitter ./submitter
COPY training ./training
COPY manifests ./manifests
RUN pip wheel --no-deps --no-cache-dir -w /wheels .

# --- GPU: the Ray CUDA base and a CUDA build of torch (its wheels bundle the CUDA runtime; the
#     node needs only the NVIDIA driver). TORCH_CUDA picks the PyTorch index, e.g. cu128.
FROM rayproject/ray:${RAY_VERSION}-py311-gpu AS gpu
ARG TORCH_VERSION
ARG TORCH_CUDA=cu128
# The base image's user is `ray` (uid 1000, gid 100), matching the RayJob's securityContext.
USER 1000:100
RUN pip install --no-cache-dir --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" "torch==${TORCH_VERSION}"
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-cache-dir "$(ls /tmp/wheels/*.whl)[train]" \
 && python -c "import training, submitter, torch, ray, tensorboard, tensorboardX; print(ray.__version__, torch.__version__, torch.version.cuda)" \
 && test -n "$(python -c 'import torch; print(torch.version.cuda or "")')"
COPY --from=bpe /out/gpt2.tiktoken /opt/submitter/gpt2.tiktoken
ENV PYTHONUNBUFFERED=1 SUBMITTER_GPT2_BPE=/opt/submitter/gpt2.tiktoken
WORKDIR /home/ray

# --- CPU (the default target, last): the Ray CPU base and CPU torch from the PyTorch index.
FROM rayproject/ray:${RAY_VERSION}-py311-cpu AS cpu
ARG TORCH_VERSION
USER 1000:100
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-cache-dir "$(ls /tmp/wheels/*.whl)[train]" \
 && python -c "import training, submitter, torch, ray, tensorboard, tensorboardX; print(ray.__version__, torch.__version__)"
COPY --from=bpe /out/gpt2.tiktoken /opt/submitter/gpt2.tiktoken
ENV PYTHONUNBUFFERED=1 SUBMITTER_GPT2_BPE=/opt/submitter/gpt2.tiktoken
WORKDIR /home/ray
