"""Weight-only FP8 GEMM: ``y [M, N] = x [M, K] @ dequant(w_fp8 [N, K])^T (+ bias)`` (Triton).

The weight is read in e4m3 (half the bytes of bf16) and converted to ``x``'s dtype in
registers; the activations stay in their dtype. Two scale layouts:

* **per channel** (``scale [N]``): ``acc = x @ w^T`` over the whole of ``K`` in fp32, then
  ``acc * scale[n]`` once;
* **block-wise** (``scale [cdiv(N, bn), cdiv(K, bk)]``, the ``weight_scale_inv`` of Qwen's and
  DeepSeek's FP8 checkpoints): each ``BLOCK_K`` step (a divisor of ``bk``) adds its partial
  product times the scale of its ``(n // bn, k // bk)`` block.

Grid ``(cdiv(N, BLOCK_N), cdiv(M, BLOCK_M))``, each program loops over all of ``K`` (no
split-K), masked tails; the standard tiled GEMM of the Triton matmul tutorial with a
dequantizing load. Decode steps (``M <= 16``) are bound by reading the weight, so reading it
in FP8 is what makes them faster; the engine uses this kernel for those shapes where it
measured faster than ``torch._scaled_mm`` (:data:`surge.quant.fp8_linear.TRITON_FASTER`), for
block-wise layers where the split-K kernel has no config (decode steps of unmeasured shapes,
non-bf16 models), and where ``_scaled_mm`` cannot run (dims not multiples of 16, fp16 outputs). The launch depends only on shapes: safe inside CUDA-graph capture.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class Fp8GemmConfig:
    """Tile sizes and launch parameters of :func:`_fp8_gemm_kernel` (powers of two >= 16)."""

    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    num_warps: int


def fp8_gemm_config(m: int, n: int, k: int, block_size: tuple[int, int] | None = None) -> Fp8GemmConfig:
    """Default tiles for ``[m, k] @ [n, k]^T``.

    ``block_m`` 16 for ``m <= 16``, 32 for ``m <= 32``, 64 for ``m <= 64``, else 128;
    ``block_n`` 64 for decode shapes (``m <= 16``; enough programs to fill the SMs at
    ``n = 4096``), else 128; ``block_k`` 128, at most the scale block's ``bk`` (its largest
    power-of-two divisor), shrunk to the problem. 4 stages, 4 warps (8 for 128-row tiles).
    These are starting points; ``benchmarks/fp8_gemm_bench.py`` times them on the GPU.
    """
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 128
    block_n = 64 if m <= 16 else 128
    block_k = 128
    if block_size is not None:
        bk = block_size[1]
        block_k = min(block_k, bk & -bk)
    block_n = min(block_n, max(16, triton.next_power_of_2(n)))
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    warps = 8 if block_m >= 128 else 4
    stages = 3 if block_m >= 128 else 4
    return Fp8GemmConfig(block_m, block_n, block_k, stages, warps)


@triton.jit
def _fp8_gemm_kernel(
    y_ptr,
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    stride_sn,
    HAS_BIAS: tl.constexpr,
    BLOCK_SCALES: tl.constexpr,
    SCALE_BN: tl.constexpr,
    SCALE_BK: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    s_rows = s_ptr + (offs_n // SCALE_BN).to(tl.int64) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            x_mask = mask_m[:, None]
            w_mask = mask_n[:, None]
        else:
            k_mask = kb * BLOCK_K + offs_k < K
            x_mask = mask_m[:, None] & k_mask[None, :]
            w_mask = mask_n[:, None] & k_mask[None, :]
        a = tl.load(x_ptrs, mask=x_mask, other=0.0)
        w = tl.load(w_ptrs, mask=w_mask, other=0.0).to(a.dtype)
        if BLOCK_SCALES:
            if DOT_IEEE:
                part = tl.dot(a, tl.trans(w), input_precision="ieee")
            else:
                part = tl.dot(a, tl.trans(w))
            s = tl.load(s_rows + (kb * BLOCK_K) // SCALE_BK, mask=mask_n, other=0.0)
            acc += part * s[None, :]
        else:
            if DOT_IEEE:
                acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if not BLOCK_SCALES:
        acc = acc * tl.load(s_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def check_fp8_gemm_args(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    block_size: tuple[int, int] | None,
    bias: torch.Tensor | None,
    x_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> tuple[int, int, int, int, int, int]:
    """Validate the operands of an FP8-weight GEMM ``x [M, K] @ weight[N, K]^T`` (shared by
    :func:`fp8_linear` and the split-K kernel's launcher). With ``x_scale`` (the split-K
    kernel's w8a8 mode), ``x`` is already quantized per token: float8_e4m3fn with float32
    ``x_scale [M, 1]``, and the output (and ``bias``) in ``out_dtype`` (fp16/bf16).

    Returns:
        ``(M, N, K, scale_bn, scale_bk, stride_sn)``: the scale's block shape (``1, 1`` and a
        row stride of 0 for per-channel ``[N]`` scales) and its row stride in elements.

    Raises:
        ValueError: non-2-D or mismatched shapes, ``x`` not fp16/bf16/fp32 or ``weight`` not
            float8_e4m3fn, a non-contiguous last dimension, operands on different devices, a
            non-float32 ``scale`` or one of the wrong shape, or a ``bias`` that is not a
            contiguous ``[N]`` in ``x``'s dtype (``out_dtype`` with ``x_scale``); with
            ``x_scale``: ``x`` not e4m3, ``x_scale`` not a contiguous float32 ``[M, 1]`` on
            ``x``'s device, or ``out_dtype`` not fp16/bf16.
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)} must be [M, K] and [N, K]")
    act_dtype = x.dtype
    if x_scale is not None:
        m = x.shape[0]
        if x.dtype != torch.float8_e4m3fn or out_dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(
                f"pre-quantized x must be float8_e4m3fn with a fp16/bf16 out_dtype, got {x.dtype}"
            )
        if x_scale.shape != (m, 1) or x_scale.dtype != torch.float32 or not x_scale.is_contiguous():
            raise ValueError(f"x_scale must be a contiguous [{m}, 1] float32, got {tuple(x_scale.shape)}")
        if x_scale.device != x.device:
            raise ValueError("x_scale must be on x's device")
        act_dtype = out_dtype
    elif x.dtype not in _DTYPES:
        raise ValueError(f"x must be fp16/bf16/fp32, got {x.dtype}")
    if weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"weight must be float8_e4m3fn, got {weight.dtype}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("x and weight need a contiguous last dimension")
    if weight.device != x.device or scale.device != x.device or scale.dtype != torch.float32:
        raise ValueError("weight and float32 scale must be on x's device")
    m, k = x.shape
    n = weight.shape[0]
    if block_size is None:
        if scale.numel() != n or not scale.is_contiguous():
            raise ValueError(f"per-channel scale must be a contiguous [{n}], got {tuple(scale.shape)}")
        scale_bn, scale_bk, stride_sn = 1, 1, 0
    else:
        scale_bn, scale_bk = block_size
        want = (-(-n // scale_bn), -(-k // scale_bk))
        if tuple(scale.shape) != want or scale.stride(1) != 1:
            raise ValueError(
                f"block scale must be {want} with a contiguous last dim, got {tuple(scale.shape)}"
            )
        stride_sn = scale.stride(0)
    if bias is not None and (bias.shape != (n,) or bias.dtype != act_dtype or bias.stride(0) != 1):
        raise ValueError(f"bias must be a contiguous [{n}] {act_dtype} tensor")
    return m, n, k, scale_bn, scale_bk, stride_sn


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    block_size: tuple[int, int] | None = None,
    out: torch.Tensor | None = None,
    config: Fp8GemmConfig | None = None,
) -> torch.Tensor:
    """``x @ dequant(weight)^T + bias`` with an FP8 weight, dequantized in registers.

    Args:
        x: ``[M, K]`` fp16/bf16/fp32, last dim contiguous (not quantized).
        weight: ``[N, K]`` float8_e4m3fn, last dim contiguous.
        scale: float32 dequantization multipliers: ``[N]`` (or ``[1, N]``) per output
            channel, or ``[cdiv(N, bn), cdiv(K, bk)]`` with ``block_size = (bn, bk)``.
        bias: optional contiguous ``[N]`` in ``x``'s dtype (added in fp32).
        block_size: ``(bn, bk)`` of block scales, None for per-channel scales.
        out: optional ``[M, N]`` output in ``x``'s dtype, last dim contiguous.
        config: tile override (benchmarks); default :func:`fp8_gemm_config`.

    Returns:
        ``[M, N]`` in ``x``'s dtype; fp32 accumulation (IEEE products for fp32 ``x``).

    Raises:
        ValueError: mismatched shapes, dtypes or devices, a non-contiguous last dimension, or
            a ``config.block_k`` that does not divide ``bk``.
    """
    m, n, k, scale_bn, scale_bk, stride_sn = check_fp8_gemm_args(x, weight, scale, block_size, bias)
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    elif out.shape != (m, n) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {n}] {x.dtype} with a contiguous last dim")
    if m == 0 or n == 0:
        return out
    cfg = config or fp8_gemm_config(m, n, k, block_size)
    if block_size is not None and scale_bk % cfg.block_k != 0:
        raise ValueError(f"block_k {cfg.block_k} must divide the scale block's {scale_bk} columns")
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m))
    _fp8_gemm_kernel[grid](
        out,
        x,
        weight,
        scale,
        bias if bias is not None else scale,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        stride_sn,
        HAS_BIAS=bias is not None,
        BLOCK_SCALES=block_size is not None,
        SCALE_BN=scale_bn,
        SCALE_BK=scale_bk,
        EVEN_K=k % cfg.block_k == 0,
        DOT_IEEE=x.dtype == torch.float32,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        num_stages=cfg.num_stages,
        num_warps=cfg.num_warps,
    )
    return out
