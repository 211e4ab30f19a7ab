#!/usr/bin/env bash
# Set up, then run the whole DVC pipeline on the embedded SYNTHETIC sample:
# sample → collect → featurize → train → evaluate → register (MLflow store in mlruns/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
dvc repro "$@"
dvc metrics show
