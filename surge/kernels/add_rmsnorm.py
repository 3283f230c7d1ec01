"""Fused residual add + RMSNorm (Triton), with the roundings of Hugging Face's ``LlamaRMSNorm``.

One program per row: ``s = x + residual`` (rounded to the input dtype, as HF's decoder layer
adds in that dtype), ``out = weight * (s.float() * rsqrt(mean(s^2) + eps)).to(dtype)``.
Without a residual it is plain RMSNorm. RMSNorm: Zhang & Sennrich, 2019.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rmsnorm_kernel(
    out_ptr,
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
    BLOCK: tl.constexpr,
):
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
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def add_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm of ``x + residual`` (or of ``x``), fused in one pass.

    Args:
        x: ``[num_tokens, hidden]`` (last dim contiguous).
        weight: ``[hidden]``, same dtype as ``x``.
        eps: epsilon inside the square root.
        residual: optional ``[num_tokens, hidden]``, same dtype as ``x``.

    Returns:
        ``(out, new_residual)``: ``out [num_tokens, hidden]`` the normalised sum;
        ``new_residual = x + residual`` (a new tensor), or ``None`` without ``residual``.

    Raises:
        ValueError: on mismatched shapes or a non-contiguous last dimension.
    """
    if x.dim() != 2 or weight.shape != (x.shape[1],) or x.stride(1) != 1:
        raise ValueError(
            f"x {tuple(x.shape)} must be [T, hidden] with weight [hidden], got {tuple(weight.shape)}"
        )
    if residual is not None and (residual.shape != x.shape or residual.stride(1) != 1):
        raise ValueError(f"residual {tuple(residual.shape)} does not match x {tuple(x.shape)}")
    num_rows, hidden = x.shape
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else None
    if num_rows == 0:
        return out, res_out
    block = triton.next_power_of_2(hidden)
    num_warps = min(max(block // 256, 1), 16)
    _add_rmsnorm_kernel[(num_rows,)](
        out,
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
        BLOCK=block,
        num_warps=num_warps,
    )
    return out, res_out
