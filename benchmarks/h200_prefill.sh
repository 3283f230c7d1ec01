#!/usr/bin/env bash
# Prefill and TTFT on the GPU host (issue 14), Qwen3-8B with dummy bf16 weights. Stages (each well
# under 10 minutes; `all` runs them in order):
#   tests    the prefill attention GPU tests (new kernel, backend selection, paged kernel, runner)
#            and the decode-form GPU tests (small prefill / mixed steps through the decode graphs);
#   kernels  prefill_attention_bench.py: the paged kernel against the prefill kernel at 1x4096,
#            2x4096, 8x1024, 4096 over a 4096 prefix, 1x8192 (tile sweep), and short chunks over a
#            4096 prefix (where the prefill kernel starts to win);
#   profile  profile_decode.py --prefill at 4096 and 8192 tokens (per-kernel time of one step);
#   serve    first ttft_host.py on the GPU (each host stage of a 4096-token prompt's way to its
#            first token, fresh and cached, model work synchronized and timed apart; about two
#            minutes with start-up), then a fresh `surge serve` (the flags of benchmarks/h200.sh;
#            each request's log line in server.log splits its TTFT: to the engine, in the
#            engine, back): ttft_check.py (a fresh
#            4096-token prompt at C1, then the same prompt again: TTFT and the prefix-cache hit
#            count; the cached prompt's last block replays a decode graph in decode form), the
#            same for a 32-token prompt (a short prompt's first step), then `surge bench serve`
#            at C1/I4096/O256, C4/I4096/O256 and C1/I32/O256 (short-prompt TTFT).
# Usage (from the repository root): benchmarks/h200_prefill.sh MODEL_DIR OUT_DIR [STAGE]
set -uo pipefail
model="$1"; out="$2"; stage="${3:-all}"
port=8000
mkdir -p "$out"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}."
git rev-parse HEAD > "$out/commit.txt" 2>/dev/null || true

if [ "$stage" = tests ] || [ "$stage" = all ]; then
  python3 -m pytest -q tests/kernels/test_prefill_attention.py tests/kernels/test_triton_attention_backend.py \
    tests/kernels/test_paged_attention.py tests/worker/test_prefill_kernel_runner_cpu.py \
    tests/worker/test_decode_form_gpu.py tests/worker/test_decode_form_cpu.py 2>&1 | tail -n 30 \
    | tee "$out/gpu_tests.txt"
fi
if [ "$stage" = kernels ] || [ "$stage" = all ]; then
  python3 benchmarks/prefill_attention_bench.py --sweep --out "$out/prefill_attention.json" 2>&1 \
    | tee "$out/prefill_attention.txt"
fi
if [ "$stage" = profile ] || [ "$stage" = all ]; then
  python3 benchmarks/profile_decode.py --model "$model" --prefill --input-len 4096 --steps 3 --top 20 2>&1 \
    | tee "$out/prefill4096.txt"
  python3 benchmarks/profile_decode.py --model "$model" --prefill --input-len 8192 --steps 2 --top 12 2>&1 \
    | tee "$out/prefill8192.txt"
fi
if [ "$stage" = serve ] || [ "$stage" = all ]; then
  timeout 300 python3 benchmarks/ttft_host.py --model "$model" --load-format dummy --device cuda --input-len 4096 \
    --rounds 7 --out "$out/ttft_host.json" 2>&1 | tail -n 26 | tee "$out/ttft_host.txt"
  if python3 -c "import socket,sys; sys.exit(socket.socket().connect_ex(('127.0.0.1',$port)) != 0)"; then
    echo "h200_prefill.sh: port $port is already in use; stop that server first" >&2; exit 2
  fi
  python3 -m surge.cli serve --model "$model" --port $port --load-format dummy --dtype bfloat16 \
    --max-num-seqs 256 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 \
    --stream-interval 1 --log-interval 30 > "$out/server.log" 2>&1 &
  server=$!
  trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
  for _ in $(seq 1 300); do
    if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then break; fi
    if ! kill -0 $server 2>/dev/null; then tail -50 "$out/server.log"; exit 1; fi
    sleep 1
  done
  python3 benchmarks/ttft_check.py --base-url http://127.0.0.1:$port --input-len 4096 --rounds 5 \
    --out "$out/ttft_4096.json" 2>&1 | tee "$out/ttft_4096.txt"
  python3 benchmarks/ttft_check.py --base-url http://127.0.0.1:$port --input-len 32 --rounds 10 \
    --out "$out/ttft_32.json" 2>&1 | tee "$out/ttft_32.txt"
  for c in 1 4; do
    python3 -m surge.cli bench serve --base-url http://127.0.0.1:$port --tokenizer "$model" \
      --input-len 4096 --output-len 256 --num-prompts $((c * 2)) --max-concurrency $c --ignore-eos \
      --disable-tqdm --label "C${c}_I4096_O256" --result-file "$out/C${c}_I4096_O256.json" 2>&1 | tail -n 25 \
      | tee "$out/C${c}_I4096_O256.txt"
  done
  python3 -m surge.cli bench serve --base-url http://127.0.0.1:$port --tokenizer "$model" \
    --input-len 32 --output-len 256 --num-prompts 8 --max-concurrency 1 --ignore-eos \
    --disable-tqdm --label "C1_I32_O256" --result-file "$out/C1_I32_O256.json" 2>&1 | tail -n 25 \
    | tee "$out/C1_I32_O256.txt"
fi
