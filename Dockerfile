# The image every Ray pod of a submitter job runs: Ray 2.60 (CPU) + torch (CPU) + this project.
# Tag: submitter-gpt2:0.1.0 (= submitter.contract.spec.DEFAULT_IMAGE).
#   docker build -t submitter-gpt2:0.1.0 .
# For GPUs, build FROM rayproject/ray:2.60.0-py311-gpu and drop the CPU wheel index.
FROM rayproject/ray:2.60.0-py311-cpu

# The base image's user is `ray` (uid 1000, gid 100), matching the RayJob's securityContext.
USER 1000:100
WORKDIR /home/ray/submitter

# Dependencies first (cached while only the code changes): CPU torch from the PyTorch index.
ARG TORCH_VERSION=2.13.0
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"

COPY --chown=1000:100 pyproject.toml README.md ./
COPY --chown=1000:100 submitter ./submitter
COPY --chown=1000:100 training ./training
COPY --chown=1000:100 manifests ./manifests
RUN pip install --no-cache-dir ".[train]" && python -c "import training, submitter, torch, ray; print(ray.__version__, torch.__version__)"

ENV PYTHONUNBUFFERED=1
