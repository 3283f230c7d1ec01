"""Causal attention for prefill and chunked-prefill rows (Triton, FlashAttention-2 schedule).

A program owns one tile of ``BLOCK_M`` consecutive query tokens of one sequence for one query
head (FlashAttention-2, Dao 2023: online softmax in fp32, the outer loop over query tiles
parallel, the inner loop over KV tiles). Query heads that share a KV head run in neighbouring
programs, so their K/V tiles come from L2. The grid is ``num_heads x (num_tokens // BLOCK_M +
num_seqs)``; axis 1 runs backwards (a sequence's last, most expensive tiles start first), a
program finds its sequence by binary search over ``query_start_loc`` and exits when it has no
work.

Each query tile reads its keys and values in two parts:

* the **prefix** (``context_len = seq_len - q_len`` tokens computed by earlier chunks or
  found in the prefix cache) from the paged cache through the block table; every prefix key
  precedes every query, so only the last, partial tile is masked (by length);
* the **new tokens** of this chunk from the step's contiguous ``k``/``v`` (the same values the
  KV write puts in the cache; with an FP8 cache, from the cache, see below): the tiles before
  the query tile's first token are unmasked, and only the ``BLOCK_M / BLOCK_N`` tiles on the
  diagonal take the causal mask. Tiles past the diagonal are never visited.

The softmax scale is multiplied by log2(e) on the host so the kernel uses ``exp2``.

An FP8 (``float8_e4m3fn``) cache is read as :func:`surge.kernels.paged_attention.paged_attention`
reads it: each tile is converted to float16 after its load (exactly, by
:func:`surge.kernels.paged_attention.e4m3_to_f16`; a 16-bit query is cast to float16 and both
dots run in float16 with fp32 accumulation), the K scale is folded into the softmax scale and
the V scale multiplies the accumulator. The chunk's own keys and values are read from the
cache too, where the KV write (which runs first, see
:meth:`surge.layers.attention_backend.AttentionBackend.forward`) has stored them: half the bytes
of the contiguous rows and no rounding pass per visit (each new K/V tile is visited by every
later query tile of every head of its group), so a prompt attends to exactly the values a
later chunk or decode step reads.
Sequences with fewer than ``min_query_len`` new tokens (decode rows of a mixed step) are
skipped: their output rows are left as they are, for
:func:`surge.kernels.paged_attention.paged_attention` to fill.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from surge.kernels.paged_attention import FP16_MAX, e4m3_to_f16

_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class PrefillTileConfig:
    """Tile shape and launch parameters of the prefill kernel (sweep them on the GPU with
    ``benchmarks/prefill_attention_bench.py``).

    Attributes:
        block_m: query tokens per program; a power of 2 >= 16.
        block_n: KV positions per inner-loop step; a power of 2 >= 16 dividing ``block_m``.
        num_warps: warps per program.
        num_stages: software-pipelining depth of the KV loops.
    """

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of 2 >= 16, got {value}")
        if self.block_m % self.block_n:
            raise ValueError(f"block_n {self.block_n} must divide block_m {self.block_m}")
        if self.num_warps < 1 or self.num_stages < 1:
            raise ValueError("num_warps and num_stages must be >= 1")


@triton.jit
def _find_seq(query_start_loc_ptr, target, num_seqs, BLOCK_M: tl.constexpr):
    """Largest ``b`` with ``query_start_loc[b] // BLOCK_M + b <= target`` (binary search)."""
    left: tl.int32 = 0
    right = num_seqs
    while left < right:
        mid = (left + right) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_M + mid <= target:
            left = mid + 1
        else:
            right = mid
    return left - 1


