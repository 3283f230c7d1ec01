#!/usr/bin/env bash
# Install Surge into ./.venv. A host that already has torch (e.g. a CUDA build >= 2.9) keeps it:
# the venv sees the system packages, and torch==2.13.0 (a CPU build) is installed only when no
# torch is importable, by the first of these that succeeds: `pip install --no-index` (wheels
# pip's configuration points to, e.g. PIP_FIND_LINKS), `pip install --index-url` PyTorch's CPU
# index (https://download.pytorch.org/whl/cpu, no CUDA libraries), plain `pip install` (PyPI
# unless configured otherwise). pip may also use any extra index or wheel folder its
# configuration names, so the script reports the command that succeeded and the torch build it
# left (its version and CUDA or CPU only), not a source it cannot know.
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
  say "no torch is importable: installing torch==2.13.0 (CPU build)"
  cpu_index=https://download.pytorch.org/whl/cpu
  if "$py" -m pip install -q --no-index "torch==2.13.0" >/dev/null 2>&1; then
    how="pip install --no-index torch==2.13.0"
  elif "$py" -m pip install -q --timeout 30 --retries 1 --index-url "$cpu_index" "torch==2.13.0"; then
    how="pip install --index-url $cpu_index torch==2.13.0"
  else
    say "pip install --index-url $cpu_index torch==2.13.0 failed (pip says why above): trying pip's" \
      "default index (PyPI unless configured otherwise; its Linux build bundles CUDA libraries)"
    "$py" -m pip install -q "torch==2.13.0"
    how="pip install torch==2.13.0"
  fi
  build=$("$py" -c 'import torch; c = torch.version.cuda; print(torch.__version__, f"(CUDA {c})" if c else "(CPU only)")' 2>/dev/null || echo "does not import")
  say "\`$how\` succeeded: torch $build"
fi
spec="."
if [ -n "$extras" ]; then spec=".[$extras]"; fi
say "installing surge (editable) with ${extras:-no extras} and its dependencies"
"$py" -m pip install -q -e "$spec"
say "done: run 'source .venv/bin/activate' to put surge on PATH (or call .venv/bin/surge)"
