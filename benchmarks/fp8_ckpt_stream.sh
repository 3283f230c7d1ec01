#!/usr/bin/env bash
# The stream kernel on an FP8 checkpoint's layout (128 x 128 block scales, as Qwen's FP8 releases),
# on the GPU host from the repository root, with Surge's dependencies importable:
#   benchmarks/fp8_ckpt_stream.sh MODEL_DIR OUT_DIR [kernel|serve|all]
# kernel: stream_decode_bench.py over 36 Qwen3-8B-shaped layers, per-row and block-scaled weights
#         alternated twice (OUT_DIR/kernel.jsonl).
# serve:  the checkpoint layout (fp8_model_dir.py from MODEL_DIR) served with the stream kernel and
#         with --no-stream-decode, fresh servers, C1 and C64 at I32/O256 (fp8_serve_smoke.sh;
#         OUT_DIR/ckpt-stream, OUT_DIR/ckpt-chain).
set -uo pipefail
model="${1:?usage: benchmarks/fp8_ckpt_stream.sh MODEL_DIR OUT_DIR [kernel|serve|all]}"
out="${2:?usage: benchmarks/fp8_ckpt_stream.sh MODEL_DIR OUT_DIR [kernel|serve|all]}"
what="${3:-all}"
here="$(dirname "$0")"
mkdir -p "$out"
export PYTHONPATH="${PYTHONPATH:-.}"
rc=0
if [ "$what" = kernel ] || [ "$what" = all ]; then
  for round in 1 2; do
    for layout in "" "--block"; do
      echo "round $round ${layout:-per-row}"
      python3 "$here/stream_decode_bench.py" --layers 36 $layout --json "$out/kernel.jsonl" || rc=1
    done
  done
fi
if [ "$what" = serve ] || [ "$what" = all ]; then
  ckpt="$out/qwen3-8b-fp8-layout"
  python3 "$here/fp8_model_dir.py" "$model" "$ckpt" || exit 1
  bash "$here/fp8_serve_smoke.sh" "$ckpt" "$out/ckpt-stream" || rc=1  # a fresh machine: about 3 min to ready
  bash "$here/fp8_serve_smoke.sh" "$ckpt" "$out/ckpt-chain" --no-stream-decode || rc=1
fi
exit "$rc"
