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
* ``fp8 split-K default``: the split-K kernel (w8a16) with its untuned default config;
* ``fp8 split-K (block)``, ``... a8``: the split-K kernel with 128 x 128 block scales and the
  tiles the engine would give a block checkpoint's layer
  (``surge.quant.fp8_linear.block_splitk_config``), w8a16 and w8a8 (``M <= 64``); above that,
  ``fp8 split-K (block) <tiles>`` for the one-slice configs of ``LARGE_BLOCK_CONFIGS``
  (candidates for ``BLOCK_PREFILL_TILES``);
* ``fp8 F.scaled_mm block``: ``torch.nn.functional.scaled_mm`` with 1x128 activation and
  128x128 weight block scales, where this torch/cuBLAS runs it (else the error is printed),
  the activations quantized per 128-column group by torch ops; ``... block gemm``: the same
  GEMM on activations quantized beforehand (its own cost); ``fp8 F.scaled_mm engine``: the engine's
  path for block layers' prefill steps (``surge.quant.fp8_linear.block_scaled_mm_linear``: the
  Triton group quantization, rows padded to 16, the GEMM).

``--paths WORD ...`` times only the paths whose label contains one of the words.

At the end it prints the values of ``surge.quant.fp8_linear.TRITON_FASTER`` and
``SPLITK_BLOCK_FASTER`` these timings support: the shapes where the Triton kernel beat quant +
``_scaled_mm`` at every measured ``M <= 16``, and where split-K (block) beat the Triton kernel
(block) at every measured ``M <= 64``. A benchmark, not part of the engine.

Run on the GPU host (from the repository root), about a minute::

    PYTHONPATH=. python3 benchmarks/fp8_gemm_bench.py
    PYTHONPATH=. python3 benchmarks/fp8_gemm_bench.py --m 1 2 4 8 16 --layers o down

On a CPU-only machine ``--check`` runs the correctness checks at tiny shapes under Triton's
interpreter (no timings), at ``M`` = 1, 5 and 20 or ``--m``'s (above 64: the prefill candidates).

``--sweep`` times the split-K FP8 GEMM (:mod:`surge.kernels.fp8_gemm_splitk`) over its tile,
split-K, operand-mode (w8a16 / w8a8), reduction (a reduce kernel / inline in the last
program of each tile) and, on sm90+, weight-load (pointer loads / TMA descriptor) configs per
shape and ``M`` (default 1, 2, 4, 8, 16, 32, 64), each
config first checked against the dequantized fp32 reference (and, after its timing, again
bitwise against its first result); it prints the best config per (shape, M) and mode against
bf16 cuBLAS and quant + ``_scaled_mm`` and merges the results into ``--json`` (so the sweep can
run in pieces; on the H200 about 25 s of compiles per ``block_m`` of 16, 32, 64, then about 2 s
per layer and ``M``). ``--emit FILE`` prints the table and the
ready-to-paste value of ``surge.quant.fp8_linear.SPLITK_MEASURED`` from that file
(``--write-source surge/quant/fp8_linear.py`` writes it there; ``--no-inline`` chooses among the
reduce kernel's configs only, ``--no-tma`` among the pointer-load ones only)::

    PYTHONPATH=. python3 benchmarks/fp8_gemm_bench.py --sweep --m 1 2 4 8 16 --json /tmp/fp8_sweep.json
    PYTHONPATH=. python3 benchmarks/fp8_gemm_bench.py --sweep --m 32 64 --json /tmp/fp8_sweep.json
    PYTHONPATH=. python3 benchmarks/fp8_gemm_bench.py --emit /tmp/fp8_sweep.json

``--sweep --check`` runs the sweep's configs on CPU at tiny shapes (interpreter, no timings;
the TMA twins included, which the interpreter emulates).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

if "--check" in sys.argv:  # must precede the first @triton.jit
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.kernels import interpreter_fixes

    interpreter_fixes.apply()

import torch
import torch.nn.functional as F

