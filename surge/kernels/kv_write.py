"""K/V cache write by ``slot_mapping``, optionally fused with q/k RMSNorm and rotary (Triton).

With rotary on, the kernel applies (in this order, as Hugging Face Qwen3 does) the per-head
RMSNorm of q and k (``q_norm``/``k_norm``, optional), then the neox / ``rotate_half`` rotary
embedding (HF Llama/Qwen layout: the two halves of each head rotate together), writes q and k
back in place, and writes k and v into the paged cache at ``slot_mapping`` (``-1`` = padding,
not written): two programs per token, one for q and one for k, v and the cache write (which
issues its v and slot loads before the rotary). With rotary off it is the plain cache write,
one program per token. Floating-point contraction is off (``enable_fp_fusion=False``), so every product and
sum is rounded as torch rounds it and the rotated q/k equal :class:`RotaryEmbedding`'s bit for
bit on the GPU too. An FP8 (``float8_e4m3fn``) cache stores ``clamp(x * (1 / scale), ±448)`` rounded to
nearest even, with one scale for K and one for V per layer (the dequantization multipliers
that paged attention applies). Rotary: Su et al., "RoFormer", 2021; cache layout as in vLLM (Apache-2.0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from surge.kernels.pdl import pdl_wait, use_pdl
from surge.quant.config import FP8_E4M3_MAX

_FP_FUSION = False
"""``enable_fp_fusion`` of the launch (see :func:`_launch`; a test compiles with it)."""


@triton.jit
def norm_rope(
    x1,
    x2,
    w_ptr,
    cos,
    sin,
    eps,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    NORM: tl.constexpr,
    ROPE: tl.constexpr,
):
    """Per-head RMSNorm (``NORM``, weight at ``w_ptr``) then neox rotary (``ROPE``) of heads given
    as halves ``x1``, ``x2`` (``[heads, HALF_PAD]`` in the model dtype; ``cos``/``sin``
    ``[HALF_PAD]`` fp32), with Hugging Face's roundings; returns the new halves. Also used by
    the decode grid of :mod:`surge.kernels.paged_attention`, which must round as this does."""
    dtype = x1.dtype
    offs_d = tl.arange(0, HALF_PAD)
    if NORM:
        x1f = x1.to(tl.float32)
        x2f = x2.to(tl.float32)
        var = (tl.sum(x1f * x1f, 1) + tl.sum(x2f * x2f, 1)) / (2 * HALF)
        rstd = tl.rsqrt(var + eps)
        dmask = offs_d < HALF
        w1 = tl.load(w_ptr + offs_d, mask=dmask, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + offs_d, mask=dmask, other=0.0).to(tl.float32)
        # HF: weight * normed.to(input_dtype)
        x1 = ((x1f * rstd[:, None]).to(dtype).to(tl.float32) * w1[None, :]).to(dtype)
        x2 = ((x2f * rstd[:, None]).to(dtype).to(tl.float32) * w2[None, :]).to(dtype)
    if ROPE:
        # HF order of roundings: cos/sin cast to the input dtype, each product rounded,
        # then the sum (exact emulation of bf16/fp16 torch arithmetic, no-op in fp32).
        c = cos.to(dtype).to(tl.float32)[None, :]
        s = sin.to(dtype).to(tl.float32)[None, :]
        x1f = x1.to(tl.float32)
        x2f = x2.to(tl.float32)
        a1 = (x1f * c).to(dtype).to(tl.float32)
        b1 = (x2f * s).to(dtype).to(tl.float32)
        a2 = (x2f * c).to(dtype).to(tl.float32)
        b2 = (x1f * s).to(dtype).to(tl.float32)
        x1 = (a1 - b1).to(dtype)
        x2 = (a2 + b2).to(dtype)
    return x1, x2


@triton.jit
def _norm_rope_heads(
    x_ptr,
    stride_h,
    w_ptr,
    cos,
    sin,
    eps,
    NUM_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    NORM: tl.constexpr,
    ROPE: tl.constexpr,
):
    """Load ``NUM_HEADS`` heads at ``x_ptr``, RMSNorm + rotate them, store back; return halves."""
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HALF_PAD)
    mask = (offs_h[:, None] < NUM_HEADS) & (offs_d[None, :] < HALF)
    ptr1 = x_ptr + offs_h[:, None] * stride_h + offs_d[None, :]
    x1 = tl.load(ptr1, mask=mask, other=0.0)
    x2 = tl.load(ptr1 + HALF, mask=mask, other=0.0)
    x1, x2 = norm_rope(x1, x2, w_ptr, cos, sin, eps, HALF, HALF_PAD, NORM, ROPE)
    if NORM or ROPE:
        tl.store(ptr1, x1, mask=mask)
        tl.store(ptr1 + HALF, x2, mask=mask)
    return x1, x2


@triton.jit
def to_cache(x, inv_scale, FP8_MAX: tl.constexpr, FP8: tl.constexpr):
    """``x`` in fp32 as stored in the cache: scaled and clamped for FP8, unchanged otherwise (the
    fp32 round trip of a bf16/fp16/fp32 value is exact). One return type for both branches:
    compiled Triton rejects a constexpr branch that returns another dtype."""
    y = x.to(tl.float32)
    if FP8:
        y = tl.minimum(tl.maximum(y * inv_scale, -FP8_MAX), FP8_MAX)
    return y


@triton.jit
def store_heads(
    slot_ptr,
    stride_h,
    offs_h,
    offs_d,
    mask,
    x1,
    x2,
    inv_scale,
    HALF: tl.constexpr,
    FP8_MAX: tl.constexpr,
    FP8: tl.constexpr,
):
    """Store one token's heads (halves ``x1``/``x2``, ``[heads, HALF]``) at its cache slot
    ``slot_ptr`` in the cache's dtype (scaled and clamped first for FP8)."""
    c = slot_ptr + offs_h[:, None] * stride_h + offs_d[None, :]
    dtype = slot_ptr.dtype.element_ty
    tl.store(c, to_cache(x1, inv_scale, FP8_MAX, FP8).to(dtype), mask=mask)
    tl.store(c + HALF, to_cache(x2, inv_scale, FP8_MAX, FP8).to(dtype), mask=mask)


