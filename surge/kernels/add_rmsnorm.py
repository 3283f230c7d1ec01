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

:func:`add_rmsnorm_partials` and :func:`add_rmsnorm_partials_fp8` take ``x`` as the unreduced
output of a split-K FP8 GEMM (:class:`surge.quant.fp8.SplitKPartials`, from
:func:`surge.kernels.fp8_gemm_splitk.fp8_linear_splitk_partials`): each row program first sums
the row's partials in slice order and applies the scales and bias with the code of the GEMM's
own reduce kernel (:func:`surge.kernels.fp8_gemm_splitk.splitk_reduce_row`), rounds to the
activation dtype as that kernel's store does, then adds and normalises as above. The result is
bit for bit the reduce kernel followed by :func:`add_rmsnorm` (or ``add_rmsnorm_fp8``), with one
launch fewer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from surge.kernels.fp8_gemm_splitk import splitk_reduce_row
from surge.kernels.pdl import pdl_wait, use_pdl
from surge.quant.config import FP8_E4M3_MAX, MIN_FP8_SCALE
from surge.quant.fp8 import SplitKPartials


@triton.jit
def _add_norm_store(
    x,
    row,
    offs,
    mask,
    out_ptr,
    scale_ptr,
    res_out_ptr,
    res_ptr,
    w_ptr,
    eps,
    n_cols,
    stride_r,
    stride_o,
    stride_ro,
    HAS_RESIDUAL: tl.constexpr,
    FP8_OUT: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
):
    """Row ``row`` (``x``, in the input dtype): the residual add, RMSNorm and the stores."""
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
    _add_norm_store(
        x,
        row,
        offs,
        mask,
        out_ptr,
        scale_ptr,
        res_out_ptr,
        res_ptr,
        w_ptr,
        eps,
        n_cols,
        stride_r,
        stride_o,
        stride_ro,
        HAS_RESIDUAL,
        FP8_OUT,
        FP8_MAX,
        MIN_SCALE,
    )


