"""Fused residual add + RMSNorm (Triton), with the roundings of Hugging Face's ``LlamaRMSNorm``.

One program per row: ``s = x + residual`` (rounded to the input dtype, as HF's decoder layer
adds in that dtype), ``out = weight * (s.float() * rsqrt(mean(s^2) + eps)).to(dtype)``.
Without a residual it is plain RMSNorm. RMSNorm: Zhang & Sennrich, 2019.

:func:`add_rmsnorm_fp8` is the same kernel with the dynamic per-token FP8 quantization of
:mod:`surge.kernels.fp8_quant` as its epilogue: it writes ``out`` as float8_e4m3fn plus one
float32 scale per row instead of the bf16 row, bit for bit what
:func:`surge.quant.fp8.quantize_per_token` gives on :func:`add_rmsnorm`'s output (the row is
rounded to the input dtype first, then ``scale = max(amax / 448, 1e-12)``, ``q = clamp(y /
scale, ±448)`` with IEEE divisions), so the w8a8 GEMM that consumes it needs no quantization
launch of its own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from surge.kernels.pdl import pdl_wait, use_pdl
from surge.quant.config import FP8_E4M3_MAX, MIN_FP8_SCALE


@triton.jit
def _add_rmsnorm_kernel(
    out_ptr,
    scale_ptr,
    res_out_ptr,
    x_ptr,
    res_ptr,
    w_ptr,
    eps,
    n_cols,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    HAS_RESIDUAL: tl.constexpr,
    FP8_OUT: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / n_cols + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = (xf * rstd).to(dtype).to(tl.float32) * w
    if FP8_OUT:
        y = y.to(dtype).to(tl.float32)  # the normed row in the input dtype, as the reference has it
        scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(y), 0), FP8_MAX), MIN_SCALE)
        q = tl.minimum(tl.maximum(tl.math.div_rn(y, scale), -FP8_MAX), FP8_MAX)
        tl.store(out_ptr + row * stride_o + offs, q.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr + row, scale)
    else:
        tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    if x.dim() != 2 or weight.shape != (x.shape[1],) or x.stride(1) != 1:
        raise ValueError(
            f"x {tuple(x.shape)} must be [T, hidden] with weight [hidden], got {tuple(weight.shape)}"
        )
    if residual is not None and (residual.shape != x.shape or residual.stride(1) != 1):
        raise ValueError(f"residual {tuple(residual.shape)} does not match x {tuple(x.shape)}")


def _launch(
    out: torch.Tensor,
    scale: torch.Tensor | None,
    res_out: torch.Tensor | None,
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    pdl: bool | None,
) -> None:
    num_rows, hidden = x.shape
    if num_rows == 0:
        return
    block = triton.next_power_of_2(hidden)
    num_warps = min(max(block // 256, 1), 16)
    if pdl is None:
        pdl = use_pdl(x)  # programmatic dependent launch on sm90+
    _add_rmsnorm_kernel[(num_rows,)](
        out,
        scale if scale is not None else out,
        res_out if res_out is not None else out,
        x,
        residual if residual is not None else x,
        weight,
        eps,
        hidden,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        res_out.stride(0) if res_out is not None else 0,
        HAS_RESIDUAL=residual is not None,
        FP8_OUT=scale is not None,
        FP8_MAX=FP8_E4M3_MAX,
        MIN_SCALE=MIN_FP8_SCALE,
        BLOCK=block,
        PDL=pdl,
        launch_pdl=pdl,
        num_warps=num_warps,
    )


def add_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm of ``x + residual`` (or of ``x``), fused in one pass.

    Args:
        x: ``[num_tokens, hidden]`` (last dim contiguous).
        weight: ``[hidden]``, same dtype as ``x``.
        eps: epsilon inside the square root.
        residual: optional ``[num_tokens, hidden]``, same dtype as ``x``.
        pdl: launch with programmatic dependent launch (:mod:`surge.kernels.pdl`); None:
            :func:`surge.kernels.pdl.use_pdl` of ``x`` (sm90+).

    Returns:
        ``(out, new_residual)``: ``out [num_tokens, hidden]`` the normalised sum;
        ``new_residual = x + residual`` (a new tensor), or ``None`` without ``residual``.

    Raises:
        ValueError: on mismatched shapes or a non-contiguous last dimension.
    """
    _check(x, weight, residual)
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else None
    _launch(out, None, res_out, x, weight, eps, residual, pdl)
    return out, res_out


def add_rmsnorm_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`add_rmsnorm` with its output quantized per token to FP8 (e4m3) in the same pass.

    Args:
        x: ``[num_tokens, hidden]`` fp16/bf16/fp32 (last dim contiguous).
        weight: ``[hidden]``, same dtype as ``x``.
        eps: epsilon inside the square root.
        residual: optional ``[num_tokens, hidden]``, same dtype as ``x``.
        pdl: launch with programmatic dependent launch (:mod:`surge.kernels.pdl`); None:
            :func:`surge.kernels.pdl.use_pdl` of ``x`` (sm90+).

    Returns:
        ``(out_fp8, scale, new_residual)``: ``out_fp8 [num_tokens, hidden]`` float8_e4m3fn and
        ``scale [num_tokens, 1]`` float32 (the dequantization multipliers), equal bit for bit to
        ``quantize_per_token(add_rmsnorm(x, weight, eps, residual)[0])``; ``new_residual`` as
        in :func:`add_rmsnorm`.

    Raises:
        ValueError: on mismatched shapes or a non-contiguous last dimension.
    """
    _check(x, weight, residual)
    num_rows, hidden = x.shape
    out = torch.empty((num_rows, hidden), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((num_rows, 1), dtype=torch.float32, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else None
    _launch(out, scale, res_out, x, weight, eps, residual, pdl)
    return out, scale, res_out
