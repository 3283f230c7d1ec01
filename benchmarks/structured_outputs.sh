#!/usr/bin/env bash
# Structured outputs on the GPU host (H200, Qwen3-8B config + tokenizer, dummy weights, bf16,
# TP=1): `surge bench serve` at concurrency 16 and 64, input 256 / output 1024 tokens
# (ignore_eos, exact lengths), each point once with no grammar and once with a JSON schema on
# every request (sent with --extra-body as response_format). Usage:
#   benchmarks/structured_outputs.sh MODEL_DIR OUT_DIR [CONCURRENCIES [INPUT OUTPUT [PORT [SERVE_FLAGS]]]]
# e.g. on the H200:
#   benchmarks/structured_outputs.sh .assets/qwen3-8b benchmarks/results/h200-qwen3-8b/structured
# and a CPU smoke run of the same script on the bundled model:
#   benchmarks/structured_outputs.sh surge/assets/stories260K /tmp/so "2" 32 64 8140 "--device cpu"
# Writes OUT_DIR/{none,json}-c<C>.json (vLLM's result fields), OUT_DIR/server.log, and prints
# the comparison. One server serves all points (the schema compiles once, in the first
# constrained warm-up request, and is cached). Target (issue 11): json within 10 % of none in
# output_throughput at each concurrency, p99 ITL not worse.
set -euo pipefail
model="$1"; out="$2"
concurrencies="${3:-16 64}"; input_len="${4:-256}"; output_len="${5:-1024}"; port="${6:-8000}"
serve_flags="${7:---load-format dummy --dtype bfloat16 --gpu-memory-utilization 0.9}"
mkdir -p "$out"
if python3 -c "import socket,sys; s=socket.socket(); sys.exit(0 if s.connect_ex(('127.0.0.1',$port))==0 else 1)"; then
  echo "structured_outputs.sh: port $port is already in use; stop that server first" >&2; exit 2
fi
log="$out/server.log"
# shellcheck disable=SC2086
python3 -m surge.cli serve --model "$model" --port "$port" $serve_flags \
  --max-num-seqs 256 --max-num-batched-tokens 8192 --log-interval 30 >> "$log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then break; fi
  if ! kill -0 $server 2>/dev/null; then tail -50 "$log"; exit 1; fi
  sleep 1
done
schema='{"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object",
  "properties": {"id": {"type": "integer"}, "name": {"type": "string"}, "tags": {"type": "array",
  "items": {"type": "string"}}}, "required": ["id", "name", "tags"]}}}, "required": ["items"]}'
json_body="{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"bench\", \"schema\": $schema}}}"
for c in $concurrencies; do
  for kind in none json; do
    extra=()
    if [ "$kind" = json ]; then extra=(--extra-body "$json_body"); fi
    python3 -m surge.cli bench serve --base-url http://127.0.0.1:$port --endpoint /v1/chat/completions \
      --input-len "$input_len" --output-len "$output_len" --num-prompts "$c" --max-concurrency "$c" --ignore-eos \
      --exact-length --disable-tqdm --result-file "$out/$kind-c$c.json" "${extra[@]}"
  done
done
python3 - "$out" $concurrencies <<'PY'
import json, sys
out = sys.argv[1]
for c in map(int, sys.argv[2:]):
    r = {k: json.load(open(f"{out}/{k}-c{c}.json")) for k in ("none", "json")}
    n, j = r["none"], r["json"]
    drop = 100 * (1 - j["output_throughput"] / n["output_throughput"])
    print(f"C{c}: output tok/s none {n['output_throughput']:.0f}  json {j['output_throughput']:.0f}  "
          f"({drop:+.1f} % lower)  p99 ITL ms none {n['p99_itl_ms']:.1f} json {j['p99_itl_ms']:.1f}  "
          f"failed none {n['failed']} json {j['failed']}")
PY
