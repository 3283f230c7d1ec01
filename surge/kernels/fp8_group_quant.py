"""Dynamic per-token, per-128-column-group FP8 quantization of activations (Triton).

``x [M, K] -> (x_fp8 [M_pad, K] float8_e4m3fn, scale [M_pad, K / 128] float32)``: each row's
each group of 128 consecutive columns gets its own scale ``max(amax(|x_group|) / 448, 1e-12)``
and ``x_fp8 = clamp(x / scale, ±448)`` rounded to nearest even: the activation operand of
cuBLAS's block-scaled FP8 GEMM with ``BlockWise1x128`` scaling
(``torch.nn.functional.scaled_mm``, torch >= 2.9; see :func:`surge.quant.fp8_linear.block_scaled_mm_linear`).
The divisions are IEEE-rounded (``div_rn``), as in :mod:`surge.kernels.fp8_quant`, so the result
equals :func:`surge.quant.fp8.quantize_per_token_group` bit for bit on finite inputs. A NaN or
inf in a group is not propagated alike: Triton's max ignores NaNs, so the kernel's scale stays
finite where torch's becomes NaN (as with :mod:`surge.kernels.fp8_quant`'s per-token scales).

Layout: cuBLAS wants the scales outer-dim-major, i.e. ``scale`` has strides ``(1, M_pad)``; it
is allocated as ``[K / 128, M_pad]`` and returned transposed. Rows ``M .. M_pad - 1`` (padding
that cuBLAS's row alignment asks for) are written as zeros with scale 1.0, so they add nothing
and their output rows are zeros. One program per ``BLOCK_M`` rows x one group; fixed grid, no
host syncs: safe inside CUDA-graph capture.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from surge.kernels.pdl import pdl_wait, use_pdl
from surge.quant.config import FP8_ACT_GROUP, FP8_E4M3_MAX, MIN_FP8_SCALE

GROUP_SIZE = FP8_ACT_GROUP
"""Columns per activation scale (cuBLAS's ``BlockWise1x128``)."""

_BLOCK_M = 16


@triton.jit
def _group_quant_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    M,
    M_pad,
    stride_x,
    stride_q,
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    g = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = g * GROUP + tl.arange(0, GROUP)
    rows64 = rows.to(tl.int64)
    real = rows < M
    x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=real[:, None], other=0.0)
    x = x.to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    scale = tl.maximum(tl.math.div_rn(amax, FP8_MAX), MIN_SCALE)
    scale = tl.where(real, scale, 1.0)  # padding rows: zeros times 1.0
    q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale[:, None]), -FP8_MAX), FP8_MAX)
    stored = rows < M_pad
    tl.store(
        q_ptr + rows64[:, None] * stride_q + cols[None, :],
        q.to(q_ptr.dtype.element_ty),
        mask=stored[:, None],
    )
    tl.store(s_ptr + g.to(tl.int64) * M_pad + rows64, scale, mask=stored)


def per_token_group_quant_fp8(
    x: torch.Tensor, row_multiple: int = 1, *, pdl: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize each 128-column group of each row of ``x`` to e4m3 with its own scale.

    Args:
        x: ``[M, K]`` fp16/bf16/fp32, last dim contiguous, ``K`` a multiple of 128.
        row_multiple: the outputs get ``M_pad = cdiv(M, row_multiple) * row_multiple`` rows
            (cuBLAS's block-scaled GEMM needs ``M`` in multiples of 4, see
            :data:`surge.quant.fp8_linear.BLOCK_SCALED_MM_ROWS`); rows ``M ..`` are zeros with
            scale 1.0.
        pdl: launch with programmatic dependent launch (:mod:`surge.kernels.pdl`); None:
            :func:`surge.kernels.pdl.use_pdl` of ``x`` (sm90+).

    Returns:
        ``(x_fp8 [M_pad, K] float8_e4m3fn contiguous, scale [M_pad, K / 128] float32)``, the
        scale outer-dim-major (strides ``(1, M_pad)``), the dequantization multipliers.

    Raises:
        ValueError: a non-2-D ``x``, a non-contiguous last dim, another dtype, ``K`` not a
            multiple of 128, or ``row_multiple < 1``.
    """
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be 2-D with a contiguous last dim, got {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be fp16, bf16 or fp32, got {x.dtype}")
    m, k = x.shape
    if k % GROUP_SIZE:
        raise ValueError(f"x's K must be a multiple of {GROUP_SIZE}, got {k}")
    if row_multiple < 1:
        raise ValueError(f"row_multiple must be >= 1, got {row_multiple}")
    m_pad = -(-m // row_multiple) * row_multiple
    groups = k // GROUP_SIZE
    out = torch.empty((m_pad, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale_t = torch.empty((groups, m_pad), dtype=torch.float32, device=x.device)
    if m_pad == 0 or groups == 0:
        return out, scale_t.t()
    if pdl is None:
        pdl = use_pdl(x)  # programmatic dependent launch on sm90+
    _group_quant_kernel[(triton.cdiv(m_pad, _BLOCK_M), groups)](
        x,
        out,
        scale_t,
        m,
        m_pad,
        x.stride(0),
        out.stride(0),
        FP8_MAX=FP8_E4M3_MAX,
        MIN_SCALE=MIN_FP8_SCALE,
        GROUP=GROUP_SIZE,
        BLOCK_M=_BLOCK_M,
        PDL=pdl,
        launch_pdl=pdl,
        num_warps=4,
    )
    return out, scale_t.t()
