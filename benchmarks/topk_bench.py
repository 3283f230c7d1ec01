"""The sampler's top-k window: ``torch.topk`` against :func:`surge.kernels.topk.topk_rows`.

Times both inside CUDA graphs on ``[B, V]`` float32 logits (Qwen3's vocabulary by default) and
checks that the values are equal. Writes one JSON line per (B, k). Run on a GPU from the
repository root::

    python3 benchmarks/topk_bench.py --rows 1 16 64 --k 32 64
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemm_bench import time_graph  # noqa: E402

from surge.kernels.topk import topk_rows  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--k", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json", type=Path, help="append the results here")
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; V = {args.vocab}")
    for b in args.rows:
        logits = torch.randn(b, args.vocab, device="cuda") * 3
        for k in args.k:
            same = torch.equal(topk_rows(logits, k)[0], torch.topk(logits, k).values)
            t_torch = time_graph(lambda x=logits, k=k: torch.topk(x, k, dim=-1, sorted=True), args.reps)
            t_ours = time_graph(lambda x=logits, k=k: topk_rows(x, k), args.reps)
            row = {
                "rows": b,
                "k": k,
                "torch_us": t_torch * 1e6,
                "surge_us": t_ours * 1e6,
                "same_values": same,
            }
            print(
                f"B={b:3d} k={k:3d}  torch.topk {row['torch_us']:7.1f} us  topk_rows {row['surge_us']:7.1f} us"
                f"  x{t_torch / t_ours:.2f}  {'same values' if same else 'DIFFERENT VALUES'}"
            )
            if args.json is not None:
                with args.json.open("a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
