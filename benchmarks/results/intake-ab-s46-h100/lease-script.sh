# session 46: burst intake A/B, 34cfec7 (session 28, h11) in .gpu/old vs HEAD (httptools) on one host; C16,C64 x I32/O256 x 3 repeats, alternated twice

set -u
echo "before pre.sh:"; python3 -c "import uvloop; print('uvloop', uvloop.__version__)" 2>&1 | tail -1; python3 -c "import httptools; print('httptools', httptools.__version__)" 2>&1 | tail -1
source .gpu/pre.sh
python3 -c "import uvloop; print('uvloop', uvloop.__version__)" 2>&1 | tail -1; python3 -c "import httptools; print('httptools', httptools.__version__)" 2>&1 | tail -1
ROOT=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in *H100*) GPU=h100;; *) GPU=h200;; esac
t0=$(date +%s); mkdir -p /tmp/r
M=$ROOT/.assets/qwen3-8b
serve() {  # dir port log extra... (sets s)
  local dir=$1 port=$2 log=$3; shift 3
  (cd $dir && PYTHONPATH=/tmp/site:$dir exec python3 -m surge.cli serve --model $M --port $port --load-format dummy \
    --max-num-seqs 256 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 \
    --stream-interval 1 --log-interval 30 "$@" >> "$log" 2>&1) &
  s=$!
}
stop() { pkill -INT -f "surge.cli serve" 2>/dev/null; for _ in $(seq 1 80); do pgrep -f "surge.cli serve" >/dev/null || return 0; sleep 0.5; done; pkill -9 -f "surge.cli serve"; sleep 3; }
gpufree() { for _ in $(seq 1 60); do u=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1); [ "${u:-0}" -lt 3000 ] && return 0; sleep 0.5; done; echo "GPU memory still used: $u MiB"; }
health() { for _ in $(seq 1 300); do python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2)" 2>/dev/null && return 0; kill -0 $2 2>/dev/null || return 1; sleep 1; done; return 1; }
one() {  # name dir port
  local name=$1 dir=$2 port=$3
  mkdir -p /tmp/r/$name; serve $dir $port /tmp/r/$name/server.log --dtype bfloat16 --quantization fp8
  if health $port $s; then echo "$name ready $(( $(date +%s) - t0 )) s"
    timeout 120 python3 -m surge.cli bench matrix --base-url http://127.0.0.1:$port --gpu $GPU --model-config $M \
      --disable-tqdm --output-dir /tmp/r/$name --concurrency 16,64 --input-len 32 --output-len 256 --repeats 3 \
      --label $name --roofline-dtype fp8
    echo "$name rc=$? $(( $(date +%s) - t0 )) s"
  else echo "$name server failed"; tail -20 /tmp/r/$name/server.log; fi
  stop; gpufree; grep -h "HTTP\|httptools\|h11" /tmp/r/$name/server.log | head -3; gzip -f /tmp/r/$name/server.log
}
one old-1 $ROOT/.gpu/old 8003
one new-1 $ROOT 8004
one old-2 $ROOT/.gpu/old 8005
one new-2 $ROOT 8006
for f in /tmp/r/*/summary.md; do echo "== $f"; sed -n 1,20p $f | grep "^|"; done
find /tmp/r -name '*.requests.json' -exec gzip -f {} \;
tar czf $OUT/s46b.tgz -C /tmp r
