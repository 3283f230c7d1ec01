"""SiLU-and-mul, the SwiGLU gate (Shazeer, 2020), in Triton.

``x [T, 2I] -> silu(x[:, :I]) * x[:, I:]`` with the roundings of the torch expression
``F.silu(gate) * up`` (silu in fp32 rounded to the input dtype, then the product rounded).

:func:`silu_and_mul_fp8` also quantizes each output row per token to FP8 (e4m3), the input
of a w8a8 GEMM (``down_proj``): one program per row. In a step of at most
:data:`ONE_PASS_MAX_ROWS` rows, a row of up to :data:`ONE_PASS_MAX_COLS` outputs is held in
registers and read once (amax of the rounded products, then the quantized store); a wider row,
or a larger step, takes two passes (the amax, then the store, recomputing the products from
``x``). Both follow the rules of :mod:`surge.kernels.fp8_quant`, so it equals
:func:`surge.quant.fp8.quantize_per_token` of :func:`silu_and_mul`'s output bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from surge.kernels.pdl import pdl_wait, use_pdl
from surge.quant.config import FP8_E4M3_MAX, MIN_FP8_SCALE

ONE_PASS_MAX_COLS = 16384
"""Widest row (output columns, rounded up to a power of two) that :func:`silu_and_mul_fp8` keeps in
registers in one pass (32 warps, 16 fp32 values per thread at 16384), reading ``x`` once;
wider rows take an amax pass and a second, quantizing pass. Qwen3-8B's 12288 is one pass (in steps of
at most :data:`ONE_PASS_MAX_ROWS` rows)."""

ONE_PASS_MAX_ROWS = 64
"""Most rows (tokens) of a step that takes the one-pass form. On the H200 at Qwen3-8B's width the
one pass measured faster for a 64-row decode step (251 -> 214 us per step, 36 layers) and slower
for a 2048-row prefill (2,155 -> 3,343 us): its 32-warp programs leave too few rows in flight.
Larger steps keep the two passes with the launch they had before the one pass existed (``BLOCK =
min(4096, width)``; 8 warps from 2048 columns on, else 4), as measured then."""


@triton.jit
def _silu_and_mul_kernel(
    out_ptr,
    x_ptr,
    n_cols,
    stride_x,
    stride_o,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_cols
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + n_cols + offs, mask=mask, other=0.0)
    dtype = gate.dtype
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    y = act * up.to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_block(x_row, offs, n_cols):
    """``silu(gate) * up`` of columns ``offs`` in fp32, rounded to ``x``'s dtype as torch does."""
    mask = offs < n_cols
    gate = tl.load(x_row + offs, mask=mask, other=0.0)
    up = tl.load(x_row + n_cols + offs, mask=mask, other=0.0)
    dtype = gate.dtype
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    return (act * up.to(tl.float32)).to(dtype).to(tl.float32)


@triton.jit
def _silu_and_mul_fp8_kernel(
    q_ptr,
    s_ptr,
    x_ptr,
    n_cols,
    stride_x,
    stride_q,
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    BLOCK: tl.constexpr,
    ONE_PASS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_x
    q_row = q_ptr + row * stride_q
    if ONE_PASS:  # the whole row in registers (BLOCK >= n_cols): read x once
        y = _silu_mul_block(x_row, offs, n_cols)
        scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(y), 0), FP8_MAX), MIN_SCALE)
        tl.store(s_ptr + row, scale)
        q = tl.minimum(tl.maximum(tl.math.div_rn(y, scale), -FP8_MAX), FP8_MAX)
        tl.store(q_row + offs, q.to(q_ptr.dtype.element_ty), mask=offs < n_cols)
    else:  # amax pass, then a second pass that recomputes y and quantizes
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for c0 in range(0, n_cols, BLOCK):
            amax = tl.maximum(amax, tl.abs(_silu_mul_block(x_row, c0 + offs, n_cols)))
        scale = tl.maximum(tl.math.div_rn(tl.max(amax, 0), FP8_MAX), MIN_SCALE)
        tl.store(s_ptr + row, scale)
        for c0 in range(0, n_cols, BLOCK):
            y = _silu_mul_block(x_row, c0 + offs, n_cols)
            q = tl.minimum(tl.maximum(tl.math.div_rn(y, scale), -FP8_MAX), FP8_MAX)
            tl.store(q_row + c0 + offs, q.to(q_ptr.dtype.element_ty), mask=c0 + offs < n_cols)


