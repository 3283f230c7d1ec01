#!/usr/bin/env bash
# vLLM 0.26 as a peer on the GPU host (H200): the same model, engine flags and benchmark client as
# benchmarks/h200.sh uses for Surge. Usage:
#   benchmarks/peers/vllm.sh MODEL_DIR OUT_DIR [surge bench matrix args...]
# e.g. benchmarks/peers/vllm.sh .assets/qwen3-8b benchmarks/results/h200-qwen3-8b/peers/vllm --preset official-8b
# vLLM must be installed by ../shared/tools/vllm-peer/README.md first (parts unpacked in /tmp/peer,
# `bash /tmp/peer/device-install.sh` -> /tmp/site). This starts a fresh vLLM on port 8001 with
# /tmp/peer/serve-vllm.sh (its own session; VLLM_SERVER_DEV_MODE=1 so that it has
# POST /reset_prefix_cache, which the matrix calls before every point), runs `surge bench matrix`
# against it, and stops it (also when the matrix fails). Extra arguments go to the matrix, so a
# matrix can be split over several calls, each on a fresh server: add `--resume --stop-after 360`.
# Options before MODEL_DIR (issue 13; each optional):
#   --port N              vLLM's port (default 8001)
#   --gpu NAME            the GPU the roofline column assumes (default h200; e.g. h100-sxm)
#   --quantization fp8    vLLM's `--quantization fp8`; the roofline counts FP8 weight bytes
#   --kv-cache-dtype fp8  vLLM's `--kv-cache-dtype fp8`; the roofline counts 1 byte per K/V value
# Each also goes into the label (vllm-0.26-fp8, ...). One vLLM at a time (/tmp/peer/vllm.pid).
# e.g. CUDA_VISIBLE_DEVICES=1 benchmarks/peers/vllm.sh --port 8241 --quantization fp8 .assets/qwen3-8b \
#        runs/vllm-fp8 --preset official-8b
set -euo pipefail
port=8001
gpu=h200
vllm_extra=(); roof_extra=(); label=vllm-0.26
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="$2"; shift 2 ;;
    --gpu) gpu="$2"; shift 2 ;;
    --quantization) vllm_extra+=(--quantization "$2"); roof_extra+=(--roofline-dtype "$2"); label+="-$2"; shift 2 ;;
    --kv-cache-dtype) vllm_extra+=(--kv-cache-dtype "$2"); roof_extra+=(--roofline-kv-cache-dtype "$2"); label+="-kv$2"; shift 2 ;;
    --*) echo "vllm.sh: unknown option $1 (before MODEL_DIR: --port, --gpu, --quantization, --kv-cache-dtype)" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then echo "usage: vllm.sh [--port N] [--gpu NAME] [--quantization fp8] [--kv-cache-dtype fp8] MODEL_DIR OUT_DIR [matrix args...]" >&2; exit 2; fi
model="$1"; out="$2"; shift 2
peer=/tmp/peer
if [ ! -f "$peer/serve-vllm.sh" ] || ! PYTHONPATH=/tmp/site python3 -c "import vllm" 2>/dev/null; then
  echo "vllm.sh: vLLM is not installed; follow ../shared/tools/vllm-peer/README.md (/tmp/peer, /tmp/site)" >&2
  exit 2
fi
stop_vllm() {  # SIGINT to the session vLLM runs in, SIGKILL after 60 s
  [ -f "$peer/vllm.pid" ] || return 0
  local pid; pid=$(cat "$peer/vllm.pid")
  kill -0 "$pid" 2>/dev/null || return 0
  grep -q vllm "/proc/$pid/cmdline" 2>/dev/null || return 0  # the pid was reused by something else
  kill -INT -- "-$pid" 2>/dev/null || kill -INT "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 1; done
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
}
stop_vllm  # one left by an interrupted earlier call
if python3 -c "import socket,sys; s=socket.socket(); sys.exit(0 if s.connect_ex(('127.0.0.1',$port))==0 else 1)"; then
  echo "vllm.sh: port $port is already in use; stop that server first" >&2; exit 2
fi
mkdir -p "$out"
finish() {
  stop_vllm
  { echo "----- vLLM server log (/tmp/peer/vllm.log), $(date -u +%FT%TZ) -----"; cat "$peer/vllm.log"; } >> "$out/server.log" 2>/dev/null || true
}
trap finish EXIT
echo "vllm.sh: starting vLLM on port $port (log $peer/vllm.log, copied to $out/server.log at the end)"
VLLM_SERVER_DEV_MODE=1 bash "$peer/serve-vllm.sh" "$model" $port --load-format dummy --dtype bfloat16 \
  --max-num-seqs 256 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 ${vllm_extra[@]+"${vllm_extra[@]}"}
PYTHONPATH=/tmp/site python3 -c "import vllm; print('vllm', vllm.__version__)" > "$out/vllm-version.txt"
python3 -m surge.cli bench matrix --base-url http://127.0.0.1:$port --gpu "$gpu" --model-config "$model" \
  --disable-tqdm --label "$label" --output-dir "$out" ${roof_extra[@]+"${roof_extra[@]}"} "$@"
