#!/usr/bin/env bash
# Tensor and data parallelism on two H200s (issue 12). Dummy bf16 weights, real configs and
# tokenizers. Usage, from the repository root on the 2-GPU host:
#   benchmarks/h200x2.sh ASSETS OUT [STEP...]
# ASSETS: the folder holding models/{qwen3-8b,qwen3-32b,llama-3.1-70b-instruct}
#         (../shared/assets); OUT: e.g. benchmarks/results/h200x2.
# STEPs (default: all, in this order; each is a few minutes):
#   smoke      benchmarks/tp_smoke.py on Qwen3-8B: TP=1, TP=2 eager, TP=2 with CUDA graphs
#              (greedy ids, start-up time, batch-1 decode tok/s) -> OUT/smoke.jsonl
#   qwen8b     Qwen3-8B TP=1 (GPU 0), TP=2 and DP=2 at C1,C64,C256 x I256 x O1024, + compare
#   qwen8b-api4  the same three with --api-server-count 4 (4 API processes share the port and
#              the engines; benchmarks/results/host_ceiling.md), + compare against qwen8b's
#   qwen32b    Qwen3-32B TP=1 (GPU 0) and TP=2, same points, + compare
#   llama70b   Llama-3.1-70B-Instruct TP=2 at C1,C16,C64 x I256 x O1024
# Every point must finish with every request at its exact length (the matrix checks it).
# The matrices' pct_of_roofline is per GPU under TP (--roofline-tp); the DP=2 run's is one
# replica's ceiling (of one GPU). The TP ceilings also go to OUT/*/roofline-tp*.md.
set -euo pipefail
assets="$1"; out="$2"; shift 2
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(smoke qwen8b qwen32b llama70b)
models="$assets/models"
mkdir -p "$out"

matrix() {  # matrix GPUS NAME MODEL_DIR CONCURRENCY TP SERVE_FLAGS...  (TP: the roofline's)
  local gpus="$1" name="$2" model="$3" conc="$4" tp="$5"; shift 5
  CUDA_VISIBLE_DEVICES="$gpus" python3 -m surge.cli bench matrix --gpu h200 --model-config "$model" --disable-tqdm \
    --roofline-tp "$tp" \
    --concurrency "$conc" --input-len 256 --output-len 1024 --output-dir "$out/$name" \
    --server-timeout 1800 \
    --launch "python3 -m surge.cli serve --model $model --load-format dummy --dtype bfloat16 --port 8000 --log-interval 30 $*"
}

roofline() {  # roofline NAME MODEL_DIR CONCURRENCY TP
  python3 -m surge.cli bench roofline --model "$2" --gpu h200 -tp "$4" \
    --concurrency "$3" --input-len 256 --output-len 1024 > "$out/$1/roofline-tp$4.md"
}

for step in "${steps[@]}"; do
  case "$step" in
    smoke)
      m="$models/qwen3-8b"
      {
        CUDA_VISIBLE_DEVICES=0 python3 benchmarks/tp_smoke.py "$m" --tp 1
        python3 benchmarks/tp_smoke.py "$m" --tp 2 --enforce-eager
        python3 benchmarks/tp_smoke.py "$m" --tp 2
      } 2> "$out/smoke.log" | tee "$out/smoke.jsonl"
      ;;
    qwen8b)
      m="$models/qwen3-8b"
      matrix 0 qwen3-8b/tp1 "$m" 1,64,256 1
      matrix 0,1 qwen3-8b/tp2 "$m" 1,64,256 2 -tp 2
      matrix 0,1 qwen3-8b/dp2 "$m" 1,64,256 1 -dp 2
      roofline qwen3-8b/tp2 "$m" 1,64,256 2
      python3 -m surge.cli bench compare "$out/qwen3-8b/tp1" "$out/qwen3-8b/tp2" \
        --plot "$out/qwen3-8b/compare-tp1-vs-tp2.png" | tee "$out/qwen3-8b/compare-tp1-vs-tp2.md"
      python3 -m surge.cli bench compare "$out/qwen3-8b/tp1" "$out/qwen3-8b/dp2" \
        --plot "$out/qwen3-8b/compare-tp1-vs-dp2.png" | tee "$out/qwen3-8b/compare-tp1-vs-dp2.md"
      ;;
    qwen8b-api4)
      m="$models/qwen3-8b"
      matrix 0 qwen3-8b-api4/tp1 "$m" 1,64,256 1 --api-server-count 4
      matrix 0,1 qwen3-8b-api4/tp2 "$m" 1,64,256 2 -tp 2 --api-server-count 4
      matrix 0,1 qwen3-8b-api4/dp2 "$m" 1,64,256 1 -dp 2 --api-server-count 4
      for layout in tp1 tp2 dp2; do
        python3 -m surge.cli bench compare "$out/qwen3-8b/$layout" "$out/qwen3-8b-api4/$layout" \
          | tee "$out/qwen3-8b-api4/compare-api1-vs-api4-$layout.md"
      done
      python3 -m surge.cli bench compare "$out/qwen3-8b-api4/tp1" "$out/qwen3-8b-api4/dp2" \
        | tee "$out/qwen3-8b-api4/compare-tp1-vs-dp2.md"
      ;;
    qwen32b)
      m="$models/qwen3-32b"
      matrix 0 qwen3-32b/tp1 "$m" 1,64,256 1
      matrix 0,1 qwen3-32b/tp2 "$m" 1,64,256 2 -tp 2
      roofline qwen3-32b/tp2 "$m" 1,64,256 2
      python3 -m surge.cli bench compare "$out/qwen3-32b/tp1" "$out/qwen3-32b/tp2" \
        --plot "$out/qwen3-32b/compare-tp1-vs-tp2.png" | tee "$out/qwen3-32b/compare-tp1-vs-tp2.md"
      ;;
    llama70b)
      m="$models/llama-3.1-70b-instruct"
      # 131072-token context: cap it so the profiling pass and the block tables stay small
      matrix 0,1 llama-3.1-70b/tp2 "$m" 1,16,64 2 -tp 2 --max-model-len 8192
      roofline llama-3.1-70b/tp2 "$m" 1,16,64 2
      ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
