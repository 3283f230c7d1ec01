#!/usr/bin/env bash
# Structured outputs on the GPU host (issue 11): one fresh `surge serve` (Qwen3-8B config +
# tokenizer, dummy bf16 weights, the flags of benchmarks/h200_features.sh), the `surge bench serve`
# client throughout (chat endpoint, burst, ignore_eos, exact lengths):
#   1. the host work per step for 16 and 64 constrained rows on this host's CPU
#      (benchmarks/structured_host_step.py -> host_step.json), and the engine's decode step time
#      at batch 16 and 64, plain vs json_schema, no server, with the mask's wait and fill per step
#      (benchmarks/structured_engine_step.py -> engine_step.json); the detokenizer's cost on a
#      JSON-then-EOS stream and the gaps of a 0.5 ms ticker thread while grammars compile
#      (benchmarks/structured_cpu_costs.py -> cpu_costs.json);
#   2. throughput: C16 and C64 at I256/O1024, each without and with a `json_schema` response
#      format on every request (the schema of h200_features.sh) -> C<c>_I256_O1024_{plain,json_schema}.json;
#   3. compile stall: C16 I256/O1024 unconstrained streams (64 requests, 16 at a time), alone and
#      then while constrained requests with fresh schemas (each one compiles) arrive every 0.5 s
#      (benchmarks/structured_mixed.py) -> mixed_{alone,unconstrained,constrained}.json; the control:
#      the same arrivals with one schema, compiled once -> mixed_cached_{unconstrained,constrained}.json
#      (the arrivals' prefills without the compilations);
#   then summary.json and a printed comparison. Targets: json_schema within 10 % of plain output
#   throughput; P99 ITL of the unconstrained streams unchanged by the constrained arrivals.
# Usage (repository root): benchmarks/structured_outputs.sh MODEL_DIR OUT_DIR [PORT [SERVE_FLAGS]]
#   on the H200: benchmarks/structured_outputs.sh .assets/qwen3-8b OUT
#   CPU smoke:   benchmarks/structured_outputs.sh surge/assets/stories260K /tmp/so 8140 "--device cpu" (set SMOKE=1 for tiny shapes)
set -euo pipefail
model="$1"; out="$2"; port="${3:-8000}"
serve_flags="${4:---load-format dummy --dtype bfloat16 --gpu-memory-utilization 0.9}"
py="${PYTHON:-python3}"
if [ "${SMOKE:-0}" = 1 ]; then cs="2"; il=32; ol=48; mixed_n=4; else cs="16 64"; il=256; ol=1024; mixed_n=64; fi
mkdir -p "$out"
if "$py" -c "import socket,sys; s=socket.socket(); sys.exit(0 if s.connect_ex(('127.0.0.1',$port))==0 else 1)"; then
  echo "structured_outputs.sh: port $port is already in use; stop that server first" >&2; exit 2
fi
# SKIP_STEP_BENCH=1 skips step 1 (the host, engine-step and CPU-cost benches: about 2.5 minutes on the H200)
if [ "${SKIP_STEP_BENCH:-0}" != 1 ] && [ -f "$model/config.json" ] && "$py" -c "import json,sys; sys.exit(0 if json.load(open('$model/config.json')).get('vocab_size',0)>100000 else 1)"; then
  "$py" benchmarks/structured_host_step.py --model "$model" --rows 16 64 --steps 200 --fill-threads 1 2 4 8 --result-file "$out/host_step.json"
  "$py" benchmarks/structured_cpu_costs.py --model "$model" --result-file "$out/cpu_costs.json"
fi
if [ "${SMOKE:-0}" != 1 ] && [ "${SKIP_STEP_BENCH:-0}" != 1 ]; then
  "$py" benchmarks/structured_engine_step.py --model "$model" --batch 16 64 --input-len 256 --output-len 512 \
    --result-file "$out/engine_step.json"
fi
log="$out/server.log"
# shellcheck disable=SC2086
"$py" -m surge.cli serve --model "$model" --port "$port" $serve_flags \
  --max-num-seqs 256 --max-num-batched-tokens 8192 --log-interval 30 > "$log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  if "$py" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then break; fi
  if ! kill -0 $server 2>/dev/null; then tail -50 "$log"; exit 1; fi
  sleep 1