@triton.jit
def _kv_write_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
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
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    stride_cos,
    stride_sin,
    NUM_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    KV_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ROPE: tl.constexpr,
    NORM: tl.constexpr,
    WRITE_CACHE: tl.constexpr,
    FP8_KV: tl.constexpr,
    FP8_MAX: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    token = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)  # 0: k, v and the cache write; 1 (with rotary only): q
    offs_d = tl.arange(0, HALF_PAD)
    offs_h = tl.arange(0, KV_HEADS_PAD)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HALF)
    slot = tl.full([], -1, slot_mapping_ptr.dtype.element_ty)
    v1 = tl.zeros([KV_HEADS_PAD, HALF_PAD], dtype=v_ptr.dtype.element_ty)
    v2 = tl.zeros([KV_HEADS_PAD, HALF_PAD], dtype=v_ptr.dtype.element_ty)
    if WRITE_CACHE and part == 0:  # issued first: these loads overlap the rotary's latency
        slot = tl.load(slot_mapping_ptr + token)
        vsrc = v_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
        v1 = tl.load(vsrc, mask=mask, other=0.0)
        v2 = tl.load(vsrc + HALF, mask=mask, other=0.0)
    cos = tl.zeros([HALF_PAD], dtype=tl.float32)
    sin = tl.zeros([HALF_PAD], dtype=tl.float32)
    if ROPE:
        pos = tl.load(positions_ptr + token).to(tl.int64)
        dmask = offs_d < HALF
        cos = tl.load(cos_ptr + pos * stride_cos + offs_d, mask=dmask, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + pos * stride_sin + offs_d, mask=dmask, other=0.0).to(tl.float32)
    if part == 1:
        _norm_rope_heads(
            q_ptr + token * stride_qt,
            stride_qh,
            q_norm_ptr,
            cos,
            sin,
            eps,
            NUM_HEADS,
            HEADS_PAD,
            HALF,
            HALF_PAD,
            NORM,
            ROPE,
        )
    else:
        k1, k2 = _norm_rope_heads(
            k_ptr + token * stride_kt,
            stride_kh,
            k_norm_ptr,
            cos,
            sin,
            eps,
            NUM_KV_HEADS,
            KV_HEADS_PAD,
            HALF,
            HALF_PAD,
            NORM,
            ROPE,
        )
        if WRITE_CACHE:  # noqa: SIM102 (a constexpr, then a run-time test: two ifs in Triton)
            if slot >= 0:
                blk = slot // BLOCK_SIZE
                off = slot % BLOCK_SIZE
                kc = k_cache_ptr + blk * stride_kcb + off * stride_kcs
                store_heads(kc, stride_kch, offs_h, offs_d, mask, k1, k2, k_inv_scale, HALF, FP8_MAX, FP8_KV)
                vc = v_cache_ptr + blk * stride_vcb + off * stride_vcs
                store_heads(vc, stride_vch, offs_h, offs_d, mask, v1, v2, v_inv_scale, HALF, FP8_MAX, FP8_KV)


def _check_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k.shape != v.shape or k.dim() != 3:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be equal [T, Hkv, D]")
    if k_cache.shape != v_cache.shape or k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(f"cache {tuple(k_cache.shape)} does not match k {tuple(k.shape)}")
    if k.shape[2] % 2 != 0:
        raise ValueError(f"head_dim must be even, got {k.shape[2]}")
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (k.dtype, torch.float8_e4m3fn):
        raise ValueError(
            f"cache dtype {k_cache.dtype}/{v_cache.dtype} must be k's ({k.dtype}) or float8_e4m3fn"
        )
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} needs a contiguous last dimension")


