"""SiLU-and-mul, the SwiGLU gate (Shazeer, 2020), in Triton.

``x [T, 2I] -> silu(x[:, :I]) * x[:, I:]`` with the roundings of the torch expression
``F.silu(gate) * up`` (silu in fp32 rounded to the input dtype, then the product rounded).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(
    out_ptr,
    x_ptr,
    n_cols,
    stride_x,
    stride_o,
    BLOCK: tl.constexpr,
):
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


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(x[:, :I]) * x[:, I:]``.

    Args:
        x: ``[num_tokens, 2 * I]`` (last dim contiguous).
        out: optional ``[num_tokens, I]`` output buffer, same dtype.

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
    _silu_and_mul_kernel[(num_rows, triton.cdiv(inter, block))](
        out, x, inter, x.stride(0), out.stride(0), BLOCK=block, num_warps=4
    )
    return out
