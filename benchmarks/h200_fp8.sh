#!/usr/bin/env bash
# Issue 13's FP8 runs on the GPU host (H200), one step per call, each resumable. Usage, from the
# repository root:
#   benchmarks/h200_fp8.sh MODEL_DIR RUNS STEP [STOP_AFTER_S]
# MODEL_DIR: Qwen3-8B's folder (config + tokenizer; dummy weights), e.g. .assets/qwen3-8b.
# RUNS: where the results go, e.g. /tmp/fp8runs (one folder or file per step).
# The GPU is the one CUDA_VISIBLE_DEVICES names: two steps can run at once on two GPUs.
# STEPs:
#   surge-fp8      the 30-point matrix, Surge --quantization fp8 (port 8240; since session 26 this
#                  includes attention inside the stream kernel up to 2,048 tokens) -> RUNS/surge-fp8/
#   surge-fp8-kv8  the same with --kv-cache-dtype fp8 (port 8242)                 -> RUNS/surge-fp8-kv8/
#   surge-fp8-chain the same with --no-stream-decode: one launch per GEMM at one token (port 8244) -> RUNS/surge-fp8-chain/
#   surge-fp8-sattn the same with --stream-attention (required, not just where it can; port 8245)
#                                                                                 -> RUNS/surge-fp8-sattn/
#   stream-attn    --stream-attention against without it (about 6 min): the stream kernels' GPU
#                  tests, stream_attention_bench.py at 32 to 8,192 tokens of context, then C1 at
#                  I32/I4096 x O256/O1024 on fresh servers, with, without (--no-stream-attention), with, without
#                                        -> RUNS/stream-attn/ (tests.txt, attn.jsonl, c1-*/)
#   surge-fp8-ckpt the same on an FP8 checkpoint's layout (128 x 128 block scales, as Qwen's
#                  FP8 release; made by fp8_model_dir.py from MODEL_DIR, port 8243;
#                  the roofline reads FP8 weights from its config)             -> RUNS/surge-fp8-ckpt/
#   vllm-fp8       vLLM 0.26 --quantization fp8 (port 8241; benchmarks/peers/vllm.sh, vLLM
#                  installed in /tmp/site first)                                  -> RUNS/vllm-fp8/
#   sweep          the split-K sweep at M = 1, 2, 4, 8, 16, 32, 64, both reductions (about 2.5
#                  min), then the table and SPLITK_MEASURED (apply with fp8_gemm_bench.py --emit
#                  RUNS/fp8_sweep.json --write-source surge/quant/fp8_linear.py)
#                                        -> RUNS/fp8_sweep.json, fp8_sweep.txt, fp8_emit.txt
#   gemm           every FP8 GEMM path per shape and M (about 1 min); prints TRITON_FASTER and
#                  SPLITK_BLOCK_FASTER                                   -> RUNS/fp8_gemm_bench.txt
#   tests          the FP8 GPU tests                                     -> RUNS/gpu-tests.txt
# A matrix step starts a fresh server and, when RUNS/STEP/summary.json exists, adds --resume:
# rerun the same command to finish a matrix that STOP_AFTER_S (default 380: no new point after
# that many seconds of matrix time) cut; once all 30 points succeeded it exits at once, starting
# nothing. Every matrix must end with 30/30 points at exact lengths.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: h200_fp8.sh MODEL_DIR RUNS {surge-fp8|surge-fp8-kv8|surge-fp8-ckpt|surge-fp8-chain|surge-fp8-sattn|vllm-fp8|sweep|gemm|tests|stream-attn} [STOP_AFTER_S]" >&2
  exit 2
fi
model="$1"; runs="$2"; step="$3"; stop="${4:-380}"
mkdir -p "$runs"
here="$(cd "$(dirname "$0")" && pwd)"

complete() {  # complete DIR: the matrix in DIR has every planned point successful
  [ -f "$1/summary.json" ] && python3 -c "import json, sys; d = json.load(open(sys.argv[1])); \
sys.exit(0 if d['num_successful'] == d['num_planned_points'] else 1)" "$1/summary.json"
}
case "$step" in
  surge-fp8|surge-fp8-kv8|surge-fp8-ckpt|surge-fp8-chain|surge-fp8-sattn|vllm-fp8)
    if complete "$runs/$step"; then
      echo "h200_fp8.sh: $step is complete ($runs/$step/summary.json): nothing to run"; exit 0
    fi ;;
esac

matrix_args() {  # matrix_args DIR: the common matrix flags, with --resume when DIR has a summary
  local args=(--preset official-8b --stop-after "$stop")
  [ -f "$1/summary.json" ] && args+=(--resume)
  echo "${args[@]}"
}

