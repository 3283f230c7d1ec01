"""Make a Qwen3-8B-FP8 model folder for dummy-weight benchmarks: the tokenizer files of a
Qwen3-8B folder plus ``benchmarks/configs/qwen3-8b-fp8/config.json`` (Qwen3-8B's config with
the ``quantization_config`` layout of the published Qwen/Qwen3-8B-FP8: e4m3, dynamic
activations, 128 x 128 weight blocks).

Usage: python3 benchmarks/fp8_model_dir.py SRC_QWEN3_8B_DIR DST_DIR
e.g.   python3 benchmarks/fp8_model_dir.py .assets/qwen3-8b /tmp/qwen3-8b-fp8
Then:  surge serve --model /tmp/qwen3-8b-fp8 --load-format dummy
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

CONFIG = Path(__file__).resolve().parent / "configs" / "qwen3-8b-fp8" / "config.json"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = Path(argv[0]), Path(argv[1])
    if not (src / "config.json").is_file():
        print(f"fp8_model_dir: {src} has no config.json", file=sys.stderr)
        return 2
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "config.json" and not f.name.endswith((".safetensors", ".index.json")):
            shutil.copy(f, dst / f.name)
    shutil.copy(CONFIG, dst / "config.json")
    print(dst)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