@triton.jit(do_not_specialize=["num_rows"])
def _splitk_add_rmsnorm_kernel(
    out_ptr,
    scale_ptr,
    res_out_ptr,
    p_ptr,
    ws_ptr,
    xs_ptr,
    b_ptr,
    res_ptr,
    w_ptr,
    eps,
    num_rows,
    n_cols,
    stride_r,
    stride_o,
    stride_ro,
    SPLIT_K: tl.constexpr,
    A8: tl.constexpr,
    CHANNEL_SCALES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DTYPE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    FP8_OUT: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """:func:`_add_rmsnorm_kernel` whose ``x`` row is the split-K GEMM's output row, reduced
    here from its partials ``[SPLIT_K, num_rows, n_cols]`` by the reduce kernel's own code and
    rounded to ``DTYPE`` as that kernel's store does."""
    pdl_wait(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    acc = splitk_reduce_row(
        p_ptr, ws_ptr, xs_ptr, b_ptr, row, offs, mask, num_rows, n_cols, SPLIT_K, A8, CHANNEL_SCALES, HAS_BIAS
    )
    _add_norm_store(
        acc.to(DTYPE),
        row.to(tl.int64),
        offs,
        mask,
        out_ptr,
        scale_ptr,
        res_out_ptr,
        res_ptr,
        w_ptr,
        eps,
        n_cols,
        stride_r,
        stride_o,
        stride_ro,
        HAS_RESIDUAL,
        FP8_OUT,
        FP8_MAX,
        MIN_SCALE,
    )


_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


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


def _check_partials(p: SplitKPartials, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    parts = p.partials
    if parts.dim() != 3 or parts.shape[0] < 2 or parts.dtype != torch.float32 or not parts.is_contiguous():
        raise ValueError(
            f"partials {tuple(parts.shape)} {parts.dtype} must be contiguous float32 [split_k >= 2, T, hidden]"
        )
    _, m, n = parts.shape
    if weight.shape != (n,):
        raise ValueError(f"weight {tuple(weight.shape)} must be [{n}] for partials of {n} columns")
    if p.dtype not in _TL_DTYPES:
        raise ValueError(f"partials' output dtype must be fp16, bf16 or fp32, got {p.dtype}")
    if p.weight_scale is not None and (p.weight_scale.numel() != n or not p.weight_scale.is_contiguous()):
        raise ValueError(f"weight_scale {tuple(p.weight_scale.shape)} must be [{n}] contiguous")
    if p.token_scale is not None and (p.token_scale.numel() != m or not p.token_scale.is_contiguous()):
        raise ValueError(f"token_scale {tuple(p.token_scale.shape)} must be [{m}, 1] contiguous")
    if p.bias is not None and (p.bias.shape != (n,) or not p.bias.is_contiguous()):
        raise ValueError(f"bias {tuple(p.bias.shape)} must be [{n}] contiguous")
    if residual is not None and (
        residual.shape != (m, n) or residual.stride(1) != 1 or residual.dtype != p.dtype
    ):
        raise ValueError(
            f"residual {tuple(residual.shape)} {residual.dtype} must be [{m}, {n}] {p.dtype}, last dim contiguous"
        )


def _launch_partials(
    out: torch.Tensor,
    scale: torch.Tensor | None,
    res_out: torch.Tensor | None,
    p: SplitKPartials,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    pdl: bool | None,
) -> None:
    split_k, num_rows, hidden = p.partials.shape
    if num_rows == 0:
        return
    block = triton.next_power_of_2(hidden)
    num_warps = min(max(block // 256, 1), 16)
    if pdl is None:
        pdl = use_pdl(p.partials)
    parts = p.partials
    _splitk_add_rmsnorm_kernel[(num_rows,)](
        out,
        scale if scale is not None else out,
        res_out if res_out is not None else out,
        parts,
        p.weight_scale if p.weight_scale is not None else parts,
        p.token_scale if p.token_scale is not None else parts,
        p.bias if p.bias is not None else parts,
        residual if residual is not None else out,
        weight,
        eps,
        num_rows,
        hidden,
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        res_out.stride(0) if res_out is not None else 0,
        SPLIT_K=split_k,
        A8=p.token_scale is not None,
        CHANNEL_SCALES=p.weight_scale is not None,
        HAS_BIAS=p.bias is not None,
        DTYPE=_TL_DTYPES[p.dtype],
        HAS_RESIDUAL=residual is not None,
        FP8_OUT=scale is not None,
        FP8_MAX=FP8_E4M3_MAX,
        MIN_SCALE=MIN_FP8_SCALE,
        BLOCK=block,
        PDL=pdl,
        launch_pdl=pdl,
        num_warps=num_warps,
    )


def add_rmsnorm_partials(
    x: SplitKPartials,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`add_rmsnorm` of the split-K GEMM output that ``x`` stands for, reducing its
    partials in the same launch (see the module docstring).

    Args:
        x: the GEMM's :class:`SplitKPartials` (``partials [S, T, hidden]`` float32 contiguous,
            ``S >= 2``; output dtype fp16/bf16/fp32).
        weight: ``[hidden]`` in ``x.dtype``.
        eps: epsilon inside the square root.
        residual: optional ``[T, hidden]`` in ``x.dtype`` (last dim contiguous).
        pdl: launch with programmatic dependent launch (:mod:`surge.kernels.pdl`); None:
            :func:`surge.kernels.pdl.use_pdl` of the partials (sm90+).

    Returns:
        ``(out, new_residual)``, ``[T, hidden]`` in ``x.dtype``: bit for bit
        ``add_rmsnorm(splitk_reduce(x), weight, eps, residual)`` where ``splitk_reduce`` is the
        GEMM's reduce kernel (:func:`surge.quant.fp8.splitk_reduce_reference` in torch);
        ``new_residual`` is None without ``residual``.

    Raises:
        ValueError: partials not ``[S >= 2, T, hidden]`` contiguous float32, or scales, bias,
            weight or residual that do not match them.
    """
    _check_partials(x, weight, residual)
    _, m, n = x.partials.shape
    out = torch.empty((m, n), dtype=x.dtype, device=x.partials.device)
    res_out = torch.empty_like(out) if residual is not None else None
    _launch_partials(out, None, res_out, x, weight, eps, residual, pdl)
    return out, res_out


def add_rmsnorm_partials_fp8(
    x: SplitKPartials,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`add_rmsnorm_partials` with its output quantized per token to FP8 (e4m3), as
    :func:`add_rmsnorm_fp8` does: arguments and errors as :func:`add_rmsnorm_partials`.

    Returns:
        ``(out_fp8 [T, hidden] float8_e4m3fn, scale [T, 1] float32, new_residual)``, bit for
        bit ``add_rmsnorm_fp8(splitk_reduce(x), weight, eps, residual)``.
    """
    _check_partials(x, weight, residual)
    _, m, n = x.partials.shape
    dev = x.partials.device
    out = torch.empty((m, n), dtype=torch.float8_e4m3fn, device=dev)
    scale = torch.empty((m, 1), dtype=torch.float32, device=dev)
    res_out = torch.empty((m, n), dtype=x.dtype, device=dev) if residual is not None else None
    _launch_partials(out, scale, res_out, x, weight, eps, residual, pdl)
    return out, scale, res_out
