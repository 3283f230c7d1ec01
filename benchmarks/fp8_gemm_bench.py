"""FP8 GEMMs on the GPU, per Qwen3-8B linear shape and token count: which path to use.

For each shape (qkv, o, gate_up, down) and each ``M`` it checks every path against the torch
reference of :mod:`surge.quant.fp8`, then times it inside a CUDA graph that runs the layer over
``--copies`` distinct weights (so L2 never holds a weight):

* ``bf16 cuBLAS``: ``F.linear`` on the bf16 weight (the baseline);
* ``fp8 quant+_scaled_mm``: per-token activation quantization (Triton) + ``torch._scaled_mm``
  with row-wise scales, per-channel weight scales (the engine's default for ``--quantization fp8``);
* ``fp8 _scaled_mm fast-accum``: the same with ``use_fast_accum=True`` (Hopper's faster,
  less precise FP8 accumulation; the engine does not use it unless this measures it worth it);
* ``fp8 triton (channel)``: the weight-only Triton FP8 GEMM with per-channel scales (the
  candidate for decode shapes, ``TRITON_FASTER``);
* ``fp8 triton (block)``: the same kernel with 128 x 128 block scales (FP8 checkpoints);
* ``fp8 F.scaled_mm block``: ``torch.nn.functional.scaled_mm`` with 1x128 activation and
  128x128 weight block scales, where this torch/cuBLAS runs it (else the error is printed).

At the end it prints the value of ``surge.quant.fp8_linear.TRITON_FASTER`` these timings
support: the shapes where the Triton kernel beat quant + ``_scaled_mm`` at every measured
``M <= 16``. A benchmark, not part of the engine.

Run on the GPU host (from the repository root), about a minute::

    PYTHONPATH=. python3 benchmarks/fp8_gemm_bench.py
    PYTHONPATH=. python3 benchmarks/fp8_gemm_bench.py --m 1 2 4 8 16 --layers o down

On a CPU-only machine ``--check`` runs the correctness checks at tiny shapes under Triton's
interpreter (no timings).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

if "--check" in sys.argv:  # must precede the first @triton.jit
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.kernels import interpreter_fixes

    interpreter_fixes.apply()

import torch
import torch.nn.functional as F

from surge.kernels.fp8_gemm import fp8_linear
from surge.kernels.fp8_quant import per_token_quant_fp8
from surge.quant.fp8 import fp8_linear_reference, quantize_block, quantize_per_channel
from surge.quant.fp8_linear import SKINNY_MAX_M, scaled_mm_linear

HIDDEN, INTER, Q, KV = 4096, 12288, 4096, 1024
SHAPES = {
    "qkv": (Q + 2 * KV, HIDDEN),
    "o": (HIDDEN, Q),
    "gate_up": (2 * INTER, HIDDEN),
    "down": (HIDDEN, INTER),
}
TINY = {"qkv": (96, 64), "o": (64, 64), "gate_up": (128, 64), "down": (64, 128)}
BLOCK = (128, 128)


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


def block_scaled_mm(x: torch.Tensor, w: torch.Tensor, sw: torch.Tensor) -> torch.Tensor:
    """``F.scaled_mm`` with 1x128 activation blocks and 128x128 weight blocks (torch >= 2.9)."""
    m, k = x.shape
    xb = x.float().view(m, k // 128, 128)
    sx = (xb.abs().amax(-1) / 448.0).clamp(min=1e-12)  # [M, K/128]
    xq = (xb / sx[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(m, k)
    st = F.ScalingType
    return F.scaled_mm(
        xq,
        w.t(),
        sx.t().contiguous().t(),  # outer-dim-major, as cuBLAS wants for 1x128
        st.BlockWise1x128,
        sw,
        st.BlockWise128x128,
        output_dtype=torch.bfloat16,
    )


def scaled_mm_fast_accum(x: torch.Tensor, w: torch.Tensor, scale_row: torch.Tensor) -> torch.Tensor:
    """:func:`scaled_mm_linear` with ``use_fast_accum=True``."""
    xq, xs = per_token_quant_fp8(x)
    return torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=scale_row, out_dtype=x.dtype, use_fast_accum=True)


def close(y: torch.Tensor, ref: torch.Tensor) -> bool:
    return torch.allclose(y.float(), ref.float(), atol=3e-2, rtol=3e-2)


def bench_shape(
    n: int, k: int, ms: list[int], block: tuple[int, int], copies: int, reps: int, check: bool
) -> dict[int, dict[str, float]]:
    """Check, then (unless ``check``) time every path at each ``M``; returns seconds per call."""
    dev = torch.device("cpu" if check else "cuda")
    full = [torch.randn(n, k, device=dev) * 0.02 for _ in range(copies)]
    ws_bf16 = [w.to(torch.bfloat16) for w in full]
    chan = [quantize_per_channel(w) for w in full]
    blk = [quantize_block(w, block) for w in full]
    del full
    result: dict[int, dict[str, float]] = {}
    for m in ms:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        ref_c = fp8_linear_reference(x, *chan[0])
        ref_w = fp8_linear_reference(x, *chan[0], quantize_input=False)
        ref_b = fp8_linear_reference(x, *blk[0], block_size=block, quantize_input=False)
        paths: list[tuple[str, Callable[[int], torch.Tensor], torch.Tensor | None]] = [
            ("bf16 cuBLAS", lambda i, x=x: F.linear(x, ws_bf16[i]), None),
            (
                "fp8 quant+_scaled_mm",
                lambda i, x=x: scaled_mm_linear(x, chan[i][0], chan[i][1].view(1, -1), None),
                ref_c,
            ),
            (
                "fp8 _scaled_mm fast-accum",
                lambda i, x=x: scaled_mm_fast_accum(x, chan[i][0], chan[i][1].view(1, -1)),
                ref_c,
            ),
            ("fp8 triton (channel)", lambda i, x=x: fp8_linear(x, *chan[i]), ref_w),
            ("fp8 triton (block)", lambda i, x=x: fp8_linear(x, *blk[i], block_size=block), ref_b),
            ("fp8 F.scaled_mm block", lambda i, x=x: block_scaled_mm(x, *blk[i]), ref_b),
        ]
        print(f"N={n} K={k} M={m}")
        times: dict[str, float] = {}
        for label, fn, ref in paths:
            try:
                y = fn(0)
                if ref is not None and not close(y, ref):
                    print(f"  {label:26s} WRONG (max err {(y.float() - ref.float()).abs().max():.3g})")
                    continue
                if check:
                    print(f"  {label:26s} ok")
                    continue

                def run(fn: Callable[[int], torch.Tensor] = fn) -> None:
                    for i in range(copies):
                        fn(i)

                t = time_graph(run, reps) / copies
            except Exception as exc:  # noqa: BLE001 - report a path that does not run here
                print(f"  {label:26s} unsupported: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                continue
            times[label] = t
            wbytes = n * k * (2 if label.startswith("bf16") else 1)
            print(f"  {label:26s} {t * 1e6:8.1f} us {wbytes / t / 1e12:5.2f} TB/s (weight bytes)")
        result[m] = times
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64, 512])
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--layers", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--check", action="store_true", help="CPU: correctness only, tiny shapes, interpreter")
    args = ap.parse_args()
    if args.check:
        for name in args.layers:
            print(name)
            bench_shape(*TINY[name], [1, 5, 20], (32, 32), 1, 1, True)
        return
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    faster = []
    for name in args.layers:
        n, k = SHAPES[name]
        print(name)
        result = bench_shape(n, k, args.m, BLOCK, args.copies, args.reps, False)
        skinny = [t for m, t in result.items() if m <= SKINNY_MAX_M]
        a, b = "fp8 triton (channel)", "fp8 quant+_scaled_mm"
        if skinny and all(a in t and (b not in t or t[a] < t[b]) for t in skinny):
            faster.append((n, k))
    print(
        f"\nTRITON_FASTER = frozenset({set(faster) if faster else 'set()'})  # (N, K), measured M <= {SKINNY_MAX_M}"
    )


if __name__ == "__main__":
    main()
