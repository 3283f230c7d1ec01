#!/usr/bin/env bash
# The cost of optional features on the GPU host (H200), Qwen3-8B with dummy bf16 weights, one fresh
# `surge serve` (the flags of benchmarks/h200.sh), the same `surge bench serve` client throughout:
#   - logprobs: C64/I32/O256 without logprobs, then with `logprobs: true, top_logprobs: 5`;
#   - structured outputs: C16 and C64 at I256/O1024 without, then with a `json_schema` response
#     format on every request (ignore_eos: once the JSON is complete the grammar allows only EOS).
# Usage: benchmarks/h200_features.sh MODEL_DIR OUT_DIR
set -euo pipefail
model="$1"; out="$2"
port=8000
mkdir -p "$out"
python3 -m surge.cli serve --model "$model" --port $port --load-format dummy --dtype bfloat16 \
  --max-num-seqs 256 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 \
  --log-interval 30 > "$out/server.log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then break; fi
  if ! kill -0 $server 2>/dev/null; then tail -50 "$out/server.log"; exit 1; fi
  sleep 1
done
bench() {  # NAME CONCURRENCY INPUT OUTPUT [--extra-body JSON]
  local name=$1 c=$2 i=$3 o=$4; shift 4
  python3 -m surge.cli bench serve --base-url http://127.0.0.1:$port --tokenizer "$model" \
    --input-len "$i" --output-len "$o" --num-prompts "$c" --max-concurrency "$c" --ignore-eos \
    --disable-tqdm --label "$name" --result-file "$out/$name.json" "$@" | tail -n 25
}
schema='{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","age","tags"]}'
rf="{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"person\",\"schema\":$schema}}}"
bench C64_I32_O256_plain 64 32 256
bench C64_I32_O256_top_logprobs_5 64 32 256 --extra-body '{"logprobs": true, "top_logprobs": 5}'
bench C64_I32_O256_plain_again 64 32 256
bench C16_I256_O1024_plain 16 256 1024
bench C16_I256_O1024_json_schema 16 256 1024 --extra-body "$rf"
bench C64_I256_O1024_plain 64 256 1024
bench C64_I256_O1024_json_schema 64 256 1024 --extra-body "$rf"
