#!/usr/bin/env bash
# The serving cost of logprobs on the GPU host: one `surge serve` (Qwen3-8B config, dummy bf16
# weights, defaults: CUDA graphs, asynchronous scheduling), then `surge bench serve` bursts at
# C64/I32/O256 on the chat endpoint, alternating requests without logprobs and with
# `logprobs: true, top_logprobs: 5`, REPEATS times each (the spread of the repeats without
# logprobs is the noise). Usage:
#   benchmarks/logprobs_cost.sh MODEL_DIR OUT_DIR [REPEATS]
# e.g. benchmarks/logprobs_cost.sh .assets/qwen3-8b runs/logprobs 3
# Writes OUT_DIR/{off,top5}-N.json (vLLM-named result JSON), OUT_DIR/server.log and prints a
# table of output throughput and mean TPOT per run.
set -euo pipefail
model="$1"; out="$2"; repeats="${3:-3}"
port=8000
mkdir -p "$out"
if ! python3 -m surge.cli bench serve --help | grep -q -- "--extra-body"; then
  echo "surge bench serve has no --extra-body flag on this checkout" >&2
  exit 2
fi
python3 -m surge.cli serve --model "$model" --load-format dummy --dtype bfloat16 --port "$port" \
  --log-interval 30 > "$out/server.log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then break; fi
  if ! kill -0 $server 2>/dev/null; then tail -50 "$out/server.log"; exit 1; fi
  sleep 1
done
common=(--base-url "http://127.0.0.1:$port" --max-concurrency 64 --num-prompts 64 --input-len 32
  --output-len 256 --ignore-eos --disable-tqdm)
for i in $(seq 1 "$repeats"); do
  python3 -m surge.cli bench serve "${common[@]}" --seed "$i" --result-file "$out/off-$i.json"
  python3 -m surge.cli bench serve "${common[@]}" --seed "$i" --result-file "$out/top5-$i.json" \
    --extra-body '{"logprobs": true, "top_logprobs": 5}'
done
python3 - "$out" <<'EOF'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
rows = {}
for kind in ("off", "top5"):
    runs = [json.loads(p.read_text()) for p in sorted(out.glob(f"{kind}-*.json"))]
    for i, r in enumerate(runs, 1):
        print(f"{kind}-{i}: {r['output_throughput']:.1f} tok/s, mean TPOT {r['mean_tpot_ms']:.2f} ms, "
              f"completed {r['completed']}, failed {r['failed']}")
    rows[kind] = [r["output_throughput"] for r in runs]
off, top5 = statistics.mean(rows["off"]), statistics.mean(rows["top5"])
print(f"mean output throughput: off {off:.1f}, top_logprobs 5 {top5:.1f} tok/s ({100 * (top5 / off - 1):+.1f} %); "
      f"spread without logprobs {min(rows['off']):.1f}..{max(rows['off']):.1f}")
EOF
