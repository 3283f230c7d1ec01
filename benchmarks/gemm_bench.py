"""Skinny-GEMM bandwidth on the GPU: cuBLAS (``F.linear``) against Surge's Triton skinny GEMM.

For each linear layer shape of Qwen3-8B (qkv, o, gate_up, down, lm_head) and each token count
``M``, captures a CUDA graph that runs the layer over ``--copies`` distinct weights (so the L2
cache never holds a weight), replays it, and prints the time per call and the weight bytes
read per second, for cuBLAS and for :func:`surge.kernels.skinny_gemm.skinny_linear` with its
default config (:func:`surge.kernels.skinny_gemm.skinny_config`). For the down projection it
also times the MLP tail: ``silu_and_mul`` + cuBLAS and ``silu_and_mul`` + ``skinny_linear``. With ``--sweep`` it also searches
a grid of tile configs per shape and prints the best (the source of the table in
``skinny_config``). A benchmark, not part of the engine.

Run on the GPU host (from the repository root)::

    PYTHONPATH=. python3 benchmarks/gemm_bench.py --m 1 7 16 64
    PYTHONPATH=. python3 benchmarks/gemm_bench.py --m 1 16 --sweep --layers o down
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton

from surge.kernels.silu_and_mul import silu_and_mul
from surge.kernels.skinny_gemm import SkinnyGemmConfig, skinny_config, skinny_linear

HIDDEN, INTER, Q, KV, VOCAB = 4096, 12288, 4096, 1024, 151936
SHAPES = {
    "qkv": (Q + 2 * KV, HIDDEN),
    "o": (HIDDEN, Q),
    "gate_up": (2 * INTER, HIDDEN),
    "down": (HIDDEN, INTER),
    "lm_head": (VOCAB, HIDDEN),
}


def time_graph(fn: Callable[[], None], reps: int) -> float:
    """Seconds per replay of a CUDA graph of ``fn``."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def per_call(fn: Callable[[torch.Tensor], object], ws: list[torch.Tensor], reps: int) -> float:
    """Seconds per call of ``fn(w)``, timed over one graph that calls it once per weight."""

    def run() -> None:
        for w in ws:
            fn(w)

    return time_graph(run, reps) / len(ws)


def sweep_configs(m: int) -> list[SkinnyGemmConfig]:
    """The search grid: block_n x block_k x stages (4 warps), block_m as the default's."""
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    grid = itertools.product([32, 64, 128], [128, 256], [3, 4, 5], [4])
    return [SkinnyGemmConfig(block_m, bn, bk, st, wp) for bn, bk, st, wp in grid]


def sweep(
    fn: Callable[[torch.Tensor, SkinnyGemmConfig], torch.Tensor],
    ws: list[torch.Tensor],
    ref: torch.Tensor,
    m: int,
    reps: int,
) -> tuple[float, SkinnyGemmConfig | None]:
    """Fastest correct config of ``fn(w, config)`` over :func:`sweep_configs`."""
    best: tuple[float, SkinnyGemmConfig | None] = (float("inf"), None)
    for c in sweep_configs(m):
        try:
            if not close(fn(ws[0], c), ref):
                print(f"  {c}: WRONG")
                continue
            t = per_call(lambda w, c=c: fn(w, c), ws, reps)
        except Exception as exc:  # noqa: BLE001 - a config may not compile (shared memory)
            print(f"  {c}: {type(exc).__name__}")
            continue
        best = min(best, (t, c), key=lambda b: b[0])
    return best


def close(y: torch.Tensor, ref: torch.Tensor) -> bool:
    return torch.allclose(y.float(), ref.float(), atol=2e-2, rtol=2e-2)


def row(label: str, t: float, nbytes: int, extra: str = "") -> str:
    return f"  {label:26s} {t * 1e6:8.1f} us {nbytes / t / 1e12:5.2f} TB/s {extra}"


def tp_shard(name: str, shape: tuple[int, int], tp: int) -> tuple[int, int]:
    """One rank's ``(N, K)`` of a layer's weight at tensor-parallel size ``tp``: column-parallel
    layers (qkv, gate_up, LM head) split ``N``, row-parallel ones (o, down) split ``K``."""
    n, k = shape
    if name in ("o", "down"):
        return n, k // tp
    return n // tp, k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--layers", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--sweep", action="store_true", help="also search tile configs per shape")
    ap.add_argument(
        "--tp",
        type=int,
        default=1,
        help="one rank's shard under tensor parallelism: N/tp for qkv, gate_up and the LM head, K/tp for o and down",
    )
    args = ap.parse_args()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    for name in args.layers:
        n, k = tp_shard(name, SHAPES[name], args.tp)
        copies = 2 if name == "lm_head" else args.copies
        ws = [torch.randn(n, k, dtype=dtype, device=dev) * 0.02 for _ in range(copies)]
        nbytes = n * k * dtype.itemsize
        for m in args.m:
            x = torch.randn(m, k, dtype=dtype, device=dev)
            ref = F.linear(x, ws[0])
            cfg = skinny_config(m, n, k, dtype)
            print(f"{name} N={n} K={k} M={m}")
            print(row("cuBLAS", per_call(lambda w, x=x: F.linear(x, w), ws, args.reps), nbytes))
            if not close(skinny_linear(x, ws[0]), ref):
                print(f"  skinny_linear {cfg}: WRONG")
            else:
                t = per_call(lambda w, x=x: skinny_linear(x, w), ws, args.reps)
                print(row("skinny_linear (default)", t, nbytes, str(cfg)))
            if args.sweep:
                t, c = sweep(lambda w, c, x=x: skinny_linear(x, w, config=c), ws, ref, m, args.reps)
                print(row("skinny_linear (sweep best)", t, nbytes, str(c)))
            if name == "down":
                gu = torch.randn(m, 2 * k, dtype=dtype, device=dev) * 3
                ref = F.linear(silu_and_mul(gu), ws[0])
                t = per_call(lambda w, gu=gu: F.linear(silu_and_mul(gu), w), ws, args.reps)
                print(row("silu_and_mul + cuBLAS", t, nbytes))
                t = per_call(lambda w, gu=gu: skinny_linear(silu_and_mul(gu), w), ws, args.reps)
                print(row("silu_and_mul + skinny", t, nbytes))
        del ws


if __name__ == "__main__":
    main()
