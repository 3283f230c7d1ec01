#!/usr/bin/env bash
# The main job on the bundled default model, on CPU: install, serve stories260K, benchmark it,
# print the benchmark table, stop the server. Results land in runs/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
port="${PORT:-8000}"
mkdir -p runs/demo
if curl -s -o /dev/null "http://127.0.0.1:$port/"; then
  echo "demo.sh: port $port is already in use (another server?); stop it or run PORT=8123 bash scripts/demo.sh" >&2
  exit 2
fi
echo "== surge serve on port $port (log: runs/demo/server.log), waiting for http://127.0.0.1:$port/health =="
.venv/bin/surge serve --port "$port" --device cpu > runs/demo/server.log 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  pid=$(curl -sf -D - -o /dev/null "http://127.0.0.1:$port/health" 2>/dev/null | tr -d '\r' | awk 'tolower($1)=="x-surge-pid:" {print $2}') || true
  if [ -n "$pid" ]; then
    if [ "$pid" != "$server" ]; then echo "demo.sh: the server on port $port is not the one started here" >&2; exit 2; fi
    break
  fi
  if ! kill -0 $server 2>/dev/null; then cat runs/demo/server.log; exit 1; fi
  sleep 1
done
echo "== surge generate --prompt 'Once upon a time' (bundled stories260K, greedy) =="
.venv/bin/surge generate --device cpu --prompt "Once upon a time"
echo "== surge bench serve against http://127.0.0.1:$port (64 requests, 16 at a time, 32 in / 128 out) =="
.venv/bin/surge bench serve --base-url "http://127.0.0.1:$port" --endpoint /v1/completions \
  --dataset random --input-len 32 --output-len 128 --num-prompts 64 --max-concurrency 16 \
  --ignore-eos --result-file runs/demo/bench.json
