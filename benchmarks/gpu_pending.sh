#!/usr/bin/env bash
# What sessions without a GPU left for the next session with one (H200, torch 2.11 + CUDA 13). Run on the
# GPU host from the repository root, with Surge's dependencies importable:
#   benchmarks/gpu_pending.sh OUT_DIR [MODEL_DIR]
# 1. The CUDA tests not yet run on a GPU: none. Session 60 ran the last one, the decode-form GPU test
#    (4 passed, benchmarks/results/h200-qwen3-8b-fp8/session60-h100/pending-tests/, on an H100).
#    Add a test file here when a session without a GPU changes a CUDA path.
#    Log: OUT_DIR/tests.txt. With MODEL_DIR and no ../shared/assets/models/qwen3-8b (a device's copy of
#    the tree), MODEL_DIR is linked there first, since the tests look for the Qwen3 tokenizer in it.
# 2. With MODEL_DIR (the Qwen3-8B config and tokenizer): the four-point bf16 regression check
#    (C1 and C64 x I32 x O256 and O1024, dummy weights, fresh server) through benchmarks/h200.sh, to compare
#    with benchmarks/results/h200-qwen3-8b/session34-bf16. Output: OUT_DIR/bf16-4pt.
# Update the list below when a session without a GPU adds or changes a CUDA path, and empty it (with the
# results committed under benchmarks/results/h200-gpu-tests/) once it has run.
set -uo pipefail
out="${1:?usage: benchmarks/gpu_pending.sh OUT_DIR [MODEL_DIR]}"; model="${2:-}"
mkdir -p "$out"
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || { echo "gpu_pending.sh: no CUDA device here" >&2; exit 2; }
shared_qwen3="$(dirname "$0")/../../shared/assets/models/qwen3-8b"
if [ -n "$model" ] && [ ! -e "$shared_qwen3" ]; then
  mkdir -p "$(dirname "$shared_qwen3")" && ln -s "$(cd "$model" && pwd)" "$shared_qwen3" \
    || echo "gpu_pending.sh: could not link $model to $shared_qwen3; the Qwen3 tests will skip" >&2
fi
tests=()
rc=0
if [ "${#tests[@]}" -gt 0 ]; then
  PYTHONUNBUFFERED=1 python3 -m pytest -q -p no:cacheprovider -o timeout=0 -rfEs --tb=short "${tests[@]}" \
    2>&1 | tee "$out/tests.txt"
  rc=${PIPESTATUS[0]}
else
  echo "gpu_pending.sh: no pending CUDA tests" | tee "$out/tests.txt"
fi
if [ -n "$model" ]; then
  bash "$(dirname "$0")/h200.sh" "$model" "$out/bf16-4pt" 1 --concurrency 1,64 --input-len 32 \
    --output-len 256,1024 --label surge-bf16-pending || rc=1
fi
exit "$rc"
