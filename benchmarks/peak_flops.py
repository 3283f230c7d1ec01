"""Dense GEMM peaks of a GPU, the roofline's ``peak_flops`` (bf16) and ``peak_flops_fp8``.

Times square GEMMs (``torch.matmul`` in bf16; ``torch._scaled_mm``, cuBLASLt, in float8_e4m3fn with
per-row and per-column float32 scales, as Surge's FP8 prefill runs) over a few sizes, each as a
CUDA graph of ``--reps`` calls, and prints the best FLOP/s per dtype and size as JSON lines (the
largest over the sizes is the peak). A benchmark, not part of the engine.

Run on the GPU host (from the repository root)::

    PYTHONPATH=. python3 benchmarks/peak_flops.py --sizes 4096 8192 16384
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch


def _time(fn: Callable[[], object], reps: int, trials: int) -> float:
    """Best seconds per call of ``fn`` over ``trials`` replays of a graph of ``reps`` calls."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    best = float("inf")
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / reps)
    return best


def main() -> None:
    """Measure and print one JSON line per (dtype, size)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--trials", type=int, default=10)
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(json.dumps({"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__}))
    for n in args.sizes:
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        out = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
        t = _time(lambda a=a, b=b, out=out: torch.matmul(a, b, out=out), args.reps, args.trials)
        print(json.dumps({"dtype": "bfloat16", "n": n, "seconds": t, "tflops": 2 * n**3 / t / 1e12}))
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major, as cuBLASLt wants
        sa = torch.ones(n, 1, device=dev, dtype=torch.float32)
        sb = torch.ones(1, n, device=dev, dtype=torch.float32)
        t = _time(
            lambda a8=a8, b8=b8, sa=sa, sb=sb: torch._scaled_mm(a8, b8, sa, sb, out_dtype=torch.bfloat16),
            args.reps,
            args.trials,
        )
        print(json.dumps({"dtype": "float8_e4m3fn", "n": n, "seconds": t, "tflops": 2 * n**3 / t / 1e12}))
        del a, b, out, a8, b8
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
