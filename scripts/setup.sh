#!/usr/bin/env bash
# Create .venv in the repo root and install Maestro with its test tools (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
# The CPU build of torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q --prefer-binary -e ".[test]"
