# session 60 calls 2-6, run inline on the same warm H100 (each sourced .gpu/s60/common.sh first)
# call 2: the decode-form CUDA test again, without the 170 s cut (call 1's first run compiled its kernels cold)
timeout 420 python -m pytest -q -p no:cacheprovider -o timeout=0 -rfEs --tb=short --durations=0 tests/worker/test_decode_form_gpu.py
# call 3: a second fresh Surge server, the same four points, two repeats each
bash benchmarks/h200.sh --port 8302 --gpu $gpu --quantization fp8 /tmp/assets/qwen3-8b /tmp/m/surge-fp8-2 1 --repeats 2 --concurrency 1,64 --input-len 32 --output-len 256,1024 --label surge-fp8
# calls 4 and 5: carried the vLLM peer's parts p1 and p2 (no command but copying them to /tmp/peer)
# call 6: the last part; install; vLLM 0.26 --quantization fp8 on a fresh server, the same four points, two repeats
cat /tmp/peer/part.* | tar x -C /tmp/peer && bash /tmp/peer/device-install.sh
bash benchmarks/peers/vllm.sh --port 8241 --quantization fp8 /tmp/assets/qwen3-8b /tmp/v/vllm-fp8 --repeats 2 --concurrency 1,64 --input-len 32 --output-len 256,1024 --gpu h100-sxm --roofline-dtype fp8
# call 7: vLLM's C64/I32/O256 again on another fresh server, three repeats (its first burst after start took 9-10 s to first tokens)
bash benchmarks/peers/vllm.sh --port 8242 --quantization fp8 /tmp/assets/qwen3-8b /tmp/v/vllm-fp8-r --repeats 3 --concurrency 64 --input-len 32 --output-len 256 --gpu h100-sxm --roofline-dtype fp8
