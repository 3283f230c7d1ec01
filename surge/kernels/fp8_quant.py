"""Dynamic per-token FP8 quantization of activations (Triton).

``x [M, K] -> (x_fp8 [M, K] float8_e4m3fn, scale [M, 1] float32)`` with ``scale = max(amax(|x_row|)
/ 448, 1e-12)`` and ``x_fp8 = clamp(x / scale, ±448)`` rounded to nearest even: the inputs of
``torch._scaled_mm``'s row-wise scaling. One program per row, two passes over ``K`` (the
amax, then the quantized store); the divisions are IEEE-rounded (``div_rn``), so the result
equals :func:`surge.quant.fp8.quantize_per_token` bit for bit. Fixed grid, no host syncs:
safe inside CUDA-graph capture.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from surge.kernels.pdl import pdl_wait, use_pdl
from surge.quant.config import FP8_E4M3_MAX, MIN_FP8_SCALE


@triton.jit
def _per_token_quant_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    K,
    stride_x,
    stride_q,
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_x
    q_row = q_ptr + row * stride_q
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        x = tl.load(x_row + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.math.div_rn(tl.max(amax, 0), FP8_MAX), MIN_SCALE)
    tl.store(s_ptr + row, scale)
    for k0 in range(0, K, BLOCK):
        mask = k0 + offs < K
        x = tl.load(x_row + k0 + offs, mask=mask, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -FP8_MAX), FP8_MAX)
        tl.store(q_row + k0 + offs, q.to(q_ptr.dtype.element_ty), mask=mask)


def per_token_quant_fp8(
    x: torch.Tensor,
    out: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    *,
    pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize each row of ``x`` to e4m3 with its own scale.

    Args:
        x: ``[M, K]`` fp16/bf16/fp32, last dim contiguous.
        out: optional ``[M, K]`` float8_e4m3fn buffer (last dim contiguous).
        scale: optional ``[M, 1]`` float32 buffer (contiguous).
        pdl: launch with programmatic dependent launch (:mod:`surge.kernels.pdl`); None:
            :func:`surge.kernels.pdl.use_pdl` of ``x`` (sm90+).

    Returns:
        ``(x_fp8 [M, K], scale [M, 1] float32)``, the dequantization multipliers.

    Raises:
        ValueError: a non-2-D or non-contiguous ``x``, or buffers of the wrong shape or dtype.
    """
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be 2-D with a contiguous last dim, got {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x must be fp16, bf16 or fp32, got {x.dtype}")
    m, k = x.shape
    if out is None:
        out = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    elif out.shape != (m, k) or out.dtype != torch.float8_e4m3fn or out.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {k}] float8_e4m3fn, got {tuple(out.shape)} {out.dtype}")
    if scale is None:
        scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    elif scale.shape != (m, 1) or scale.dtype != torch.float32 or not scale.is_contiguous():
        raise ValueError(f"scale must be a contiguous [{m}, 1] float32, got {tuple(scale.shape)}")
    if m == 0:
        return out, scale
    block = min(triton.next_power_of_2(max(k, 16)), 8192)  # rows up to 8192 wide: one block per pass
    if pdl is None:
        pdl = use_pdl(x)  # programmatic dependent launch on sm90+
    _per_token_quant_kernel[(m,)](
        x,
        out,
        scale,
        k,
        x.stride(0),
        out.stride(0),
        FP8_MAX=FP8_E4M3_MAX,
        MIN_SCALE=MIN_FP8_SCALE,
        BLOCK=block,
        PDL=pdl,
        launch_pdl=pdl,
        num_warps=4 if block <= 1024 else 8 if block <= 4096 else 16,
    )
    return out, scale
