"""Skinny GEMM for decode steps: ``y [M, N] = x [M, K] @ w [N, K]^T (+ bias)`` with small ``M``.

A decode step multiplies a few token rows by large weights, so it is bound by reading the
weight once from HBM. cuBLAS picks split-K kernels for these shapes and adds a reduce kernel
per call; this kernel instead tiles only ``N`` (and ``M`` in blocks of 16 or 32) and loops over
the whole of ``K`` in one program, so each weight tile is read once, with no second launch.
Grid ``(cdiv(N, BLOCK_N), cdiv(M, BLOCK_M))``, fp32 accumulation, ``tl.dot(x, w^T)`` per
``BLOCK_K`` step, masked tails on ``M``, ``N`` and ``K``. The technique is the standard
tiled GEMM of the Triton matmul tutorial, without split-K; the tile sizes are the ones measured
best on an H200 by ``benchmarks/gemm_bench.py``.

The engine uses it only for the weight shapes where it measured faster than cuBLAS on the
H200 (:data:`FASTER_THAN_CUBLAS`); elsewhere cuBLAS stays. A SiLU-and-mul prologue fused into
the down projection was tried and measured 7x slower than ``silu_and_mul`` + cuBLAS (218 us
against 31 us per call at M = 1), so it is not part of the kernel.

The launch depends only on the shapes (no host syncs), so it is safe inside CUDA-graph capture.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from surge.kernels.pdl import pdl_wait, use_pdl

SKINNY_MAX_M = 16
"""Largest token count ``M`` the engine sends to this kernel; above it cuBLAS is as fast."""

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_SMEM_BUDGET = 180 * 1024
"""Bytes of shared memory a config may plan for its pipelined tiles (H200: 227 KiB per block)."""


@dataclass(frozen=True)
class SkinnyGemmConfig:
    """Tile sizes and launch parameters of :func:`_skinny_gemm_kernel`.

    ``block_m``, ``block_n``, ``block_k`` are powers of two >= 16 (``tl.dot``'s minimum).
    """

    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    num_warps: int


FASTER_THAN_CUBLAS: frozenset[tuple[int, int]] = frozenset({(4096, 4096), (151936, 4096)})
"""Weight shapes ``(N, K)`` where this kernel beat cuBLAS on the H200 for 1..16 tokens
(``benchmarks/gemm_bench.py``, CUDA graphs, bf16): Qwen3-8B's o_proj (12.2 vs 13.3 us at M=1,
11.3 vs 13.3 us at M=16) and LM head (278.8 vs 298.5 us at M=1). For qkv, gate_up and down
cuBLAS was as fast or faster (e.g. down 28.3 vs 29.7 us at M=1)."""

# Best (block_n, block_k, num_stages, num_warps) on an H200 (bf16, CUDA graphs, weights not in
# L2; benchmarks/gemm_bench.py --sweep) per Qwen3-8B layer shape (N, K), for M == 1 and for
# 1 < M <= 16.
_MEASURED: dict[tuple[int, int], tuple[tuple[int, int, int, int], tuple[int, int, int, int]]] = {
    (6144, 4096): ((64, 128, 5, 4), (64, 128, 5, 4)),  # qkv_proj
    (4096, 4096): ((32, 128, 5, 4), (32, 256, 5, 4)),  # o_proj
    (24576, 4096): ((64, 128, 3, 4), (64, 128, 3, 4)),  # gate_up_proj
    (4096, 12288): ((32, 256, 5, 4), (32, 256, 5, 4)),  # down_proj
    (151936, 4096): ((64, 128, 5, 4), (64, 256, 3, 4)),  # lm_head
}


def skinny_config(m: int, n: int, k: int, dtype: torch.dtype) -> SkinnyGemmConfig:
    """The launch config for ``[m, k] @ [n, k]^T`` (``k`` = the weight's in-features).

    ``block_m`` is 16 for ``m <= 16``, 32 for ``m <= 32``, else 64. ``block_n``, ``block_k``,
    stages and warps come from the measured table ``_MEASURED`` for known ``(n, k)``; otherwise
    ``block_n = 32`` for ``n <= 4096`` (enough programs to fill the GPU's SMs), else 64, and
    ``block_k = 256`` for ``k >= 8192``, else 128, 4 stages, 4 warps. Then blocks are shrunk to
    the problem (``next_power_of_2``, at least 16), ``block_k`` is capped at 128 for
    ``block_m = 64``, and stages (then ``block_k``) are reduced until the pipelined tiles,
    ``stages * (block_m + block_n) * block_k * itemsize`` bytes, fit
    ``_SMEM_BUDGET``.
    """
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    measured = _MEASURED.get((n, k))
    if measured is not None:
        block_n, block_k, stages, warps = measured[0 if m <= 1 else 1]
    else:
        block_n = 32 if n <= 4096 else 64
        block_k = 256 if k >= 8192 else 128
        stages, warps = 4, 4
    block_n = min(block_n, max(16, triton.next_power_of_2(n)))
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    if block_m >= 64:
        block_k = min(block_k, 128)
    itemsize = dtype.itemsize
    a_rows = block_m

    def smem(stages: int, block_k: int) -> int:
        return stages * (a_rows + block_n) * block_k * itemsize

    while smem(stages, block_k) > _SMEM_BUDGET and stages > 2:
        stages -= 1
    while smem(stages, block_k) > _SMEM_BUDGET and block_k > 16:
        block_k //= 2
    return SkinnyGemmConfig(block_m, block_n, block_k, stages, warps)


@triton.jit
def _skinny_gemm_kernel(
    y_ptr,
    x_ptr,
    w_ptr,
    b_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
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
        w = tl.load(w_ptrs, mask=w_mask, other=0.0)
        if DOT_IEEE:
            acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _check_and_launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
    config: SkinnyGemmConfig | None,
) -> torch.Tensor:
    name = "x"
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"{name} and weight must be 2-D, got {tuple(x.shape)} and {tuple(weight.shape)}")
    m = x.shape[0]
    n, k = weight.shape
    if x.shape[1] != k:
        raise ValueError(f"{name} must be [M, {k}] for weight {tuple(weight.shape)}, got {tuple(x.shape)}")
    if x.dtype not in _DTYPES or weight.dtype != x.dtype:
        raise ValueError(
            f"{name} and weight must share a dtype among fp16/bf16/fp32, got {x.dtype} and {weight.dtype}"
        )
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(f"{name} and weight need a contiguous last dimension")
    if weight.device != x.device:
        raise ValueError(f"weight is on {weight.device}, {name} on {x.device}")
    if bias is not None and (
        bias.shape != (n,) or bias.dtype != x.dtype or bias.stride(0) != 1 or bias.device != x.device
    ):
        raise ValueError(
            f"bias must be a contiguous [{n}] {x.dtype} tensor, got {tuple(bias.shape)} {bias.dtype}"
        )
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    elif out.shape != (m, n) or out.dtype != x.dtype or out.stride(1) != 1 or out.device != x.device:
        raise ValueError(
            f"out must be [{m}, {n}] {x.dtype} with a contiguous last dim, got {tuple(out.shape)}"
        )
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.copy_(bias.expand(m, n)) if bias is not None else out.zero_()
    cfg = config if config is not None else skinny_config(m, n, k, x.dtype)
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m))
    pdl = use_pdl(x)  # programmatic dependent launch on sm90+
    _skinny_gemm_kernel[grid](
        out,
        x,
        weight,
        bias if bias is not None else weight,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None,
        EVEN_K=k % cfg.block_k == 0,
        DOT_IEEE=x.dtype == torch.float32,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        num_stages=cfg.num_stages,
        PDL=pdl,
        launch_pdl=pdl,
        num_warps=cfg.num_warps,
    )
    return out


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: SkinnyGemmConfig | None = None,
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for few rows, as one Triton kernel without split-K.

    Args:
        x: ``[M, K]`` fp16, bf16 or fp32, last dim contiguous.
        weight: ``[N, K]``, same dtype and device, last dim contiguous.
        bias: optional contiguous ``[N]``, same dtype (added in fp32 before the final rounding).
        out: optional ``[M, N]`` output buffer in ``x``'s dtype, last dim contiguous.
        config: tile sizes; default :func:`skinny_config` of the shapes.

    Returns:
        ``[M, N]`` in ``x``'s dtype (``out`` when given); fp32 accumulation (fp32 inputs use
        IEEE fp32 products, not TF32).

    Raises:
        ValueError: on non-2-D inputs, mismatched ``K``, dtype or device, an unsupported dtype,
            a non-contiguous last dimension, or a ``bias``/``out`` of the wrong shape or dtype.
    """
    return _check_and_launch(x, weight, bias, out, config)


def use_skinny(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the engine should run ``x [M, *] @ weight^T`` with this kernel instead of cuBLAS.

    True for CUDA tensors, 2-D, ``1 <= M <= SKINNY_MAX_M``, both fp16 or both bf16, last
    dimensions contiguous, and a weight shape in :data:`FASTER_THAN_CUBLAS`. ``K`` is not
    checked against ``x`` here (the launcher raises ``ValueError``).
    """
    return (
        tuple(weight.shape) in FASTER_THAN_CUBLAS
        and x.is_cuda
        and x.dim() == 2
        and weight.dim() == 2
        and 1 <= x.shape[0] <= SKINNY_MAX_M
        and x.dtype in (torch.float16, torch.bfloat16)
        and weight.dtype == x.dtype
        and x.stride(1) == 1
        and weight.stride(1) == 1
    )
