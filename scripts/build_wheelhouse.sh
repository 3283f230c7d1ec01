#!/usr/bin/env bash
# Build a wheel bundle of Surge and the dependencies a CUDA torch host usually lacks (pure Python,
# plus the manylinux wheels of the compiled ones: msgspec, pyzmq, pydantic-core, httptools, uvloop,
# xgrammar, apache-tvm-ffi) for an air-gapped GPU host that already has torch, Triton and the rest
# of host_has below (and so is not given them). Run it on a machine with PyPI access.
#
#   scripts/build_wheelhouse.sh [DEST] [PYTHON_VERSION]      (defaults: .whl and 3.12)
#
# Install on the GPU host, next to its own torch (nothing is downgraded, nothing is fetched):
#   python3 -m pip install --no-index --find-links DEST surge
# or, into a private folder without touching the system site-packages:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site DEST/*.whl && export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.whl}"
pyver="${2:-3.12}"
mkdir -p "$dest"
# Packages a CUDA torch host usually lacks (pure Python, or manylinux wheels of compiled ones).
# Every dependency of Surge is here or in host_has (tests/test_wheelhouse_script.py checks it).
pkgs=(
  "msgspec==0.21.1" "pyzmq==27.1.0" "fastapi==0.121.3" "starlette==0.50.0" "uvicorn==0.38.0"
  "pydantic==2.12.5" "pydantic-core==2.41.5" "annotated-types==0.7.0" "typing-inspection==0.4.2"
  "annotated-doc==0.0.4" "httptools==0.7.1" "uvloop==0.22.1"
  "xgrammar==0.2.9" "apache-tvm-ffi==0.1.15.post2"
)
# Dependencies (and dependencies of the packages above) that a CUDA torch host already has; they
# are left to it, and the install there fails naming any it lacks (triton comes with CUDA torch).
host_has=(
  torch triton numpy jinja2 transformers tokenizers safetensors aiohttp tqdm matplotlib
  prometheus-client httpx anyio h11 click typing-extensions pyyaml
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dest" "${pkgs[@]}"
python3 -m pip wheel -q --no-deps -w "$dest" .
ls "$dest"
echo "the GPU host must already have: ${host_has[*]}"