@triton.jit
def _paged_kv(
    kc_head,
    vc_head,
    bt_row,
    pos,
    valid,
    offs_d,
    stride_kcb,
    stride_kcs,
    stride_vcb,
    stride_vcs,
    dtype: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
    FP8_KV: tl.constexpr,
    ASM_CVT: tl.constexpr,
):
    """The ``[BLOCK_N, D]`` K and V tiles of cache positions ``pos`` (through the block table
    row ``bt_row``), in ``dtype``; with ``MASKED``, positions where ``valid`` is False read as
    zeros. An FP8 tile is converted exactly (its scale is applied by the caller)."""
    if MASKED:
        blk = tl.load(bt_row + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    else:
        blk = tl.load(bt_row + pos // BLOCK_SIZE).to(tl.int64)
    k_ptrs = kc_head + (blk * stride_kcb + (pos % BLOCK_SIZE) * stride_kcs)[:, None] + offs_d[None, :]
    v_ptrs = vc_head + (blk * stride_vcb + (pos % BLOCK_SIZE) * stride_vcs)[:, None] + offs_d[None, :]
    if MASKED:
        k = tl.load(k_ptrs, mask=valid[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=valid[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    if FP8_KV:
        k = e4m3_to_f16(k, ASM_CVT)
        v = e4m3_to_f16(v, ASM_CVT)
    return k.to(dtype), v.to(dtype)


@triton.jit
def _online_step(acc, m_i, l_i, q, k, v, scale_log2, visible, MASKED: tl.constexpr, IEEE: tl.constexpr):
    """One online-softmax update with the ``[BLOCK_N, D]`` tiles ``k``/``v``; ``visible``
    (``[BLOCK_M, BLOCK_N]``) is applied only when ``MASKED``."""
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = s * scale_log2
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if IEEE:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["num_seqs", "min_query_len", "stride_bt"])
def _prefill_attention_kernel(
    out_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    scale_log2,
    v_scale,
    num_seqs,
    min_query_len,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    stride_bt,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    IEEE: tl.constexpr,
    FP8_KV: tl.constexpr,
    ASM_CVT: tl.constexpr,
):
    head = tl.program_id(0)
    q_tile = tl.num_programs(1) - 1 - tl.program_id(1)
    seq_idx = _find_seq(query_start_loc_ptr, q_tile, num_seqs, BLOCK_M)
    q_start = tl.load(query_start_loc_ptr + seq_idx)
    q_len = tl.load(query_start_loc_ptr + seq_idx + 1) - q_start
    m0 = (q_tile - (q_start // BLOCK_M + seq_idx)) * BLOCK_M
    if (m0 >= q_len) | (q_len < min_query_len):
        return
    context_len = tl.load(seq_lens_ptr + seq_idx) - q_len
    kv_head = head // GROUP

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_valid = offs_m < q_len
    token = (q_start + offs_m).to(tl.int64)
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
        mask=row_valid[:, None],
        other=0.0,
    )
    if FP8_KV and not IEEE:  # 16-bit dots run in float16 over an FP8 cache (see e4m3_to_f16);
        # a bf16 query beyond float16's range saturates there instead of turning the row to NaN
        q = tl.minimum(tl.maximum(q.to(tl.float32), -FP16_MAX), FP16_MAX).to(tl.float16)

    # Finite stand-in for -inf as the running max: exp2(m_old - m_new) stays defined for a
    # row that has seen only masked scores.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # 1. The prefix, from the paged cache: whole tiles unmasked, then the partial last one.
    bt_row = block_table_ptr + seq_idx.to(tl.int64) * stride_bt
    kc_head = k_cache_ptr + kv_head * stride_kch
    vc_head = v_cache_ptr + kv_head * stride_vch
    full_end = (context_len // BLOCK_N) * BLOCK_N
    for start in range(0, full_end, BLOCK_N):
        k, v = _paged_kv(
            kc_head, vc_head, bt_row, start + offs_n, None, offs_d, stride_kcb, stride_kcs, stride_vcb,
            stride_vcs, q.dtype, BLOCK_SIZE, False, FP8_KV, ASM_CVT,
        )  # fmt: skip
        acc, m_i, l_i = _online_step(acc, m_i, l_i, q, k, v, scale_log2, None, False, IEEE)
    if full_end < context_len:
        pos = full_end + offs_n
        valid = pos < context_len
        k, v = _paged_kv(
            kc_head, vc_head, bt_row, pos, valid, offs_d, stride_kcb, stride_kcs, stride_vcb, stride_vcs,
            q.dtype, BLOCK_SIZE, True, FP8_KV, ASM_CVT,
        )  # fmt: skip
        acc, m_i, l_i = _online_step(acc, m_i, l_i, q, k, v, scale_log2, valid[None, :], True, IEEE)

    # 2. This chunk's new tokens (an FP8 cache: from the cache, where the KV write put them;
    # otherwise from the contiguous k/v): the tiles before the query tile see every key (no
    # mask), the diagonal tiles take the causal mask.
    k_new = k_ptr + q_start.to(tl.int64) * stride_kt + kv_head * stride_kh
    v_new = v_ptr + q_start.to(tl.int64) * stride_vt + kv_head * stride_vh
    for start in range(0, m0, BLOCK_N):
        kj = start + offs_n
        if FP8_KV:
            k, v = _paged_kv(
                kc_head, vc_head, bt_row, context_len + kj, None, offs_d, stride_kcb, stride_kcs,
                stride_vcb, stride_vcs, q.dtype, BLOCK_SIZE, False, True, ASM_CVT,
            )  # fmt: skip
        else:
            k = tl.load(k_new + kj[:, None].to(tl.int64) * stride_kt + offs_d[None, :])
            v = tl.load(v_new + kj[:, None].to(tl.int64) * stride_vt + offs_d[None, :])
        acc, m_i, l_i = _online_step(acc, m_i, l_i, q, k, v, scale_log2, None, False, IEEE)
    diag_end = tl.minimum(m0 + BLOCK_M, q_len)
    for start in range(m0, diag_end, BLOCK_N):
        kj = start + offs_n
        valid = kj < q_len
        if FP8_KV:
            k, v = _paged_kv(
                kc_head, vc_head, bt_row, context_len + kj, valid, offs_d, stride_kcb, stride_kcs,
                stride_vcb, stride_vcs, q.dtype, BLOCK_SIZE, True, True, ASM_CVT,
            )  # fmt: skip
        else:
            k = tl.load(
                k_new + kj[:, None].to(tl.int64) * stride_kt + offs_d[None, :], mask=valid[:, None], other=0.0
            )
            v = tl.load(
                v_new + kj[:, None].to(tl.int64) * stride_vt + offs_d[None, :], mask=valid[:, None], other=0.0
            )
        visible = (kj[None, :] <= offs_m[:, None]) & valid[None, :]
        acc, m_i, l_i = _online_step(acc, m_i, l_i, q, k, v, scale_log2, visible, True, IEEE)

    if FP8_KV:
        acc = acc * v_scale
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(
        out_ptr + token[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_valid[:, None],
    )


def default_prefill_tile(
    head_dim: int, dtype: torch.dtype, kv_dtype: torch.dtype | None = None
) -> PrefillTileConfig:
    """The tile :func:`prefill_attention` uses when given none: 128 x 64 with 8 warps and 3
    stages for rows of up to 256 bytes (fp16/bf16 at head_dim 128), 64 x 32 with 4 warps and
    2 stages for wider rows (fp32, or head_dim 256), so Q and the K/V stages fit in shared
    memory. Over an FP8 cache (``kv_dtype`` float8_e4m3fn) rows of up to 256 bytes take 128
    KV positions per step: on the H200 (Qwen3-8B heads) 12-16 % faster than 64 there, e.g. a
    4096-token prompt 0.554 -> 0.472 ms, where 64 is faster for a bf16 cache (0.333 against
    0.365 ms; ``benchmarks/results/h200-qwen3-8b-fp8/kv8-prefill/``)."""
    if head_dim * dtype.itemsize > 256:
        return PrefillTileConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
    if kv_dtype == torch.float8_e4m3fn:
        return PrefillTileConfig(block_n=128)
    return PrefillTileConfig()


def prefill_supported(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether :func:`prefill_attention` takes these shapes: a power-of-2 head size of 16 to
    256 and a cache in ``q``'s dtype or float8_e4m3fn."""
    head_dim = q.shape[-1]
    cache_ok = k_cache.dtype in (q.dtype, torch.float8_e4m3fn)
    return 16 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0 and cache_ok


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    min_query_len: int = 2,
    config: PrefillTileConfig | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Causal attention of the prefill rows of a varlen batch (FlashAttention-2 schedule).

    Sequence ``b`` has ``q_len = query_start_loc[b+1] - query_start_loc[b]`` new tokens at
    positions ``seq_lens[b] - q_len ..`` (a chunk of a prompt after ``seq_lens[b] - q_len``
    tokens computed by earlier chunks or found in the prefix cache). Its keys and values are
    the first ``seq_lens[b] - q_len`` positions of the paged cache (block table row ``b``)
    followed by the chunk's own ``k``/``v`` rows; the new tokens need not be in the cache,
    except with an FP8 cache: there they are read from the cache (at ``slot_mapping``, where the
    KV write stores them before attention) and ``k``/``v`` are only checked, not read.
    Query head ``h`` uses KV head ``h // (num_heads // num_kv_heads)``. Sequences with
    ``q_len < min_query_len`` are skipped (their rows of ``out`` are not written), so a
    mixed step's decode rows can be left to the paged kernel.

    Args:
        q: ``[num_tokens, num_heads, head_dim]`` fp16/bf16/fp32 (fp32 needs a small
            ``config``), last dim contiguous; rows beyond ``query_start_loc[-1]`` are padding.
        k, v: ``[num_tokens, num_kv_heads, head_dim]`` the new tokens' keys (rotary applied)
            and values, ``q``'s dtype, last dim contiguous.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]`` in ``q``'s dtype,
            or float8_e4m3fn (an FP8 cache, read as ``x_fp8 * scale``, holding the new tokens
            too).
        query_start_loc: ``[num_seqs + 1]`` int32 (``cu_seqlens_q``).
        seq_lens: ``[num_seqs]`` int32 context lengths (prefix + new tokens).
        block_table: ``[num_seqs, max_blocks_per_seq]`` int32 KV block ids.
        scale: softmax scale (usually ``head_dim ** -0.5``).
        out: optional ``[num_tokens, num_heads, head_dim]`` output, ``q``'s dtype.
        min_query_len: sequences with fewer new tokens are skipped.
        config: tile shape and launch parameters (default: :func:`default_prefill_tile`).
        k_scale, v_scale: dequantization multipliers of an FP8 cache, one per layer (ignored
            for other caches).

    Returns:
        ``out``; rows of skipped sequences and padding rows are unchanged.

    Raises:
        ValueError: on inconsistent shapes or dtypes, a head size :func:`prefill_supported`
            refuses, or a non-positive FP8 scale.
    """
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = seq_lens.shape[0]
    if not prefill_supported(q, k_cache) or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"unsupported q {tuple(q.shape)} {q.dtype} / cache {k_cache.dtype}/{v_cache.dtype}")
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8 and not (k_scale > 0.0 and v_scale > 0.0):
        raise ValueError(f"k_scale and v_scale must be positive, got {k_scale}, {v_scale}")
    if v_cache.shape != k_cache.shape or k_cache.shape[3] != head_dim:
        raise ValueError(f"cache shape {tuple(k_cache.shape)} does not match q {tuple(q.shape)}")
    if k.shape != (num_tokens, num_kv_heads, head_dim) or v.shape != k.shape:
        raise ValueError(f"k {tuple(k.shape)} / v {tuple(v.shape)} do not match the cache's KV heads")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"dtype mismatch: q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if query_start_loc.shape[0] != num_seqs + 1 or block_table.shape[0] < num_seqs:
        raise ValueError("query_start_loc must be [num_seqs + 1] and block_table [num_seqs, *]")
    for name, t in (("q", q), ("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} needs a contiguous last dimension")
    if block_table.stride(1) != 1:
        raise ValueError("block_table needs a contiguous last dimension")
    if out is None:
        out = torch.empty_like(q)
    cfg = config or default_prefill_tile(head_dim, q.dtype, k_cache.dtype)
    grid = (num_heads, num_tokens // cfg.block_m + num_seqs)
    _prefill_attention_kernel[grid](
        out,
        q,
        k,
        v,
        k_cache,
        v_cache,
        block_table,
        seq_lens,
        query_start_loc,
        scale * _LOG2E * (k_scale if fp8 else 1.0),
        v_scale if fp8 else 1.0,
        num_seqs,
        min_query_len,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_table.stride(0),
        GROUP=num_heads // num_kv_heads,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        IEEE=q.dtype == torch.float32,
        FP8_KV=fp8,
        ASM_CVT=fp8 and not isinstance(_prefill_attention_kernel, InterpretedFunction),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out
