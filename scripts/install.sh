#!/usr/bin/env bash
# Install Surge into ./.venv. A host that already has torch (e.g. a CUDA build >= 2.9) keeps it:
# the venv sees the system packages, and torch==2.13.0 (a CPU build) is installed only when no
# torch is importable. Usage: scripts/install.sh [extras], e.g. scripts/install.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv --system-site-packages .venv
fi
py=.venv/bin/python
if ! "$py" -c "import torch" >/dev/null 2>&1; then
  "$py" -m pip install -q "torch==2.13.0"
fi
spec="."
if [ -n "$extras" ]; then spec=".[$extras]"; fi
"$py" -m pip install -q -e "$spec"