case "$step" in
  surge-fp8)
    # shellcheck disable=SC2046
    bash "$here/h200.sh" --port 8240 --quantization fp8 "$model" "$runs/$step" 1 \
      $(matrix_args "$runs/$step") --label surge-fp8
    ;;
  surge-fp8-chain)
    # shellcheck disable=SC2046
    bash "$here/h200.sh" --port 8244 --quantization fp8 --no-stream-decode "$model" "$runs/$step" 1 \
      $(matrix_args "$runs/$step") --label surge-fp8-chain
    ;;
  surge-fp8-sattn)
    # shellcheck disable=SC2046
    bash "$here/h200.sh" --port 8245 --quantization fp8 --stream-attention "$model" "$runs/$step" 1 \
      $(matrix_args "$runs/$step") --label surge-fp8-sattn
    ;;
  stream-attn)
    d="$runs/stream-attn"
    mkdir -p "$d"
    python3 -m pytest -q -p no:cacheprovider -o timeout=0 --tb=short tests/kernels/test_stream_attention.py \
      tests/kernels/test_stream_decode.py 2>&1 | tail -n 5 | tee "$d/tests.txt"
    python3 -m pytest -q -p no:cacheprovider -o timeout=0 --tb=short tests/quant/test_fp8_gpu.py -k stream \
      2>&1 | tail -n 5 | tee -a "$d/tests.txt"
    PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}." python3 "$here/stream_attention_bench.py" \
      --contexts 32 288 1024 4096 8192 --json "$d/attn.jsonl" 2>&1 | tee "$d/attn.txt"
    i=0
    for v in with without with without; do
      i=$((i + 1))
      flag=(--no-stream-attention); [ "$v" = with ] && flag=(--stream-attention)
      bash "$here/h200.sh" --port 8246 --quantization fp8 "${flag[@]}" "$model" "$d/c1-$i-$v" 1 \
        --concurrency 1 --input-len 32,4096 --output-len 256,1024 --label "c1-$v" > "$d/c1-$i-$v.log" 2>&1
      grep -h "stream kernel\|attention" "$d/c1-$i-$v/server.log" | head -n 3
      grep '^| 1 |' "$d/c1-$i-$v/summary.md" | sed "s/^/$v /"
    done
    ;;
  surge-fp8-kv8)
    # shellcheck disable=SC2046
    bash "$here/h200.sh" --port 8242 --quantization fp8 --kv-cache-dtype fp8 "$model" "$runs/$step" 1 \
      $(matrix_args "$runs/$step") --label surge-fp8-kv8
    ;;
  surge-fp8-ckpt)
    ckpt="$runs/qwen3-8b-fp8-model"
    [ -f "$ckpt/config.json" ] || python3 "$here/fp8_model_dir.py" "$model" "$ckpt"
    # shellcheck disable=SC2046
    bash "$here/h200.sh" --port 8243 "$ckpt" "$runs/$step" 1 $(matrix_args "$runs/$step") --label surge-fp8-ckpt
    ;;
  vllm-fp8)
    # shellcheck disable=SC2046
    bash "$here/peers/vllm.sh" --port 8241 --quantization fp8 "$model" "$runs/$step" $(matrix_args "$runs/$step")
    ;;
  sweep)
    PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}." python3 "$here/fp8_gemm_bench.py" --sweep --json "$runs/fp8_sweep.json" \
      2>&1 | tee -a "$runs/fp8_sweep.txt"
    PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}." python3 "$here/fp8_gemm_bench.py" --emit "$runs/fp8_sweep.json" | tee "$runs/fp8_emit.txt"
    ;;
  gemm)
    PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}." python3 "$here/fp8_gemm_bench.py" --m 1 2 4 8 16 64 512 2>&1 | tee "$runs/fp8_gemm_bench.txt"
    ;;
  tests)
    python3 -m pytest -q -p no:cacheprovider -o timeout=0 -rA --tb=short \
      tests/quant/test_fp8_gpu.py tests/kernels/test_fp8_gemm_splitk.py tests/kernels/test_fp8_gemm_splitk_gpu.py \
      tests/kernels/test_fp8_gemm_splitk_tma.py tests/kernels/test_fp8_gemm_splitk_tma_gpu.py \
      tests/kernels/test_fp8_fused_input.py tests/kernels/test_add_rmsnorm.py tests/kernels/test_silu_and_mul.py 2>&1 | tee "$runs/gpu-tests.txt"
    ;;
  *)
    echo "h200_fp8.sh: unknown step $step" >&2; exit 2 ;;
esac