def _launch(
    q: torch.Tensor | None,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor | None,
    v_cache: torch.Tensor | None,
    slot_mapping: torch.Tensor | None,
    positions: torch.Tensor | None,
    cos_cache: torch.Tensor | None,
    sin_cache: torch.Tensor | None,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    num_tokens: int,
    k_scale: float,
    v_scale: float,
) -> None:
    rope = q is not None
    norm = q_norm_weight is not None
    write = k_cache is not None
    kc = k_cache if k_cache is not None else k
    vc = v_cache if v_cache is not None else v
    qq = q if q is not None else k
    half = k.shape[2] // 2
    if num_tokens == 0:
        return
    fp8 = write and kc.dtype == torch.float8_e4m3fn
    if fp8 and not (k_scale > 0.0 and v_scale > 0.0):
        raise ValueError(f"k_scale and v_scale must be positive, got {k_scale}, {v_scale}")
    pdl = use_pdl(k)  # programmatic dependent launch on sm90+
    _kv_write_kernel[(num_tokens, 2 if rope else 1)](
        qq,
        k,
        v,
        kc,
        vc,
        slot_mapping if slot_mapping is not None else k,
        positions if positions is not None else k,
        cos_cache if cos_cache is not None else k,
        sin_cache if sin_cache is not None else k,
        q_norm_weight if q_norm_weight is not None else k,
        k_norm_weight if k_norm_weight is not None else k,
        eps,
        1.0 / k_scale if fp8 else 1.0,
        1.0 / v_scale if fp8 else 1.0,
        qq.stride(0),
        qq.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        kc.stride(0),
        kc.stride(1) if write else 0,
        kc.stride(2) if write else 0,
        vc.stride(0),
        vc.stride(1) if write else 0,
        vc.stride(2) if write else 0,
        cos_cache.stride(0) if cos_cache is not None else 0,
        sin_cache.stride(0) if sin_cache is not None else 0,
        NUM_HEADS=qq.shape[1],
        HEADS_PAD=triton.next_power_of_2(qq.shape[1]),
        NUM_KV_HEADS=k.shape[1],
        KV_HEADS_PAD=triton.next_power_of_2(k.shape[1]),
        HALF=half,
        HALF_PAD=triton.next_power_of_2(half),
        BLOCK_SIZE=kc.shape[1] if write else 1,
        ROPE=rope,
        NORM=norm,
        WRITE_CACHE=write,
        FP8_KV=fp8,
        FP8_MAX=FP8_E4M3_MAX,
        PDL=pdl,
        launch_pdl=pdl,
        num_warps=4,
        # No multiply-add contraction: with it the compiler turns rotary's ``x1*cos - x2*sin``
        # into one bf16 FMA (``fma.rn.bf16``, one rounding instead of torch's two), which moves
        # q/k by an ulp and flips some FP8 cache bytes. Memory-bound kernel: costs nothing.
        enable_fp_fusion=_FP_FUSION,
    )


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Scatter new K/V rows into the paged cache.

    Args:
        k, v: ``[>= num_tokens, num_kv_heads, head_dim]`` (last dim contiguous).
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, written in place,
            in ``k``'s dtype or float8_e4m3fn.
        slot_mapping: ``[num_tokens]`` int64, ``block_id * block_size + offset``; ``-1``
            rows are skipped. Only its length decides how many rows are read.
        k_scale, v_scale: dequantization multipliers of an FP8 cache (ignored otherwise).

    Raises:
        ValueError: on mismatched shapes or dtypes, a non-contiguous last dimension, or a
            non-positive FP8 scale.
    """
    _check_kv(k, v, k_cache, v_cache)
    num_tokens = slot_mapping.shape[0]
    if k.shape[0] < num_tokens:
        raise ValueError(f"slot_mapping has {num_tokens} rows but k only {k.shape[0]}")
    _launch(
        None,
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        None,
        None,
        None,
        None,
        None,
        0.0,
        num_tokens,
        k_scale,
        v_scale,
    )


def fused_qk_norm_rope_kv_write(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Per-head q/k RMSNorm (optional), neox rotary on q and k in place, and K/V cache write.

    Per head ``x`` of q and k: ``x = weight * (x.float() * rsqrt(mean(x^2) + eps)).to(dtype)``
    when norm weights are given (Qwen3), then ``x1, x2 = halves(x)``,
    ``x = cat(x1*cos - x2*sin, x2*cos + x1*sin)`` with Hugging Face's roundings (cos/sin
    cast to the input dtype, each product and the sum rounded to it), so results match
    :class:`surge.layers.rotary.RotaryEmbedding` bit for bit.

    Args:
        q: ``[num_tokens, num_heads, head_dim]``, updated in place (last dim contiguous).
        k: ``[num_tokens, num_kv_heads, head_dim]``, updated in place.
        v: ``[num_tokens, num_kv_heads, head_dim]``.
        positions: ``[num_tokens]`` int32/int64 token positions.
        cos_cache, sin_cache: ``[max_position, head_dim // 2]`` float32 cos and sin of
            ``position * inv_freq`` (full rotary; ``RotaryEmbedding.cos_cache/sin_cache``).
        k_cache, v_cache: optional ``[num_blocks, block_size, num_kv_heads, head_dim]`` in q's
            dtype or float8_e4m3fn; when given, the rotated k and v are written at
            ``slot_mapping``.
        slot_mapping: ``[num_tokens]`` int64 (``-1`` = padding), required with a cache.
        q_norm_weight, k_norm_weight: optional ``[head_dim]`` RMSNorm weights (both or none).
        eps: RMSNorm epsilon.
        k_scale, v_scale: dequantization multipliers of an FP8 cache (ignored otherwise).

    Raises:
        ValueError: on mismatched shapes, a missing ``slot_mapping``, a lone norm weight or a
            non-positive FP8 scale.
    """
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("pass both q_norm_weight and k_norm_weight or neither")
    if (k_cache is None) != (v_cache is None) or (k_cache is not None and slot_mapping is None):
        raise ValueError("k_cache, v_cache and slot_mapping go together")
    if q.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] or q.stride(-1) != 1:
        raise ValueError(f"q {tuple(q.shape)} does not match k {tuple(k.shape)}")
    for name, t in (("cos_cache", cos_cache), ("sin_cache", sin_cache)):
        if t.dim() != 2 or 2 * t.shape[1] != q.shape[2] or t.stride(-1) != 1:
            raise ValueError(f"{name} {tuple(t.shape)} must be [max_position, head_dim // 2]")
    if k_cache is not None and v_cache is not None:
        _check_kv(k, v, k_cache, v_cache)
        if slot_mapping is not None and slot_mapping.shape[0] < q.shape[0]:
            raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} rows, q has {q.shape[0]}")
    elif k.stride(-1) != 1 or k.shape[2] % 2 != 0:
        raise ValueError("k needs an even, contiguous last dimension")
    _launch(
        q,
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        positions,
        cos_cache,
        sin_cache,
        q_norm_weight,
        k_norm_weight,
        eps,
        q.shape[0],
        k_scale,
        v_scale,
    )