done
bench() {  # NAME CONCURRENCY NUM_PROMPTS [--extra-body JSON]
  local name=$1 c=$2 n=$3; shift 3
  "$py" -m surge.cli bench serve --base-url "http://127.0.0.1:$port" --tokenizer "$model" \
    --input-len "$il" --output-len "$ol" --num-prompts "$n" --max-concurrency "$c" --ignore-eos \
    --disable-tqdm --label "$name" --result-file "$out/$name.json" "$@" | tail -n 25
}
schema='{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","age","tags"]}'
rf="{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"person\",\"schema\":$schema}}}"
names=()
for c in $cs; do
  bench "C${c}_I${il}_O${ol}_plain" "$c" "$c"
  bench "C${c}_I${il}_O${ol}_json_schema" "$c" "$c" --extra-body "$rf"
  names+=("C${c}_I${il}_O${ol}")
done
c16=${cs%% *}
bench mixed_alone "$c16" "$mixed_n"
sender_rc=0
mixed() {  # NAME [--same-schema]: the unconstrained streams while constrained requests arrive
  local name=$1; shift
  rm -f "$out/mixed.done"
  "$py" benchmarks/structured_mixed.py --base-url "http://127.0.0.1:$port" --stop-file "$out/mixed.done" \
    --result-file "$out/${name}_constrained.json" "$@" &
  local sender=$!
  sleep 1
  bench "${name}_unconstrained" "$c16" "$mixed_n"
  touch "$out/mixed.done"
  wait $sender || sender_rc=$?
}
mixed mixed_cached --same-schema  # the same arrivals, one schema compiled once: no compile load
mixed mixed
"$py" - "$out" "${names[@]}" <<'PY'
import json, sys
out, names = sys.argv[1], sys.argv[2:]
load = lambda n: json.load(open(f"{out}/{n}.json"))
summary = {"throughput": {}, "compile_stall": {}}
for n in names:
    p, j = load(f"{n}_plain"), load(f"{n}_json_schema")
    drop = 100 * (1 - j["output_throughput"] / p["output_throughput"])
    summary["throughput"][n] = {
        "plain_output_throughput": p["output_throughput"], "json_output_throughput": j["output_throughput"],
        "drop_percent": drop, "plain_mean_tpot_ms": p["mean_tpot_ms"], "json_mean_tpot_ms": j["mean_tpot_ms"],
        "plain_p99_itl_ms": p["p99_itl_ms"], "json_p99_itl_ms": j["p99_itl_ms"],
        "failed": p["failed"] + j["failed"], "target_met": drop <= 10.0,
    }
    print(f"{n}: output tok/s plain {p['output_throughput']:.0f} json_schema {j['output_throughput']:.0f} "
          f"({drop:+.1f} % lower; target <= 10 %)  mean TPOT ms {p['mean_tpot_ms']:.2f} -> {j['mean_tpot_ms']:.2f}  "
          f"P99 ITL ms {p['p99_itl_ms']:.2f} -> {j['p99_itl_ms']:.2f}  failed {p['failed'] + j['failed']}")
a, m, s = load("mixed_alone"), load("mixed_unconstrained"), load("mixed_constrained")
c = load("mixed_cached_unconstrained")
summary["compile_stall"] = {
    "alone_p99_itl_ms": a["p99_itl_ms"], "mixed_p99_itl_ms": m["p99_itl_ms"],
    "cached_schema_p99_itl_ms": c["p99_itl_ms"],
    "alone_mean_itl_ms": a["mean_itl_ms"], "mixed_mean_itl_ms": m["mean_itl_ms"],
    "cached_schema_mean_itl_ms": c["mean_itl_ms"],
    "alone_output_throughput": a["output_throughput"], "mixed_output_throughput": m["output_throughput"],
    "cached_schema_output_throughput": c["output_throughput"],
    "failed": a["failed"] + m["failed"] + c["failed"],
    "constrained_sent": s["sent"], "constrained_completed": s["completed"], "constrained_failed": s["failed"],
}
print(f"compile stall: unconstrained P99 ITL ms alone {a['p99_itl_ms']:.2f}, with cached-schema arrivals "
      f"{c['p99_itl_ms']:.2f}, with fresh-schema arrivals "
      f"{m['p99_itl_ms']:.2f} (mean {a['mean_itl_ms']:.2f} -> {m['mean_itl_ms']:.2f}); "
      f"{s['sent']} constrained requests sent, {s['completed']} completed, {s['failed']} failed")
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
PY
exit $sender_rc
