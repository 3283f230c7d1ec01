#!/usr/bin/env bash
# FP8 serving smoke benchmark on the GPU host: Qwen3-8B with dummy weights, C1 and C64 at
# I32/O256 (burst, exact lengths), about 2-3 minutes including start-up. Usage:
#   benchmarks/fp8_serve_smoke.sh MODEL_DIR OUT_DIR [surge serve flags...]
# e.g. benchmarks/fp8_serve_smoke.sh .assets/qwen3-8b runs/fp8 --quantization fp8
#      benchmarks/fp8_serve_smoke.sh .assets/qwen3-8b runs/fp8kv --quantization fp8 --kv-cache-dtype fp8
#      (FP8 checkpoint layout: python3 benchmarks/fp8_model_dir.py .assets/qwen3-8b /tmp/q8fp8, then
#       benchmarks/fp8_serve_smoke.sh /tmp/q8fp8 runs/fp8ckpt)
# The roofline column uses FP8 weight bytes (benchmarks/configs/qwen3-8b-fp8), and FP8 KV bytes
# when the serve flags hold --kv-cache-dtype fp8 (else bf16 KV).
set -euo pipefail
model="$1"; out="$2"; shift 2
roof_kv=auto
prev=""
for a in "$@"; do
  [ "$prev" = "--kv-cache-dtype" ] && roof_kv="$a"
  [ "$a" = "--kv-cache-dtype=fp8" ] && roof_kv=fp8
  prev="$a"
done
mkdir -p "$out"
export PYTHONPATH="${PYTHONPATH:-.}"
python3 -m surge.cli serve --model "$model" --load-format dummy --dtype bfloat16 --port 8000 \
  --max-model-len 4096 --log-interval 30 "$@" > "$out/server.log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; then break; fi
  if ! kill -0 $server 2>/dev/null; then tail -50 "$out/server.log"; exit 1; fi
  sleep 1
done
grep -h "KV pool" "$out/server.log" || true
for c in 1 64; do
  python3 -m surge.cli bench serve --base-url http://127.0.0.1:8000 --input-len 32 --output-len 256 \
    --num-prompts "$c" --max-concurrency "$c" --ignore-eos --tokenizer "$model" --disable-tqdm \
    --gpu h200 --model-config benchmarks/configs/qwen3-8b-fp8 --roofline-kv-cache-dtype "$roof_kv" \
    --result-file "$out/c${c}_i32_o256.json"
done
