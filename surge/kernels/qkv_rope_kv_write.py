"""The qkv projection's split-K reduction fused into the q/k RMSNorm, rotary and K/V cache write
of a decode step (Triton).

An FP8 decode step's qkv GEMM (:mod:`surge.kernels.fp8_gemm_splitk`, a ``split_k > 1``
``"kernel"`` config) leaves float32 partials ``[S, T, q_size + 2 kv_size]``
(:class:`surge.quant.fp8.SplitKPartials`). Unfused, its reduce kernel sums them into the bf16
``qkv`` rows and :func:`surge.kernels.kv_write.fused_qk_norm_rope_kv_write` then norms and
rotates q and k and writes k and v into the paged cache: two short launches per layer. Here one
launch does both: each program sums its columns' partials with the reduce kernel's own code
(:func:`surge.kernels.fp8_gemm_splitk.splitk_reduce_row`: slice order, weight scales, token
scale, bias) and rounds them to the output dtype as that kernel's store does, then runs
:func:`surge.kernels.kv_write.norm_rope` and :func:`surge.kernels.kv_write.store_heads` as the
K/V write kernel does, so q, k, v and the cache bytes are those of the unfused pair.

Grid ``(T, 1 + cdiv(num_heads, QH))``: program ``(t, 0)`` reduces, norms and rotates token
``t``'s k heads, reduces its v heads, writes both into the cache at ``slot_mapping[t]``
(``-1``: padding, not written) and into the output; program ``(t, j)`` does q heads
``(j - 1) * QH ..`` of it, so a 16-token step still has enough programs to fill the GPU.
Floating-point contraction is off (``enable_fp_fusion=False``) as in the K/V write kernel.
Rotary: Su et al., "RoFormer", 2021; split-K: CUTLASS's split-K GEMMs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from surge.kernels.fp8_gemm_splitk import splitk_reduce_row
from surge.kernels.kv_write import norm_rope, store_heads
from surge.kernels.pdl import pdl_wait, use_pdl
from surge.quant.config import FP8_E4M3_MAX
from surge.quant.fp8 import SplitKPartials

_FP_FUSION = False
"""``enable_fp_fusion`` of the launch: off, as :mod:`surge.kernels.kv_write`'s (see there)."""

