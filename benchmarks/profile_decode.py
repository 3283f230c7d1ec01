"""Where a decode (or prefill) step's device time goes: per-kernel CUDA time under ``torch.profiler``.

Builds an engine on CUDA (``load_format="dummy"``, bf16) from a model folder's config, admits
``--batch`` requests of ``--input-len`` random tokens, runs a few warm decode steps, then profiles
``--steps`` decode steps and prints the kernels by total CUDA time per step, grouped into
GEMMs (cuBLAS), Surge's Triton kernels and the rest. The CUDA-graph replay hides kernel names,
so this runs the same steps eagerly (``enforce_eager``); compare its total with
``benchmarks/gpu_smoke.py``'s graph step to see launch overhead. With ``--prefill`` it times
``--steps`` steps that each prefill ``--batch`` fresh prompts of ``--input-len`` tokens (prefix
caching off), prints the model FLOP utilisation against ``--peak-tflops``, then profiles one.

Run on the GPU host (from the repository root)::

    PYTHONPATH=. python3 benchmarks/profile_decode.py --model .assets/qwen3-8b --batch 1
"""

from __future__ import annotations

import argparse
import time
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
    ap.add_argument("--prefill", action="store_true", help="profile whole-prompt prefill steps instead")
    ap.add_argument("--peak-tflops", type=float, default=790.0, help="dense bf16 peak for --prefill's MFU")
    ap.add_argument("--quantization", choices=("fp8",), default=None, help="FP8 weights (quantized at load)")
    ap.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    ap.add_argument(
        "--sample",
        action="store_true",
        help="sample as Qwen3's generation config does (temperature 0.6, top-k 20, top-p 0.95) instead of greedy",
    )
    args = ap.parse_args()
    engine = LLMEngine(
        build_engine_config(
            args.model,
            dtype="bfloat16",
            load_format="dummy",
            enforce_eager=not args.graphs,
            enable_prefix_caching=not args.prefill,
            quantization=args.quantization,
            kv_cache_dtype=args.kv_cache_dtype,
        )
    )
    if args.prefill:
        _profile_prefill(engine, args)
        return
    rng = np.random.default_rng(0)
    vocab = engine.config.model.vocab_size
    if args.sample:
        params = SamplingParams(
            temperature=0.6, top_k=20, top_p=0.95, max_tokens=args.steps + 16, ignore_eos=True
        )
    else:
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
    mode = "CUDA graphs" if args.graphs else "eager"
    mode += ", FP8 weights" if args.quantization else ""
    mode += ", FP8 KV" if args.kv_cache_dtype == "fp8" else ""
    mode += ", sampling top-k/top-p" if args.sample else ", greedy"
    title = f"batch {args.batch}, context ~{args.input_len + 8}: device time per decode step ({mode})"
    _print_kernels(prof, args.steps, args.top, title)


def _profile_prefill(engine: LLMEngine, args: argparse.Namespace) -> None:
    """Profile ``args.steps`` steps that each prefill ``args.batch`` fresh prompts."""
    rng = np.random.default_rng(0)
    vocab = engine.config.model.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    n = 0

    def prefill_step() -> None:
        nonlocal n
        for _ in range(args.batch):
            engine.add_request(f"p{n}", rng.integers(3, vocab, args.input_len).tolist(), params)
            n += 1
        while engine.has_unfinished_requests():
            engine.step()

    for _ in range(2):  # warm-up: kernel compilation and autotuning
        prefill_step()
    _sync()
    start = torch.cuda.Event(enable_timing=True) if torch.cuda.is_available() else None
    end = torch.cuda.Event(enable_timing=True) if torch.cuda.is_available() else None
    wall = time.perf_counter()
    if start is not None:
        start.record()
    for _ in range(args.steps):
        prefill_step()
    if end is not None:
        end.record()
    _sync()
    step_s = (time.perf_counter() - wall) / args.steps
    if start is not None and end is not None:
        step_s = start.elapsed_time(end) / 1000 / args.steps
    # Matrix FLOPs per prompt token: every weight but the embedding table and the LM head
    # (which only the last token of each prompt goes through).
    named = engine.runner.model.named_parameters()
    params_count = sum(p.numel() for name, p in named if "embed" not in name and "lm_head" not in name)
    tokens = args.batch * args.input_len
    flops = 2 * params_count * tokens
    print(
        f"prefill of {args.batch} x {args.input_len} tokens: {step_s * 1000:.1f} ms per step, "
        f"{flops / step_s / 1e12:.1f} TFLOP/s from 2 x {params_count:.3e} params x tokens "
        f"(MFU {flops / step_s / (args.peak_tflops * 1e12) * 100:.1f} % of {args.peak_tflops:.0f} TFLOP/s; "
        "attention FLOPs not counted)"
    )
    activity = ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        prefill_step()
        _sync()
    _print_kernels(prof, 1, args.top, f"prefill of {args.batch} x {args.input_len} tokens: device time")


def _print_kernels(prof: profile, steps: int, top: int, title: str) -> None:
    """Print the profiled kernels per step, grouped, then the ``top`` heaviest."""
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for evt in prof.key_averages():
        us = evt.device_time_total if hasattr(evt, "device_time_total") else evt.cuda_time_total
        if us > 0:
            totals[evt.key] += us / steps
            counts[evt.key] += evt.count // steps
    by_group: dict[str, float] = defaultdict(float)
    for name, us in totals.items():
        by_group[_group(name)] += us
    print(title)
    for group, us in sorted(by_group.items(), key=lambda kv: -kv[1]):
        print(f"  {group:<8} {us / 1000:8.3f} ms")
    print(f"  {'total':<8} {sum(by_group.values()) / 1000:8.3f} ms")
    print(f"top {top} kernels (us per step, launches per step):")
    for name, us in sorted(totals.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {us:9.1f}  x{counts[name]:<4} {name[:110]}")


if __name__ == "__main__":
    main()
