#!/usr/bin/env bash
# Benchmarks on the GPU host (H200): Surge serving Qwen3-8B (real config and tokenizer, dummy
# weights, bf16, TP=1). Usage:
#   benchmarks/h200.sh MODEL_DIR OUT_DIR STREAM_INTERVAL [surge bench matrix args...]
# e.g. benchmarks/h200.sh .assets/qwen3-8b runs/m1 1 --preset official-8b
# Starts `surge serve`, waits for /health, runs `surge bench matrix` against it, stops it.
set -euo pipefail
model="$1"; out="$2"; interval="$3"; shift 3
mkdir -p "$out"
python3 -m surge.cli serve --model "$model" --load-format dummy --dtype bfloat16 --port 8000 \
  --stream-interval "$interval" --log-interval 30 > "$out/server.log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; then break; fi
  if ! kill -0 $server 2>/dev/null; then tail -50 "$out/server.log"; exit 1; fi
  sleep 1
done
python3 -m surge.cli bench matrix --base-url http://127.0.0.1:8000 --gpu h200 --model-config "$model" \
  --disable-tqdm --output-dir "$out" "$@"
