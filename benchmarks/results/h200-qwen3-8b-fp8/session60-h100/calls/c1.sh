# session 60 call 1: the pending decode-form CUDA test; then Surge --quantization fp8 at HEAD (H200: the C1/C4 half; H100: C1,C64 x I32 x O256,O1024 against session 59)
set -u; . .gpu/s60/common.sh; git log --oneline -1 > $OUT/head.txt
t0=$(date +%s)
timeout 170 bash benchmarks/gpu_pending.sh $OUT/pending > /dev/null 2>&1; echo "pending rc=$? $(( $(date +%s) - t0 )) s"; tail -n 6 $OUT/pending/tests.txt
if [ "$gpu" = h200 ]; then
  timeout 400 bash benchmarks/h200.sh --port 8301 --gpu $gpu --quantization fp8 /tmp/assets/qwen3-8b /tmp/m/surge-fp8 1 --concurrency 1,4 --input-len 32,256,4096 --output-len 256,1024,4096 --label surge-fp8 > $OUT/a.txt 2>&1
else
  timeout 400 bash benchmarks/h200.sh --port 8301 --gpu $gpu --quantization fp8 /tmp/assets/qwen3-8b /tmp/m/surge-fp8 1 --concurrency 1,64 --input-len 32 --output-len 256,1024 --label surge-fp8 > $OUT/a.txt 2>&1
fi
echo "a rc=$? $(( $(date +%s) - t0 )) s"; grep "^|" $OUT/a.txt | tail -22; tail -3 $OUT/a.txt
gzip -f /tmp/m/surge-fp8/server.log; find /tmp/m -name '*.requests.json' -exec gzip -f {} \;
tar czf $OUT/surge-a.tgz -C /tmp m/surge-fp8