def silu_and_mul(
    x: torch.Tensor, out: torch.Tensor | None = None, *, pdl: bool | None = None
) -> torch.Tensor:
    """``silu(x[:, :I]) * x[:, I:]``.

    Args:
        x: ``[num_tokens, 2 * I]`` (last dim contiguous).
        out: optional ``[num_tokens, I]`` output buffer, same dtype.
        pdl: launch with programmatic dependent launch (:mod:`surge.kernels.pdl`); None:
            :func:`surge.kernels.pdl.use_pdl` of ``x`` (sm90+).

    Returns:
        ``[num_tokens, I]`` in ``x``'s dtype.

    Raises:
        ValueError: if the last dimension is odd or not contiguous, or ``out`` mismatches.
    """
    if x.dim() != 2 or x.shape[1] % 2 != 0 or x.stride(1) != 1:
        raise ValueError(f"x must be [T, 2*I] with a contiguous last dim, got {tuple(x.shape)}")
    num_rows, two_i = x.shape
    inter = two_i // 2
    if out is None:
        out = torch.empty((num_rows, inter), dtype=x.dtype, device=x.device)
    elif out.shape != (num_rows, inter) or out.stride(1) != 1:
        raise ValueError(f"out must be [{num_rows}, {inter}], got {tuple(out.shape)}")
    if num_rows == 0:
        return out
    block = min(1024, triton.next_power_of_2(inter))
    if pdl is None:
        pdl = use_pdl(x)  # programmatic dependent launch on sm90+
    _silu_and_mul_kernel[(num_rows, triton.cdiv(inter, block))](
        out, x, inter, x.stride(0), out.stride(0), BLOCK=block, PDL=pdl, launch_pdl=pdl, num_warps=4
    )
    return out


def silu_and_mul_fp8(x: torch.Tensor, *, pdl: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu(x[:, :I]) * x[:, I:]`` quantized per token to FP8 (e4m3) in the same kernel.

    Args:
        x: ``[num_tokens, 2 * I]`` fp16/bf16/fp32 (last dim contiguous).
        pdl: launch with programmatic dependent launch (:mod:`surge.kernels.pdl`); None:
            :func:`surge.kernels.pdl.use_pdl` of ``x`` (sm90+).

    Returns:
        ``(out_fp8 [num_tokens, I] float8_e4m3fn, scale [num_tokens, 1] float32)``, equal bit
        for bit to ``quantize_per_token(silu_and_mul(x))``.

    Raises:
        ValueError: if ``x`` is not 2-D, its last dimension is odd or not contiguous.
    """
    if x.dim() != 2 or x.shape[1] % 2 != 0 or x.stride(1) != 1:
        raise ValueError(f"x must be [T, 2*I] with a contiguous last dim, got {tuple(x.shape)}")
    num_rows, two_i = x.shape
    inter = two_i // 2
    out = torch.empty((num_rows, inter), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((num_rows, 1), dtype=torch.float32, device=x.device)
    if num_rows == 0:
        return out, scale
    width = triton.next_power_of_2(max(inter, 16))
    one_pass = width <= ONE_PASS_MAX_COLS and num_rows <= ONE_PASS_MAX_ROWS
    block = width if one_pass else min(4096, width)
    if pdl is None:
        pdl = use_pdl(x)  # programmatic dependent launch on sm90+
    _silu_and_mul_fp8_kernel[(num_rows,)](
        out,
        scale,
        x,
        inter,
        x.stride(0),
        out.stride(0),
        FP8_MAX=FP8_E4M3_MAX,
        MIN_SCALE=MIN_FP8_SCALE,
        BLOCK=block,
        ONE_PASS=one_pass,
        PDL=pdl,
        launch_pdl=pdl,
        num_warps=min(32, max(4, block // 512)) if one_pass else 8 if block >= 2048 else 4,
    )
    return out, scale
