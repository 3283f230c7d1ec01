#!/usr/bin/env bash
# Benchmarks on the GPU host (H200): Surge serving Qwen3-8B (real config and tokenizer, dummy
# weights, bf16, TP=1). Usage:
#   benchmarks/h200.sh MODEL_DIR OUT_DIR STREAM_INTERVAL [surge bench matrix args...]
# e.g. benchmarks/h200.sh .assets/qwen3-8b runs/m1 1 --preset official-8b
# Starts a fresh `surge serve` on port 8000 (the same engine flags as benchmarks/peers/vllm.sh gives
# vLLM), waits for /health, runs `surge bench matrix` against it, stops it. Extra arguments go to the
# matrix, so a matrix can be split over several calls, each on a fresh server:
#   benchmarks/h200.sh .assets/qwen3-8b runs/m1 1 --preset official-8b --resume --stop-after 420
#   (again with the same arguments: --resume skips the points already in runs/m1)
# Options before MODEL_DIR (issue 13; each optional):
#   --port N              the server's port (default 8000): two matrices at once on two GPUs of a
#                         host take CUDA_VISIBLE_DEVICES=0 / =1 and two ports
#   --gpu NAME            the GPU the roofline column assumes (`surge bench roofline --gpu`; default h200,
#                         e.g. h100-sxm when the host has an H100)
#   --quantization fp8    FP8 weights, quantized at load; the roofline counts FP8 weight bytes
#   --kv-cache-dtype fp8  an FP8 KV cache; the roofline counts 1 byte per K/V value
#   --api-server-count N  N API server processes on the port (default 1)
#   --no-stream-decode    one launch per GEMM at one token; --stream-attention / --no-stream-attention: attention
#                         inside the stream kernel required / never (default: the server's, wherever it can)
# e.g. CUDA_VISIBLE_DEVICES=0 benchmarks/h200.sh --port 8240 --quantization fp8 .assets/qwen3-8b \
#        runs/fp8 1 --preset official-8b --label surge-fp8
set -euo pipefail
port=8000
gpu=h200
serve_extra=(); roof_extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="$2"; shift 2 ;;
    --gpu) gpu="$2"; shift 2 ;;
    --quantization) serve_extra+=(--quantization "$2"); roof_extra+=(--roofline-dtype "$2"); shift 2 ;;
    --kv-cache-dtype) serve_extra+=(--kv-cache-dtype "$2"); roof_extra+=(--roofline-kv-cache-dtype "$2"); shift 2 ;;
    --api-server-count) serve_extra+=(--api-server-count "$2"); shift 2 ;;
    --no-stream-decode) serve_extra+=(--no-stream-decode); shift ;;
    --stream-attention) serve_extra+=(--stream-attention); shift ;;
    --no-stream-attention) serve_extra+=(--no-stream-attention); shift ;;
    --*) echo "h200.sh: unknown option $1 (before MODEL_DIR: --port, --gpu, --quantization, --kv-cache-dtype, --api-server-count, --no-stream-decode, --[no-]stream-attention)" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -lt 3 ]; then echo "usage: h200.sh [--port N] [--gpu NAME] [--quantization fp8] [--kv-cache-dtype fp8] [--api-server-count N] [--no-stream-decode] [--[no-]stream-attention] MODEL_DIR OUT_DIR STREAM_INTERVAL [matrix args...]" >&2; exit 2; fi
model="$1"; out="$2"; interval="$3"; shift 3
mkdir -p "$out"
if python3 -c "import socket,sys; s=socket.socket(); sys.exit(0 if s.connect_ex(('127.0.0.1',$port))==0 else 1)"; then
  echo "h200.sh: port $port is already in use; stop that server first" >&2; exit 2
fi
log="$out/server.log"
[ -e "$log" ] && echo "----- new server $(date -u +%FT%TZ) -----" >> "$log"
python3 -m surge.cli serve --model "$model" --port $port --load-format dummy --dtype bfloat16 \
  --max-num-seqs 256 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 \
  --stream-interval "$interval" --log-interval 30 ${serve_extra[@]+"${serve_extra[@]}"} >> "$log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
echo "h200.sh: surge serve (pid $server), log $log, waiting for http://127.0.0.1:$port/health"
for _ in $(seq 1 300); do
  if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then break; fi
  if ! kill -0 $server 2>/dev/null; then tail -50 "$log"; exit 1; fi
  sleep 1
done
grep -h "KV pool" "$log" | tail -n 1 || true  # the pool's size (twice the tokens with an FP8 KV cache)
python3 -m surge.cli bench matrix --base-url http://127.0.0.1:$port --gpu "$gpu" --model-config "$model" \
  --disable-tqdm --output-dir "$out" ${roof_extra[@]+"${roof_extra[@]}"} "$@"
