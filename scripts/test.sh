#!/usr/bin/env bash
# Install Surge with its test dependencies, then lint and run the whole test suite on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test,triton-cpu
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest -q -ra "$@"
