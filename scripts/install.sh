#!/usr/bin/env bash
# Install Surge into ./.venv. A host that already has torch (e.g. a CUDA build >= 2.9) keeps it:
# the venv sees the system packages, and torch==2.13.0 (a CPU build) is installed only when no
# torch is importable: from local wheels when pip has them, else from PyTorch's CPU index
# (https://download.pytorch.org/whl/cpu, no CUDA libraries), else from PyPI.
# Usage: scripts/install.sh [extras], e.g. scripts/install.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
say() { echo "[install] $*"; }
if [ ! -x .venv/bin/python ]; then
  say "creating .venv (it sees the system's packages, so a GPU host keeps its CUDA torch)"
  python3 -m venv --system-site-packages .venv
else
  say "using the existing .venv"
fi
py=.venv/bin/python
if "$py" -c "import torch" >/dev/null 2>&1; then
  say "torch $("$py" -c 'import torch; print(torch.__version__)') is already importable: keeping it"
else
  say "installing torch==2.13.0 (CPU build)"
  if "$py" -m pip install -q --no-index "torch==2.13.0" >/dev/null 2>&1; then
    say "torch from local wheels"
  elif "$py" -m pip install -q --timeout 30 --retries 1 --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"; then
    say "torch from PyTorch's CPU index"
  else
    say "PyTorch's CPU index is not reachable: torch from PyPI (a larger build with CUDA libraries)"
    "$py" -m pip install -q "torch==2.13.0"
  fi
fi
spec="."
if [ -n "$extras" ]; then spec=".[$extras]"; fi
say "installing surge (editable) with ${extras:-no extras} and its dependencies"
"$py" -m pip install -q -e "$spec"
say "done: run 'source .venv/bin/activate' to put surge on PATH (or call .venv/bin/surge)"