@dataclass(frozen=True)
class RopeKvWrite:
    """A step's per-head q/k RMSNorm, rotary and K/V cache write, handed to an attention backend
    that applies it itself (:attr:`surge.layers.attention_backend.AttentionBackend.fuses_rope_kv_write`):
    on a decode step whose rows read no other row's new K/V
    (:attr:`surge.layers.attention_backend.AttentionMetadata.independent_rows`) of at most the
    backend's limit of sequences, with a power-of-two head size,
    :func:`surge.kernels.paged_attention.paged_attention` does it inside its decode grid;
    otherwise :meth:`apply` launches :func:`fused_qk_norm_rope_kv_write`.

    Attributes:
        k, v: ``[T, num_kv_heads, head_dim]`` new K/V rows before rotary (views of the qkv
            projection are fine; last dim contiguous).
        positions: ``[T]`` token positions.
        cos_cache, sin_cache: ``[max_position, head_dim // 2]`` float32.
        slot_mapping: ``[T]`` int64 cache slots (``-1`` = padding).
        q_norm_weight, k_norm_weight: ``[head_dim]`` RMSNorm weights (Qwen3), or both None.
        eps: RMSNorm epsilon.
    """

    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor
    cos_cache: torch.Tensor
    sin_cache: torch.Tensor
    slot_mapping: torch.Tensor
    q_norm_weight: torch.Tensor | None
    k_norm_weight: torch.Tensor | None
    eps: float

    def apply(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: float, v_scale: float
    ) -> None:
        """Norm and rotate ``q`` (``[T, num_heads, head_dim]``) and :attr:`k` in place and write
        :attr:`k`/:attr:`v` into the caches (:func:`fused_qk_norm_rope_kv_write`).

        Raises:
            ValueError: as :func:`fused_qk_norm_rope_kv_write`.
        """
        fused_qk_norm_rope_kv_write(
            q,
            self.k,
            self.v,
            self.positions,
            self.cos_cache,
            self.sin_cache,
            k_cache,
            v_cache,
            self.slot_mapping,
            self.q_norm_weight,
            self.k_norm_weight,
            self.eps,
            k_scale,
            v_scale,
        )
