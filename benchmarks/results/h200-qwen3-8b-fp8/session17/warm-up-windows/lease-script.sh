set -u
source .gpu/pre.sh
R=/tmp/keepW; mkdir -p $R
M=$TOP/.assets/qwen3-8b
P=8250
echo "== serve (cold) $(date -u +%T)"
python3 -m surge.cli serve --model $M --port $P --load-format dummy --dtype bfloat16 --quantization fp8 \
  --max-num-seqs 256 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 --log-interval 30 > $R/server.log 2>&1 &
S=$!
for _ in $(seq 1 330); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$P/health', timeout=2)" 2>/dev/null && break
  kill -0 $S 2>/dev/null || break; sleep 1
done
grep -E "warm-up in|engine ready" $R/server.log | cut -c1-120
for k in 5 100 1000 20; do
  timeout 60 python3 -m surge.cli bench serve --base-url http://127.0.0.1:$P --model-config $M --input-len 32 --output-len 64 \
    --num-prompts 16 --max-concurrency 16 --extra-body "{\"top_k\": $k}" --disable-tqdm --result-file $R/topk$k.json > $R/topk$k.out 2>&1
  echo "top_k $k rc=$? $(python3 -c "import json; j=json.load(open('$R/topk$k.json')); print('ok', j['completed'], 'failed', j['failed'], 'mean TTFT %.1f ms, max output tok/s %.0f, duration %.2f s' % (j['mean_ttft_ms'], j['output_throughput'], j['duration']))" 2>&1 | tail -1)"
done
kill -INT $S; wait $S
gzip -f $R/server.log; tar czf $OUT/w.tgz -C $R .
echo "== gpu tests $(date -u +%T)"
timeout 240 python3 -m pytest -q -m gpu tests/kernels/test_window_sample.py tests/kernels/test_topk.py > $R/gpu-tests-window.txt 2>&1; echo "rc=$?"; tail -2 $R/gpu-tests-window.txt
tar czf $OUT/w.tgz -C $R .
echo "== steps $(date -u +%T)"
timeout 150 python3 benchmarks/decode_step_sweep.py --model $M --quantization fp8 --sample --batch 1 64 --steps 300 --label window-runtime-flags --json $R/steps.jsonl 2>&1 | grep -E "batch|Error" | tail -4
tar czf $OUT/w.tgz -C $R .
echo "== done $(date -u +%T)"
