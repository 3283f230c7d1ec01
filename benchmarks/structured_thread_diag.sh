# Issue 11 diagnosis: the CPU of every thread of the `surge serve` processes during one C64 I256/O1024
# json_schema run, twice: as is ("base") and with OMP_NUM_THREADS=1 exported ("omp1"). Prints the
# throughput and the threads that used the most CPU ticks. Usage (repository root, GPU host):
#   bash benchmarks/structured_thread_diag.sh .assets/qwen3-8b OUT [PORT]
M=${1:?MODEL_DIR}; R=${2:?OUT_DIR}; port=${3:-8120}; mkdir -p $R
schema='{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","age","tags"]}'
rf="{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"person\",\"schema\":$schema}}}"
snap() { for p in $(pgrep -f "surge.cli serve" ; pgrep -P $(pgrep -f "surge.cli serve" | head -1)); do echo "$p ALL proc $(awk '{print $14+$15}' /proc/$p/stat)"; for t in /proc/$p/task/*; do echo "$p $(basename $t) $(cat $t/comm | tr ' ' _) $(awk '{print $14+$15}' $t/stat)"; done; done 2>/dev/null | sort -u; }
for v in base omp1; do
  if [ $v = omp1 ]; then export OMP_NUM_THREADS=1; else unset OMP_NUM_THREADS; fi
  python3 -m surge.cli serve --model $M --port $port --load-format dummy --dtype bfloat16 --gpu-memory-utilization 0.9 --max-num-seqs 256 --max-num-batched-tokens 8192 > $R/server-$v.log 2>&1 &
  s=$!
  for _ in $(seq 1 300); do python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null && break; sleep 1; done
  python3 -m surge.cli bench serve --base-url http://127.0.0.1:$port --tokenizer $M --input-len 256 --output-len 64 --num-prompts 8 --max-concurrency 8 --ignore-eos --disable-tqdm --extra-body "$rf" > /dev/null 2>&1
  snap > $R/snap0-$v.txt
  python3 -m surge.cli bench serve --base-url http://127.0.0.1:$port --tokenizer $M --input-len 256 --output-len 1024 --num-prompts 64 --max-concurrency 64 --ignore-eos --disable-tqdm --extra-body "$rf" --result-file $R/C64-json-$v.json > $R/bench-$v.txt 2>&1
  snap > $R/snap1-$v.txt
  python3 -c "import torch; print('torch threads', torch.get_num_threads())"
  grep "Output token throughput\|Mean TPOT\|P99 ITL" $R/bench-$v.txt
  join -j 1 <(awk '{print $1"/"$2"/"$3, $4}' $R/snap0-$v.txt | sort) <(awk '{print $1"/"$2"/"$3, $4}' $R/snap1-$v.txt | sort) | awk '{print $3-$2, $1}' | sort -rn | head -12
  awk '{print $1"/"$2"/"$3}' $R/snap1-$v.txt | sort > /tmp/a; awk '{print $1"/"$2"/"$3}' $R/snap0-$v.txt | sort > /tmp/b; echo "new threads: $(comm -23 /tmp/a /tmp/b | wc -l)"; comm -23 /tmp/a /tmp/b | head -5
  kill -INT $s; wait $s
done
