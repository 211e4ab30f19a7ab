#!/usr/bin/env bash
# Create .venv in the repo root and install Maestro with its test tools (idempotent).
# A .venv that is a symlink (another checkout's environment, shared) is used as it is: installing this checkout
# into it would point that checkout's editable install here.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -L .venv ] && [ -x .venv/bin/python ]; then
  echo "setup: .venv is a link to $(readlink -f .venv): using it as it is (nothing installed)"
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
# The CPU build of torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q --prefer-binary -e ".[test]"
