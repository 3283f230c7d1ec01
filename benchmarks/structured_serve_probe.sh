#!/usr/bin/env bash
# Issue 11 probe: where the host's time goes while `surge serve` streams C64 I256/O1024 with and
# without a json_schema (benchmarks/structured_serve_probe.py): for each fill-thread cap in
# $THREADS (default "4 8") one fresh server with timers patched into the engine and API
# processes, then plain and json_schema benches, each with the CPU seconds and involuntary
# context switches per output token of every process; then the per-step summaries.
# Usage (repository root): benchmarks/structured_serve_probe.sh MODEL_DIR OUT_DIR [PORT [SERVE_FLAGS]]
#   on the H200: benchmarks/structured_serve_probe.sh .assets/qwen3-8b OUT 8100   (about 5 minutes)
#   CPU smoke:   SMOKE=1 benchmarks/structured_serve_probe.sh MODEL /tmp/probe 8300 "--device cpu"
set -euo pipefail
model="$1"; out="$2"; port="${3:-8000}"
serve_flags="${4:---load-format dummy --dtype bfloat16 --gpu-memory-utilization 0.9}"
py="${PYTHON:-python3}"
if [ "${SMOKE:-0}" = 1 ]; then c=4; il=32; ol=48; else c=64; il=256; ol=1024; fi
threads="${THREADS:-4 8}"
schema='{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","age","tags"]}'
rf="{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"person\",\"schema\":$schema}}}"
mkdir -p "$out"
for t in $threads; do
  dir="$out/threads$t"
  for mode in plain json_schema; do
    rec="$dir/$mode"
    mkdir -p "$rec"
    # shellcheck disable=SC2086
    "$py" benchmarks/structured_serve_probe.py --out "$rec" --max-fill-threads "$t" -- --model "$model" --port "$port" \
      $serve_flags --max-num-seqs 256 --max-num-batched-tokens 8192 --disable-log-requests > "$rec/server.log" 2>&1 &
    server=$!
    for _ in $(seq 1 600); do
      if "$py" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then break; fi
      if ! kill -0 $server 2>/dev/null; then tail -50 "$rec/server.log"; exit 1; fi
      sleep 1
    done
    extra=()
    if [ "$mode" = json_schema ]; then extra=(--extra-body "$rf"); fi
    "$py" benchmarks/structured_serve_probe.py --measure "$rec/C${c}_I${il}_O${ol}" --server-pid $server -- \
      --base-url "http://127.0.0.1:$port" --tokenizer "$model" --input-len $il --output-len $ol \
      --num-prompts $c --max-concurrency $c --ignore-eos --disable-tqdm --label "$mode" "${extra[@]}" | tail -n 40
    kill -INT $server; wait $server || true
    "$py" benchmarks/structured_serve_probe.py --summarize "$rec" > /dev/null
    echo "== threads $t $mode: $rec/summary.json"
    "$py" -c "
import json,sys
s=json.load(open('$rec/summary.json'))
for k,v in s.items():
    if k.startswith('engine-'):
        for part in ('first_128_steps','after_128_steps'):
            p=v.get(part,{}); print(part, {m: p[m].get('mean') for m in p if isinstance(p[m], dict)}, 'rows', p.get('mask_rows_mean'))
print('api lag', s.get('api_lag_ms'), 'over 5 ms', s.get('api_lag_over_5ms_fraction'))
"
  done
done
