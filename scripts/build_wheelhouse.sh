#!/usr/bin/env bash
# Build a wheel bundle of Surge and its dependencies (pure Python, plus the manylinux wheels of
# xgrammar and apache-tvm-ffi for structured outputs) for an air-gapped GPU host that
# already has torch and Triton (and so is not given them). Run it on a machine with PyPI access.
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
# Packages a CUDA torch host usually lacks. Dependencies the host already has (numpy, jinja2,
# transformers, tokenizers, safetensors, aiohttp, tqdm, matplotlib, prometheus-client, httpx,
# anyio, h11, click, typing-extensions) are left to it.
pkgs=(
  "msgspec==0.21.1" "pyzmq==27.1.0" "fastapi==0.121.3" "starlette==0.50.0" "uvicorn==0.38.0"
  "pydantic==2.12.5" "pydantic-core==2.41.5" "annotated-types==0.7.0" "typing-inspection==0.4.2"
  "annotated-doc==0.0.4" "httptools==0.7.1"
  "xgrammar==0.2.9" "apache-tvm-ffi==0.1.15.post2"
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dest" "${pkgs[@]}"
python3 -m pip wheel -q --no-deps -w "$dest" .
ls "$dest"
