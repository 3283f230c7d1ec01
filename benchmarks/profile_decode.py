"""Where a decode step's device time goes: per-kernel CUDA time under ``torch.profiler``.

Builds an engine on CUDA (``load_format="dummy"``, bf16) from a model folder's config, admits
``--batch`` requests of ``--input-len`` random tokens, runs a few warm decode steps, then profiles
``--steps`` decode steps and prints the kernels by total CUDA time per step, grouped into
GEMMs (cuBLAS), Surge's Triton kernels and the rest. The CUDA-graph replay hides kernel names,
so this runs the same steps eagerly (``enforce_eager``); compare its total with
``benchmarks/gpu_smoke.py``'s graph step to see launch overhead.

Run on the GPU host (from the repository root)::

    PYTHONPATH=. python3 benchmarks/profile_decode.py --model .assets/qwen3-8b --batch 1
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from surge.engine.llm_engine import LLMEngine, build_engine_config
from surge.sampling_params import SamplingParams


def _group(name: str) -> str:
    low = name.lower()
    if "gemm" in low or "gemv" in low or "cutlass" in low or "sm90_xmma" in low or "nvjet" in low:
        return "gemm"
    if name.startswith("_") and "kernel" in low:
        return "triton"
    return "other"


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model folder (config.json; weights are random)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--graphs", action="store_true", help="profile CUDA-graph replays (names may be hidden)")
    args = ap.parse_args()
    engine = LLMEngine(
        build_engine_config(args.model, dtype="bfloat16", load_format="dummy", enforce_eager=not args.graphs)
    )
    rng = np.random.default_rng(0)
    vocab = engine.config.model.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 16, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request(f"p{i}", rng.integers(3, vocab, args.input_len).tolist(), params)
    for _ in range(8):  # prefill and warm decode steps
        engine.step()
    _sync()
    # Kernels only on a GPU (CPU ops would count their kernels twice); CPU ops elsewhere.
    activity = ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(args.steps):
            engine.step()
        _sync()
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for evt in prof.key_averages():
        us = evt.device_time_total if hasattr(evt, "device_time_total") else evt.cuda_time_total
        if us > 0:
            totals[evt.key] += us / args.steps
            counts[evt.key] += evt.count // args.steps
    by_group: dict[str, float] = defaultdict(float)
    for name, us in totals.items():
        by_group[_group(name)] += us
    mode = "CUDA graphs" if args.graphs else "eager"
    print(f"batch {args.batch}, context ~{args.input_len + 8}: device time per decode step ({mode})")
    for group, us in sorted(by_group.items(), key=lambda kv: -kv[1]):
        print(f"  {group:<8} {us / 1000:8.3f} ms")
    print(f"  {'total':<8} {sum(by_group.values()) / 1000:8.3f} ms")
    print(f"top {args.top} kernels (us per step, launches per step):")
    for name, us in sorted(totals.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {us:9.1f}  x{counts[name]:<4} {name[:110]}")


if __name__ == "__main__":
    main()