Q_HEADS_PER_PROGRAM = 4
"""Query heads per program (a power of two): Qwen3-8B's 32 heads in 8 programs plus the k/v
program, 144 programs for a 16-token step on an H200's 132 SMs."""

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _reduce_heads(
    p_ptr,
    ws_ptr,
    xs_ptr,
    b_ptr,
    token,
    col0,
    offs_h,
    offs_d,
    mask,
    M,
    N,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    SPLIT_K: tl.constexpr,
    A8: tl.constexpr,
    CHANNEL_SCALES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Heads ``offs_h`` of token ``token``'s output columns from ``col0`` as float32 halves
    ``[heads, HALF_PAD]``: the reduce kernel's row sum before its store's rounding."""
    cols = col0 + offs_h[:, None] * HEAD_DIM + offs_d[None, :]
    x1 = splitk_reduce_row(
        p_ptr, ws_ptr, xs_ptr, b_ptr, token, cols, mask, M, N, SPLIT_K, A8, CHANNEL_SCALES, HAS_BIAS
    )
    x2 = splitk_reduce_row(
        p_ptr, ws_ptr, xs_ptr, b_ptr, token, cols + HALF, mask, M, N, SPLIT_K, A8, CHANNEL_SCALES, HAS_BIAS
    )
    return x1, x2


@triton.jit
def _store_out(out_row, col0, offs_h, offs_d, mask, x1, x2, HEAD_DIM: tl.constexpr, HALF: tl.constexpr):
    """Store halves ``x1``/``x2`` of heads ``offs_h`` at ``out_row``'s columns from ``col0``."""
    ptr = out_row + col0 + offs_h[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(ptr, x1, mask=mask)
    tl.store(ptr + HALF, x2, mask=mask)


@triton.jit
def _through_out(out_row, col0, offs_h, offs_d, mask, x1, x2, HEAD_DIM: tl.constexpr, HALF: tl.constexpr):
    """Store the reduced heads (``x1``/``x2`` in the output dtype) and load them back after a
    CTA barrier, as the K/V write kernel loads its q/k from the reduce kernel's output: the
    RMSNorm's ``tl.sum`` then runs on a tensor loaded in the layout of that kernel's
    (output-dtype vectors, not the partials' float32 ones), so its summation order, and with
    it every rounding after it, is that kernel's on the GPU too."""
    _store_out(out_row, col0, offs_h, offs_d, mask, x1, x2, HEAD_DIM, HALF)
    tl.debug_barrier()  # every thread's stores are visible to the CTA's loads below
    ptr = out_row + col0 + offs_h[:, None] * HEAD_DIM + offs_d[None, :]
    return tl.load(ptr, mask=mask, other=0.0), tl.load(ptr + HALF, mask=mask, other=0.0)


@triton.jit(do_not_specialize=["M"])
def _qkv_rope_kv_write_kernel(
    out_ptr,
    p_ptr,
    ws_ptr,
    xs_ptr,
    b_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    q_norm_ptr,
    k_norm_ptr,
    eps,
    k_inv_scale,
    v_inv_scale,
    M,
    N,
    stride_ot,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    stride_cos,
    stride_sin,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr,
    QH: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SPLIT_K: tl.constexpr,
    A8: tl.constexpr,
    CHANNEL_SCALES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    NORM: tl.constexpr,
    FP8_KV: tl.constexpr,
    FP8_MAX: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    token = tl.program_id(0)
    part = tl.program_id(1)  # 0: k, v and the cache write; j >= 1: q heads (j - 1) * QH ..
    dtype = out_ptr.dtype.element_ty
    out_row = out_ptr + token.to(tl.int64) * stride_ot
    offs_d = tl.arange(0, HALF_PAD)
    dmask = offs_d < HALF
    pos = tl.load(positions_ptr + token).to(tl.int64)
    cos = tl.load(cos_ptr + pos * stride_cos + offs_d, mask=dmask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos * stride_sin + offs_d, mask=dmask, other=0.0).to(tl.float32)
    if part == 0:
        slot = tl.load(slot_mapping_ptr + token)
        offs_h = tl.arange(0, KV_HEADS_PAD)
        mask = (offs_h[:, None] < NUM_KV_HEADS) & dmask[None, :]
        k_col = NUM_HEADS * HEAD_DIM
        v_col = (NUM_HEADS + NUM_KV_HEADS) * HEAD_DIM
        v1, v2 = _reduce_heads(
            p_ptr,
            ws_ptr,
            xs_ptr,
            b_ptr,
            token,
            v_col,
            offs_h,
            offs_d,
            mask,
            M,
            N,
            HEAD_DIM,
            HALF,
            SPLIT_K,
            A8,
            CHANNEL_SCALES,
            HAS_BIAS,
        )
        k1, k2 = _reduce_heads(
            p_ptr,
            ws_ptr,
            xs_ptr,
            b_ptr,
            token,
            k_col,
            offs_h,
            offs_d,
            mask,
            M,
            N,
            HEAD_DIM,
            HALF,
            SPLIT_K,
            A8,
            CHANNEL_SCALES,
            HAS_BIAS,
        )
        v1, v2 = v1.to(dtype), v2.to(dtype)  # the reduce kernel's store
        k1, k2 = _through_out(
            out_row, k_col, offs_h, offs_d, mask, k1.to(dtype), k2.to(dtype), HEAD_DIM, HALF
        )
        k1, k2 = norm_rope(k1, k2, k_norm_ptr, cos, sin, eps, HALF, HALF_PAD, NORM, True)
        _store_out(out_row, k_col, offs_h, offs_d, mask, k1, k2, HEAD_DIM, HALF)
        _store_out(out_row, v_col, offs_h, offs_d, mask, v1, v2, HEAD_DIM, HALF)
        if slot >= 0:
            blk = slot // BLOCK_SIZE
            off = slot % BLOCK_SIZE
            kc = k_cache_ptr + blk * stride_kcb + off * stride_kcs
            store_heads(kc, stride_kch, offs_h, offs_d, mask, k1, k2, k_inv_scale, HALF, FP8_MAX, FP8_KV)
            vc = v_cache_ptr + blk * stride_vcb + off * stride_vcs
            store_heads(vc, stride_vch, offs_h, offs_d, mask, v1, v2, v_inv_scale, HALF, FP8_MAX, FP8_KV)
    else:
        offs_h = (part - 1) * QH + tl.arange(0, QH)
        mask = (offs_h[:, None] < NUM_HEADS) & dmask[None, :]
        q1, q2 = _reduce_heads(
            p_ptr,
            ws_ptr,
            xs_ptr,
            b_ptr,
            token,
            0,
            offs_h,
            offs_d,
            mask,
            M,
            N,
            HEAD_DIM,
            HALF,
            SPLIT_K,
            A8,
            CHANNEL_SCALES,
            HAS_BIAS,
        )
        q1, q2 = _through_out(out_row, 0, offs_h, offs_d, mask, q1.to(dtype), q2.to(dtype), HEAD_DIM, HALF)
        q1, q2 = norm_rope(q1, q2, q_norm_ptr, cos, sin, eps, HALF, HALF_PAD, NORM, True)
        _store_out(out_row, 0, offs_h, offs_d, mask, q1, q2, HEAD_DIM, HALF)


def _check(
    qkv: SplitKPartials,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    positions: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    heads_per_program: int,
) -> None:
    parts = qkv.partials
    if parts.dim() != 3 or parts.shape[0] < 2 or parts.dtype != torch.float32 or not parts.is_contiguous():
        raise ValueError(
            f"partials {tuple(parts.shape)} {parts.dtype} must be contiguous float32 [split_k >= 2, T, N]"
        )
    _, m, n = parts.shape
    if min(num_heads, num_kv_heads, head_dim) < 1 or head_dim % 2:
        raise ValueError(f"bad heads {num_heads}/{num_kv_heads} or head_dim {head_dim} (must be even)")
    if n != (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(
            f"partials have {n} columns, not (num_heads + 2 * num_kv_heads) * head_dim = "
            f"{(num_heads + 2 * num_kv_heads) * head_dim}"
        )
    if qkv.dtype not in _DTYPES:
        raise ValueError(f"the output dtype must be fp16, bf16 or fp32, got {qkv.dtype}")
    if qkv.weight_scale is not None and (
        qkv.weight_scale.numel() != n or not qkv.weight_scale.is_contiguous()
    ):
        raise ValueError(f"weight_scale {tuple(qkv.weight_scale.shape)} must be [{n}] contiguous")
    if qkv.token_scale is not None and (qkv.token_scale.numel() != m or not qkv.token_scale.is_contiguous()):
        raise ValueError(f"token_scale {tuple(qkv.token_scale.shape)} must be [{m}, 1] contiguous")
    if qkv.bias is not None and (qkv.bias.shape != (n,) or not qkv.bias.is_contiguous()):
        raise ValueError(f"bias {tuple(qkv.bias.shape)} must be [{n}] contiguous")
    for name, t in (("cos_cache", cos_cache), ("sin_cache", sin_cache)):
        if t.dim() != 2 or 2 * t.shape[1] != head_dim or t.stride(-1) != 1:
            raise ValueError(f"{name} {tuple(t.shape)} must be [max_position, head_dim // 2]")
    if positions.dim() != 1 or positions.shape[0] < m or slot_mapping.dim() != 1 or slot_mapping.shape[0] < m:
        raise ValueError(
            f"positions {tuple(positions.shape)} and slot_mapping {tuple(slot_mapping.shape)} need >= {m} rows"
        )
    want = (num_kv_heads, head_dim)
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4 or tuple(k_cache.shape[2:]) != want:
        raise ValueError(
            f"caches {tuple(k_cache.shape)}/{tuple(v_cache.shape)} must be [num_blocks, block_size, {num_kv_heads}, {head_dim}]"
        )
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (qkv.dtype, torch.float8_e4m3fn):
        raise ValueError(
            f"cache dtype {k_cache.dtype}/{v_cache.dtype} must be the output's ({qkv.dtype}) or float8_e4m3fn"
        )
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the caches need a contiguous last dimension")
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("pass both q_norm_weight and k_norm_weight or neither")
    for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if w is not None and (w.shape != (head_dim,) or not w.is_contiguous()):
            raise ValueError(f"{name} {tuple(w.shape)} must be [{head_dim}] contiguous")
    if heads_per_program < 1 or heads_per_program & (heads_per_program - 1):
        raise ValueError(f"heads_per_program must be a power of two, got {heads_per_program}")


def qkv_rope_kv_write(
    qkv: SplitKPartials,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    positions: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    *,
    heads_per_program: int = Q_HEADS_PER_PROGRAM,
    pdl: bool | None = None,
) -> torch.Tensor:
    """Reduce the qkv GEMM's split-K partials, norm and rotate q and k, write k and v into the
    paged cache: one launch, bit for bit the GEMM's reduce kernel followed by
    :func:`surge.kernels.kv_write.fused_qk_norm_rope_kv_write` (see the module docstring).

    Args:
        qkv: the qkv projection's :class:`SplitKPartials`: ``partials [S >= 2, T, N]`` float32
            contiguous with ``N = (num_heads + 2 * num_kv_heads) * head_dim`` (columns q | k |
            v), ``[N]`` weight scales or None, ``[T, 1]`` token scales (w8a8) or None,
            ``[N]`` bias or None, output dtype fp16/bf16/fp32.
        num_heads, num_kv_heads, head_dim: this rank's query heads, KV heads and (even) head size.
        positions: ``[>= T]`` int32/int64 token positions.
        cos_cache, sin_cache: ``[max_position, head_dim // 2]`` float32
            (``RotaryEmbedding.cos_cache/sin_cache``).
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]`` in the output
            dtype or float8_e4m3fn, written in place at ``slot_mapping``.
        slot_mapping: ``[>= T]`` int64 cache slots (``-1`` = padding, not written).
        q_norm_weight, k_norm_weight: ``[head_dim]`` RMSNorm weights (Qwen3), or both None.
        eps: RMSNorm epsilon.
        k_scale, v_scale: dequantization multipliers of an FP8 cache (ignored otherwise).
        heads_per_program: query heads per program, a power of two.
        pdl: launch with programmatic dependent launch (:mod:`surge.kernels.pdl`); None:
            :func:`surge.kernels.pdl.use_pdl` of the partials (sm90+).

    Returns:
        ``[T, N]`` in the output dtype: the normed, rotated q and k and the v, laid out as the
        qkv projection's output (the caller splits it).

    Raises:
        ValueError: partials not ``[S >= 2, T, N]`` contiguous float32 or ``N`` not the heads'
            columns; scales, bias, positions, slot mapping, rotary tables, caches or norm
            weights that do not match; one norm weight alone; a non-positive FP8 scale; a
            ``heads_per_program`` that is not a power of two.
    """
    _check(
        qkv,
        num_heads,
        num_kv_heads,
        head_dim,
        positions,
        cos_cache,
        sin_cache,
        k_cache,
        v_cache,
        slot_mapping,
        q_norm_weight,
        k_norm_weight,
        heads_per_program,
    )
    split_k, m, n = qkv.partials.shape
    parts = qkv.partials
    out = torch.empty((m, n), dtype=qkv.dtype, device=parts.device)
    if m == 0:
        return out
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8 and not (k_scale > 0.0 and v_scale > 0.0):
        raise ValueError(f"k_scale and v_scale must be positive, got {k_scale}, {v_scale}")
    if pdl is None:
        pdl = use_pdl(parts)
    half = head_dim // 2
    _qkv_rope_kv_write_kernel[(m, 1 + triton.cdiv(num_heads, heads_per_program))](
        out,
        parts,
        qkv.weight_scale if qkv.weight_scale is not None else parts,
        qkv.token_scale if qkv.token_scale is not None else parts,
        qkv.bias if qkv.bias is not None else parts,
        k_cache,
        v_cache,
        slot_mapping,
        positions,
        cos_cache,
        sin_cache,
        q_norm_weight if q_norm_weight is not None else parts,
        k_norm_weight if k_norm_weight is not None else parts,
        eps,
        1.0 / k_scale if fp8 else 1.0,
        1.0 / v_scale if fp8 else 1.0,
        m,
        n,
        out.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        cos_cache.stride(0),
        sin_cache.stride(0),
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        KV_HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        QH=heads_per_program,
        HEAD_DIM=head_dim,
        HALF=half,
        HALF_PAD=triton.next_power_of_2(half),
        BLOCK_SIZE=k_cache.shape[1],
        SPLIT_K=split_k,
        A8=qkv.token_scale is not None,
        CHANNEL_SCALES=qkv.weight_scale is not None,
        HAS_BIAS=qkv.bias is not None,
        NORM=q_norm_weight is not None,
        FP8_KV=fp8,
        FP8_MAX=FP8_E4M3_MAX,
        PDL=pdl,
        launch_pdl=pdl,
        num_warps=4,
        enable_fp_fusion=_FP_FUSION,
    )
    return out