from surge.kernels.fp8_gemm import fp8_linear
from surge.kernels.fp8_gemm_splitk import (
    Fp8SplitKConfig,
    SplitKWorkspace,
    fp8_linear_splitk,
    splitk_workspace_size,
    tma_supported,
)
from surge.kernels.fp8_quant import per_token_quant_fp8
from surge.quant.fp8 import (
    dequantize,
    fp8_linear_reference,
    quantize_block,
    quantize_per_channel,
    quantize_per_token_group,
)
from surge.quant.fp8_linear import (
    SKINNY_MAX_M,
    SPLITK_BUCKETS,
    SPLITK_MAX_M,
    block_scaled_mm_linear,
    block_splitk_config,
    scaled_mm_linear,
    splitk_configs,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_bench import time_graph  # noqa: E402  (the bf16 GEMM bench's CUDA-graph timer)

HIDDEN, INTER, Q, KV = 4096, 12288, 4096, 1024
SHAPES = {
    "qkv": (Q + 2 * KV, HIDDEN),
    "o": (HIDDEN, Q),
    "gate_up": (2 * INTER, HIDDEN),
    "down": (HIDDEN, INTER),
}
TINY = {"qkv": (96, 64), "o": (64, 64), "gate_up": (128, 64), "down": (64, 128)}
BLOCK = (128, 128)
LARGE_BLOCK_CONFIGS = [
    ("a8 128x128x128 s3 w8", Fp8SplitKConfig(128, 128, 128, 1, 3, 8, a8=True)),
    ("a8 128x128x128 s4 w8 tma", Fp8SplitKConfig(128, 128, 128, 1, 4, 8, a8=True, tma=True)),
    ("a8 64x128x128 s4 w4", Fp8SplitKConfig(64, 128, 128, 1, 4, 4, a8=True)),
    ("a8 128x256x128 s3 w8 tma", Fp8SplitKConfig(128, 256, 128, 1, 3, 8, a8=True, tma=True)),
    ("a16 128x128x64 s3 w8", Fp8SplitKConfig(128, 128, 64, 1, 3, 8)),
]
"""Split-K FP8 GEMM configs (one ``K`` slice) timed with block scales above the decode sizes:
candidates for a block checkpoint's prefill steps (w8a8: activations quantized per token)."""


def group_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token, per-128-column-group FP8 quantization in torch (the engine's reference,
    :func:`surge.quant.fp8.quantize_per_token_group`, IEEE divisions like the Triton kernel):
    ``(xq [M, K] e4m3, sx [M, K/128] float32)`` with ``sx`` outer-dim-major (strides ``(1, M)``),
    as cuBLAS wants for 1x128."""
    xq, sx = quantize_per_token_group(x)
    return xq, sx.t().contiguous().t()


def block_scaled_mm_q(xq: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, sw: torch.Tensor) -> torch.Tensor:
    """``F.scaled_mm`` on pre-quantized 1x128 activations and 128x128 weight blocks (torch >= 2.9):
    ``sw [N/128, K/128]`` (the checkpoint's layout) is passed transposed, ``[K/128, N/128]``
    outer-dim-major, the layout cuBLAS wants for the ``[K, N]`` operand."""
    st = F.ScalingType
    return F.scaled_mm(
        xq, w.t(), sx, st.BlockWise1x128, sw.t(), st.BlockWise128x128, output_dtype=torch.bfloat16
    )


def block_scaled_mm(x: torch.Tensor, w: torch.Tensor, sw: torch.Tensor) -> torch.Tensor:
    """:func:`group_quant` (torch ops) then :func:`block_scaled_mm_q`."""
    return block_scaled_mm_q(*group_quant(x), w, sw)


def scaled_mm_fast_accum(x: torch.Tensor, w: torch.Tensor, scale_row: torch.Tensor) -> torch.Tensor:
    """:func:`scaled_mm_linear` with ``use_fast_accum=True``."""
    xq, xs = per_token_quant_fp8(x)
    return torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=scale_row, out_dtype=x.dtype, use_fast_accum=True)


def close(y: torch.Tensor, ref: torch.Tensor) -> bool:
    return torch.allclose(y.float(), ref.float(), atol=3e-2, rtol=3e-2)


def bench_shape(
    n: int,
    k: int,
    ms: list[int],
    block: tuple[int, int],
    copies: int,
    reps: int,
    check: bool,
    only: list[str] | None = None,
) -> dict[int, dict[str, float]]:
    """Check, then (unless ``check``) time every path at each ``M`` (those whose label contains
    one of ``only``'s words, when given); returns seconds per call."""
    dev = torch.device("cpu" if check else "cuda")
    full = [torch.randn(n, k, device=dev) * 0.02 for _ in range(copies)]
    ws_bf16 = [w.to(torch.bfloat16) for w in full]
    chan = [quantize_per_channel(w) for w in full]
    blk = [quantize_block(w, block) for w in full]
    del full
    result: dict[int, dict[str, float]] = {}
    for m in ms:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        # The w8a8 reference is built on the kernel's own quantized activations: torch's CUDA
        # per-token scale (``amax * (1/448)``) can be 1 ulp off the kernel's IEEE ``amax / 448``,
        # which flips some activations by an e4m3 ulp (max |diff| ~0.07 at M >= 16 here, what the
        # first H200 run reported as WRONG for ``_scaled_mm``): a reference problem, not a bug.
        ref_c = (dequantize(*per_token_quant_fp8(x)) @ dequantize(*chan[0]).t()).to(x.dtype)
        ref_w = fp8_linear_reference(x, *chan[0], quantize_input=False)
        ref_b = fp8_linear_reference(x, *blk[0], block_size=block, quantize_input=False)
        # w8a8 block references on the kernels' own quantized activations (see above): per
        # token (the split-K kernel's a8 mode), per 128-column group (F.scaled_mm block)
        deq_b = dequantize(*blk[0], block)
        ref_b8 = (dequantize(*per_token_quant_fp8(x)) @ deq_b.t()).to(x.dtype)
        ref_g = None
        if k % 128 == 0:
            xg, sg = group_quant(x)
            xgf = xg.float().view(m, k // 128, 128) * sg.reshape(m, k // 128, 1)
            ref_g = (xgf.view(m, k) @ deq_b.t()).to(x.dtype)
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
            ("fp8 split-K default", lambda i, x=x: fp8_linear_splitk(x, *chan[i]), ref_w),
            (
                "fp8 split-K (block)",
                lambda i, x=x, c=block_splitk_config(m, n, k, block): fp8_linear_splitk(
                    x, *blk[i], config=c, block_size=block
                ),
                ref_b,
            ),
            (
                "fp8 split-K (block) a8",
                lambda i, x=x, c=block_splitk_config(m, n, k, block, True): fp8_linear_splitk(
                    x, *blk[i], config=c, block_size=block
                ),
                ref_b8,
            ),
            ("fp8 F.scaled_mm block", lambda i, x=x: block_scaled_mm(x, *blk[i]), ref_g),
            (
                "fp8 F.scaled_mm block gemm",
                lambda i, xg=group_quant(x) if k % 128 == 0 else None: block_scaled_mm_q(*xg, *blk[i]),
                ref_g,
            ),
            ("fp8 F.scaled_mm engine", lambda i, x=x: block_scaled_mm_linear(x, *blk[i], None), ref_g),
        ]
        if m > SPLITK_MAX_M:  # the decode tables stop at SPLITK_MAX_M
            paths = [p for p in paths if p[0] not in ("fp8 split-K (block)", "fp8 split-K (block) a8")]
        if m > SPLITK_MAX_M:  # prefill-sized candidates for block checkpoints: one K slice
            for desc, large in LARGE_BLOCK_CONFIGS:
                if large.tma and not tma_supported(dev):
                    continue
                cfg = replace(large, block_k=min(large.block_k, block[1] & -block[1]))
                paths.append(
                    (
                        f"fp8 split-K (block) {desc}",
                        lambda i, x=x, c=cfg: fp8_linear_splitk(x, *blk[i], config=c, block_size=block),
                        ref_b8 if cfg.a8 else ref_b,
                    )
                )
        if k % 128:  # cuBLAS's 1 x 128 / 128 x 128 block scaling needs K (and N) in 128s
            paths = [p for p in paths if "F.scaled_mm" not in p[0]]
        paths = [p for p in paths if not only or any(word in p[0] for word in only)]
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


SMEM_BUDGET = 200 * 1024
"""Bytes of shared memory a sweep config may plan for its pipelined tiles (H200: 227 KiB)."""


def sweep_configs(m: int, k: int, tiny: bool, tma: bool = False) -> list[Fp8SplitKConfig]:
    """The split-K configs the sweep tries for ``M = m``: ``block_m`` 16/32/64 by ``m``;
    ``block_n`` 32/64/128; ``block_k`` 128/256/512; ``split_k`` 1..16 with ``K`` an exact
    multiple of ``split_k * block_k``; 4 stages (fewer where the tiles would not fit
    :data:`SMEM_BUDGET`), 4 warps; w8a16 and w8a8; for ``split_k > 1`` both reductions,
    ``"kernel"`` and ``"inline"``; with ``tma`` (sm90+, or the interpreter of ``--check``)
    each of them also with TMA weight loads (``Fp8SplitKConfig.tma``)."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    out = []
    for a8 in (False, True):
        for bn in (16, 32) if tiny else (32, 64, 128):
            for bk in (16, 32) if tiny else (128, 256, 512):
                per_stage = bn * bk + block_m * bk * (1 if a8 else 2)
                stages = min(4, SMEM_BUDGET // per_stage)
                if stages < 2:
                    continue
                for split in (1, 2, 4, 8, 16):
                    if k % (split * bk) == 0:
                        for reduce in ("kernel", "inline") if split > 1 else ("kernel",):
                            cfg = Fp8SplitKConfig(block_m, bn, bk, split, stages, 4, a8, reduce)
                            out.append(cfg)
                            if tma:
                                out.append(replace(cfg, tma=True))
    return out


def wide_sweep_configs(m: int, n: int, k: int, tiny: bool, tma: bool = False) -> list[Fp8SplitKConfig]:
    """``--wide``: the w8a8 configs :func:`sweep_configs` leaves out, for ``M = m`` of the
    ``[n, k]`` weight: 8 warps (4 stages, fewer where the tiles would not fit
    :data:`SMEM_BUDGET`), 5 or 6 stages with 4 warps, and 256-column tiles (``block_n`` 64, 128,
    256; ``block_k`` 128 or 256; ``split_k`` and both reductions as there, each also with TMA
    weight loads); first the config the engine ships for ``m``
    (:func:`surge.quant.fp8_linear.splitk_configs`, when the table has one), so that the same
    run times the baseline."""
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    shipped = splitk_configs(n, k)[m] if not tiny and m <= SPLITK_MAX_M else None
    out: list[Fp8SplitKConfig] = [] if shipped is None else [shipped]
    for bn in (16, 32) if tiny else (64, 128, 256):
        for bk in (16, 32) if tiny else (128, 256):
            per_stage = bn * bk + block_m * bk
            fit = SMEM_BUDGET // per_stage
            shapes = [(min(4, fit), 8)] + [(s, 4) for s in (5, 6) if s <= fit]
            if bn == 256 or tiny:
                shapes.append((min(4, fit), 4))
            for stages, warps in shapes:
                if stages < 2:
                    continue
                for split in (1, 2, 4, 8, 16):
                    if k % (split * bk) == 0:
                        for reduce in ("kernel", "inline") if split > 1 else ("kernel",):
                            cfg = Fp8SplitKConfig(block_m, bn, bk, split, stages, warps, True, reduce)
                            for c in (cfg, replace(cfg, tma=True)) if tma else (cfg,):
                                if c not in out:
                                    out.append(c)
    return out


def sweep_tma(check: bool) -> bool:
    """Whether the sweep tries TMA twins: under ``--check`` (the interpreter emulates them), else
    where the current CUDA device is sm90+."""
    return check or tma_supported("cuda")


def mode_of(cfg: Fp8SplitKConfig) -> str:
    """The sweep's result key of a config: ``w8a16``/``w8a8``, plus `` inline`` for the inline
    split-K reduction (``split_k = 1`` and the reduce kernel are the plain key), plus `` tma``
    for TMA weight loads."""
    mode = "w8a8" if cfg.a8 else "w8a16"
    if cfg.split_k > 1 and cfg.reduce == "inline":
        mode += " inline"
    return mode + " tma" if cfg.tma else mode


MODES = ("w8a16", "w8a8", "w8a16 inline", "w8a8 inline")
TMA_MODES = tuple(mode + " tma" for mode in MODES)


def max_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest ``|y - ref|`` in units of ``|ref| * 2**-8 + 1e-3 * max |ref|`` (``|ref| * 2**-8``
    is at least half a bf16 ulp of ``ref``): an output rounded to bf16 after an exact fp32 sum
    is within 1; fp32 sums in another order add little, so anything above 2 is a real error
    (as the w8a8 configs' FP8 accumulation without fp32 promotion on Hopper was, issue 13)."""
    r = ref.float()
    unit = r.abs() * 2.0**-8 + 1e-3 * r.abs().max()
    return ((y.float() - r).abs() / unit).max().item()


def sweep_shape(
    name: str, n: int, k: int, ms: list[int], copies: int, reps: int, check: bool, wide: bool = False
) -> dict[str, dict[str, object]]:
    """Time bf16 cuBLAS, quant + ``_scaled_mm`` and every split-K config at each ``M``; returns
    ``{str(M): {"bf16": s, "scaled_mm": s, "best": {mode: [s, config fields]}}}`` with the modes
    of :func:`mode_of`. An inline-reduction config runs against one persistent
    :class:`SplitKWorkspace` (as in the engine) and is checked again, bitwise against its first
    result, after its CUDA graph's replays (a counter left non-zero would show there); one that
    fails is reported WRONG and never chosen, so the table falls back to the reduce kernel. A TMA
    config's first result is also compared bitwise with its pointer-load twin's (the same tiles
    and dots: expected equal; a difference is printed as a note, the config still timed)."""
    dev = torch.device("cpu" if check else "cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    full = [torch.randn(n, k, generator=gen, device=dev) * 0.02 for _ in range(copies)]
    ws_bf16 = [w.to(torch.bfloat16) for w in full]
    chan = [quantize_per_channel(w) for w in full]
    del full
    deq0 = dequantize(*chan[0])
    tma = sweep_tma(check)

    def configs(m: int) -> list[Fp8SplitKConfig]:
        return wide_sweep_configs(m, n, k, check, tma) if wide else sweep_configs(m, k, check, tma)

    needs = [splitk_workspace_size(m, n, c) for m in ms for c in configs(m)]
    workspace = SplitKWorkspace.allocate(max(f for f, _ in needs), max(t for _, t in needs), dev)
    results: dict[str, dict[str, object]] = {}
    for m in ms:
        t0 = time.perf_counter()
        x = torch.randn(m, k, generator=gen, device=dev).to(torch.bfloat16)
        xq, xs = per_token_quant_fp8(x)
        ref_a16 = x.float() @ deq0.t()
        ref_a8 = dequantize(xq, xs) @ deq0.t()  # on the kernel's own quantized activations
        ref_torch_a8 = fp8_linear_reference(x, *chan[0])  # torch's own per-token quantization
        row: dict[str, object] = {}
        best: dict[str, tuple[float, Fp8SplitKConfig]] = {}

        def timed(fn: Callable[[int], torch.Tensor]) -> float:
            def run() -> None:
                for i in range(copies):
                    fn(i)

            return time_graph(run, reps) / copies

        if not check:
            row["bf16"] = timed(lambda i, x=x: F.linear(x, ws_bf16[i]))
            y = scaled_mm_linear(x, chan[0][0], chan[0][1].view(1, -1), None)
            row["scaled_mm"] = timed(
                lambda i, x=x: scaled_mm_linear(x, chan[i][0], chan[i][1].view(1, -1), None)
            )
            row["scaled_mm_err"] = [max_err(y, ref_a8), max_err(y, ref_torch_a8)]
        bad, differ = 0, 0
        pointer_y: dict[Fp8SplitKConfig, torch.Tensor] = {}
        shipped = splitk_configs(n, k)[m] if wide and not check and m <= SPLITK_MAX_M else None
        row["shipped"] = None
        for cfg in configs(m):
            try:
                y = fp8_linear_splitk(x, chan[0][0], chan[0][1], config=cfg, workspace=workspace)
                if not cfg.tma:
                    pointer_y[cfg] = y
                elif (twin := pointer_y.get(replace(cfg, tma=False))) is not None and not torch.equal(
                    y, twin
                ):
                    differ += 1  # the same tiles and dots: expected bit for bit (reported, not refused)
                    print(f"  note: {cfg} differs from its pointer-load twin by {(y - twin).abs().max():.3g}")
                err = max_err(y, ref_a8 if cfg.a8 else ref_a16)
                if err > 2.0:
                    bad += 1
                    print(f"  WRONG {cfg} err {err:.2f}")
                    continue
                if not check:
                    t = timed(
                        lambda i, x=x, cfg=cfg: fp8_linear_splitk(
                            x, chan[i][0], chan[i][1], config=cfg, workspace=workspace
                        )
                    )
                again = [
                    fp8_linear_splitk(x, chan[0][0], chan[0][1], config=cfg, workspace=workspace)
                    for _ in range(2)
                ]
                if not all(torch.equal(z, y) for z in again):
                    bad += 1
                    print(f"  WRONG {cfg}: a repeated call (after the graph's replays) differs")
                    continue
                if check:
                    continue
            except Exception as exc:  # noqa: BLE001 - report a config that does not compile or run here
                print(f"  failed {cfg}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
                continue
            if cfg == shipped:
                row["shipped"] = [t, list(cfg.__dict__.values())]
            mode = mode_of(cfg)
            if mode not in best or t < best[mode][0]:
                best[mode] = (t, cfg)
        row["best"] = {mode: [t, list(cfg.__dict__.values())] for mode, (t, cfg) in best.items()}
        results[str(m)] = row
        dt = time.perf_counter() - t0
        if check:
            print(
                f"{name} N={n} K={k} M={m}: {len(configs(m))} configs checked, {bad} wrong, "
                f"{differ} TMA configs not bitwise equal to their pointer-load twins"
            )
            continue
        gb = n * k / 1e9
        parts = [f"bf16 {row['bf16'] * 1e6:6.1f}", f"quant+_scaled_mm {row['scaled_mm'] * 1e6:6.1f}"]  # type: ignore[operator]
        for mode, (t, cfg) in sorted(best.items()):
            parts.append(
                f"{mode} {t * 1e6:6.1f} us ({gb / t / 1e3:4.2f} TB/s) {tuple(cfg.__dict__.values())}"
            )
        errs = row["scaled_mm_err"]
        if row["shipped"] is not None:
            t_s = row["shipped"][0]  # type: ignore[index]
            parts.append(f"shipped {t_s * 1e6:6.1f} us {tuple(shipped.__dict__.values())}")  # type: ignore[union-attr]
        print(f"{name} N={n} K={k} M={m:3d}: " + " | ".join(parts) + f"  [{dt:.0f} s]")
        if differ:
            print(f"    {differ} TMA configs not bitwise equal to their pointer-load twins (see the notes)")
        print(
            f"    _scaled_mm error (ulp units) vs own-quant ref {errs[0]:.2f}, vs torch-quant ref {errs[1]:.2f}"
        )  # type: ignore[index]
    return results


def splitk_choices(data: dict[str, dict[str, dict]]) -> dict[str, dict[int, list[object] | None]]:
    """Per layer name and swept bucket ``M``: the faster split-K config's fields if it beat
    quant + ``_scaled_mm`` by >= 3 %, else None (measured, ``_scaled_mm`` kept)."""
    out: dict[str, dict[int, list[object] | None]] = {}
    for name, rows in data.items():
        for m_str, row in rows.items():
            m = int(m_str)
            if m not in SPLITK_BUCKETS:
                continue
            best = row["best"]
            pick = min(best.values(), key=lambda v: v[0]) if best else None
            won = pick is not None and pick[0] < 0.97 * row["scaled_mm"]
            out.setdefault(name, {})[m] = list(Fp8SplitKConfig(*pick[1]).__dict__.values()) if won else None
    return out


def tiles_source(fields: list[object]) -> str:
    """``fields`` as the tuple literal ``ruff format`` keeps (double-quoted strings)."""
    return "(" + ", ".join(f'"{v}"' if isinstance(v, str) else repr(v) for v in fields) + ")"


def splitk_literal(data: dict[str, dict[str, dict]]) -> str:
    """The source of ``SPLITK_MEASURED`` (formatted as ``ruff format`` leaves it) for the sweep
    results ``data``; each shape's comment gives bf16 / quant + ``_scaled_mm`` / chosen
    microseconds per bucket."""
    lines = ["SPLITK_MEASURED: dict[tuple[int, int], dict[int, SplitKTiles | None]] = {"]
    for name, by_m in splitk_choices(data).items():
        n, k = SHAPES[name]
        lines.append(f"    ({n}, {k}): {{  # {name}; us: bf16 / quant+_scaled_mm / chosen")
        for m, fields in sorted(by_m.items()):
            row = data[name][str(m)]
            chosen = min(v[0] for v in row["best"].values()) if fields is not None else row["scaled_mm"]
            us = f"{row['bf16'] * 1e6:.1f} / {row['scaled_mm'] * 1e6:.1f} / {chosen * 1e6:.1f}"
            lines.append(f"        {m}: {'None' if fields is None else tiles_source(fields)},  # {us}")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_source(path: Path, literal: str) -> None:
    """Replace the ``SPLITK_MEASURED = {...}`` assignment in ``path`` (from its first line to
    the first line that is ``}``) by ``literal``. Raises ValueError if it is not found."""
    lines = path.read_text().splitlines(keepends=True)
    try:
        first = next(i for i, ln in enumerate(lines) if ln.startswith("SPLITK_MEASURED:"))
        last = next(i for i in range(first, len(lines)) if lines[i].rstrip("\n") == "}")
    except StopIteration:
        raise ValueError(f"{path}: no SPLITK_MEASURED assignment ending in a '}}' line") from None
    path.write_text("".join(lines[:first]) + literal + "".join(lines[last + 1 :]))


def emit(path: Path, source: Path | None = None, no_inline: bool = False, no_tma: bool = False) -> None:
    """Print the sweep table of ``path`` and the ``SPLITK_MEASURED`` literal it supports (per
    shape and bucket, the faster split-K mode, TMA or not, if it beats quant + ``_scaled_mm`` by
    >= 3 %, else None); with ``source``, also write that literal into that file (the engine's
    ``surge/quant/fp8_linear.py``); ``no_inline`` ignores the inline reduction's timings (the
    fallback should it fail the GPU tests: the same sweep, the reduce kernel only), ``no_tma``
    the TMA configs' (the pointer loads only). The TMA columns are printed when the sweep has
    TMA results."""
    data = json.loads(path.read_text())
    for rows in data.values():
        for row in rows.values():
            row["best"] = {
                mode: v
                for mode, v in row["best"].items()
                if not (no_inline and " inline" in mode) and not (no_tma and mode.endswith(" tma"))
            }
    has_tma = any(
        mode in TMA_MODES for rows in data.values() for row in rows.values() for mode in row["best"]
    )
    modes = MODES + TMA_MODES if has_tma else MODES
    tma_head = "| w8a16 tma us | w8a8 tma us | w8a16 inline tma us | w8a8 inline tma us " if has_tma else ""
    print(
        "| layer | N x K | M | bf16 us | quant+_scaled_mm us | split-K w8a16 us | split-K w8a8 us "
        "| w8a16 inline us | w8a8 inline us " + tma_head + "| chosen |"
    )
    print("|---" * (6 + len(modes)) + "|")
    choices = splitk_choices(data)
    for name, rows in data.items():
        n, k = SHAPES[name]
        for m_str, row in sorted(rows.items(), key=lambda kv: int(kv[0])):
            m = int(m_str)
            best = row["best"]
            cells = [f"{best[mode][0] * 1e6:.1f}" if mode in best else "-" for mode in modes]
            fields = choices.get(name, {}).get(m)
            chosen = "_scaled_mm"
            if fields is not None:
                chosen = f"split-K {mode_of(Fp8SplitKConfig(*fields))} {tuple(fields[:6])}"  # type: ignore[arg-type]
            print(
                f"| {name} | {n} x {k} | {m} | {row['bf16'] * 1e6:.1f} | {row['scaled_mm'] * 1e6:.1f} | "
                + " | ".join(cells)
                + f" | {chosen} |"
            )
    literal = splitk_literal(data)
    print("\n" + literal, end="")
    if source is not None:
        write_source(source, literal)
        print(f"written into {source}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64, 512])
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--layers", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--check", action="store_true", help="CPU: correctness only, tiny shapes, interpreter")
    ap.add_argument("--paths", nargs="+", help="only the paths whose label contains one of these words")
    ap.add_argument("--sweep", action="store_true", help="time the split-K FP8 GEMM's configs")
    ap.add_argument("--json", type=Path, help="--sweep: merge the results into this file")
    ap.add_argument(
        "--wide",
        action="store_true",
        help="--sweep: the w8a8 configs the default sweep leaves out (8 warps, 5-6 stages, 256-column "
        "tiles) and the engine's shipped config, timed in the same run",
    )
    ap.add_argument("--emit", type=Path, help="print the table and SPLITK_MEASURED from a --json file")
    ap.add_argument(
        "--write-source",
        type=Path,
        help="--emit: also replace SPLITK_MEASURED in this file (surge/quant/fp8_linear.py)",
    )
    ap.add_argument(
        "--no-inline",
        action="store_true",
        help="--emit: ignore the inline split-K reduction's timings (choose the reduce kernel)",
    )
    ap.add_argument(
        "--no-tma", action="store_true", help="--emit: ignore the TMA weight-load configs' timings"
    )
    args = ap.parse_args()
    if args.write_source is not None and args.emit is None:
        ap.error("--write-source needs --emit FILE")
    if args.emit is not None:
        emit(args.emit, args.write_source, args.no_inline, args.no_tma)
        return
    if args.sweep:
        ms = [m for m in args.m if m <= SPLITK_BUCKETS[-1]] if "--m" in sys.argv else list(SPLITK_BUCKETS)
        if not args.check and not torch.cuda.is_available():
            sys.exit("fp8_gemm_bench.py: timings need a CUDA GPU; on CPU, --sweep --check checks the configs")
        if not args.check:
            print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
        merged = json.loads(args.json.read_text()) if args.json is not None and args.json.exists() else {}
        for name in args.layers:
            n, k = TINY[name] if args.check else SHAPES[name]
            res = sweep_shape(
                name, n, k, ms, 1 if args.check else args.copies, args.reps, args.check, args.wide
            )
            merged.setdefault(name, {}).update(res)
            if args.json is not None and not args.check:
                args.json.write_text(json.dumps(merged, indent=1))
        return
    if args.check:
        ms = args.m if "--m" in sys.argv else [1, 5, 20]
        for name in args.layers:
            print(name)
            bench_shape(*TINY[name], ms, (32, 32), 1, 1, True, args.paths)
        return
    if not torch.cuda.is_available():
        sys.exit("fp8_gemm_bench.py: timings need a CUDA GPU; on CPU, --check runs the correctness checks")
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    faster, block_faster, prefill = [], [], []
    for name in args.layers:
        n, k = SHAPES[name]
        print(name)
        result = bench_shape(n, k, args.m, BLOCK, args.copies, args.reps, False, args.paths)
        skinny = [t for m, t in result.items() if m <= SKINNY_MAX_M]
        a, b = "fp8 triton (channel)", "fp8 quant+_scaled_mm"
        if skinny and all(a in t and (b not in t or t[a] < t[b]) for t in skinny):
            faster.append((n, k))
        decode = [t for m, t in result.items() if m <= SPLITK_MAX_M]
        a, a8, b = "fp8 split-K (block)", "fp8 split-K (block) a8", "fp8 triton (block)"
        if decode and all(
            (a in t or a8 in t) and (b not in t or min(t.get(a, 1.0), t.get(a8, 1.0)) < t[b]) for t in decode
        ):
            block_faster.append((n, k))
        for m, t in sorted(result.items()):
            if m > SPLITK_MAX_M:
                big = {
                    lb: v
                    for lb, v in t.items()
                    if lb.startswith("fp8 split-K (block) ") or "F.scaled_mm" in lb
                }
                if big:
                    best = min(big, key=big.__getitem__)
                    prefill.append(f"{name} M={m}: best {best} {big[best] * 1e6:.1f} us")
            elif a in t and a8 in t:
                prefill.append(f"{name} M={m}: block a16 {t[a] * 1e6:.1f} us, a8 {t[a8] * 1e6:.1f} us")
    print(
        f"\nTRITON_FASTER = frozenset({set(faster) if faster else 'set()'})  # (N, K), measured M <= {SKINNY_MAX_M}"
    )
    print(
        f"SPLITK_BLOCK_FASTER = frozenset({set(block_faster) if block_faster else 'set()'})"
        f"  # (N, K), measured M <= {SPLITK_MAX_M}"
    )
    print("\n".join(prefill))


if __name__ == "__main__":
    main()
