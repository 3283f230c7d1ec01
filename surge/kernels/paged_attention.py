"""Paged attention for prefill, chunked prefill and decode in one batch (Triton).

One kernel serves every step shape: the batch is varlen over ``query_start_loc``
(``cu_seqlens_q``), ``seq_lens`` and ``block_table``. A program owns one tile of
``BLOCK_Q`` query tokens of one sequence for one KV head; the ``num_heads // num_kv_heads``
query heads that share that KV head are packed into the rows of the tile
(``BLOCK_M = BLOCK_Q * group``), so ``tl.dot`` runs on tensor cores even when a sequence
has one query token (decode). Softmax is online in fp32 (FlashAttention-2, Dao 2023).

The grid is fixed by shapes alone: ``num_tokens // BLOCK_Q + num_seqs`` query tiles (an
upper bound on the tiles the batch needs; a program finds its sequence by binary search
over ``query_start_loc`` and exits when it has no work) x ``num_kv_heads`` x ``num_splits``.
With ``num_splits > 1`` (flash-decoding, Dao et al. 2023) each split handles an even share
of the KV tiles and writes an unnormalised partial result that
:func:`surge.kernels.attention_reduce.attention_reduce` combines. The tile schedule
follows vLLM's ``triton_unified_attention`` (Apache-2.0). No host syncs and no
data-dependent allocation: the launcher is safe inside CUDA-graph capture.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from surge.kernels.attention_reduce import attention_reduce

_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class AttentionTileConfig:
    """Tile shape and launch parameters of the paged-attention kernel.

    Attributes:
        block_m: rows per tile (query tokens x packed query heads); a power of 2 >= 16.
        block_n: KV positions per inner-loop step; a power of 2 >= 16.
        num_warps: warps per program.
        num_stages: software-pipelining depth of the KV loop.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@triton.jit
def _find_seq_idx(query_start_loc_ptr, target, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest ``b`` with ``query_start_loc[b] // BLOCK_Q + b <= target`` (binary search)."""
    left: tl.int32 = 0
    right = num_seqs
    while left < right:
        mid = (left + right) // 2
        mid_val = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if mid_val <= target:
            left = mid + 1
        else:
            right = mid
    return left - 1


@triton.jit(do_not_specialize=["num_seqs", "stride_bt"])
def _paged_attention_kernel(
    out_ptr,
    part_out_ptr,
    part_m_ptr,
    part_l_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    scale_log2,
    num_seqs,
    num_heads,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    IEEE: tl.constexpr,
):
    q_tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_idx = _find_seq_idx(query_start_loc_ptr, q_tile, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq_idx)
    q_len = tl.load(query_start_loc_ptr + seq_idx + 1) - q_start
    q_tile_local = q_tile - (q_start // BLOCK_Q + seq_idx)
    if q_tile_local * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq_idx)
    context_len = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    q_local = q_tile_local * BLOCK_Q + offs_m // GROUP_PAD
    head_in_group = offs_m % GROUP_PAD
    head = kv_head * GROUP + head_in_group
    row_valid = (offs_m // GROUP_PAD < BLOCK_Q) & (head_in_group < GROUP) & (q_local < q_len)
    d_valid = offs_d < HEAD_DIM
    token = q_start + q_local
    q_abs = context_len + q_local

    q = tl.load(
        q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_valid[:, None] & d_valid[None, :],
        other=0.0,
    )

    # KV positions this tile needs: up to the last query of the tile (causal).
    last_q_local = tl.minimum((q_tile_local + 1) * BLOCK_Q, q_len) - 1
    num_kv = context_len + last_q_local + 1
    num_tiles = tl.cdiv(num_kv, BLOCK_N)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)

    # Finite stand-in for -inf as the running max: keeps exp2(m_old - m_new) defined when a
    # row has seen only masked scores.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    bt_row = block_table_ptr + seq_idx.to(tl.int64) * stride_bt
    k_head = k_cache_ptr + kv_head * stride_kh
    v_head = v_cache_ptr + kv_head * stride_vh

    for tile in range(tile_lo, tile_hi):
        kv_pos = tile * BLOCK_N + offs_n
        kv_valid = kv_pos < num_kv
        blk = tl.load(bt_row + kv_pos // BLOCK_SIZE, mask=kv_valid, other=0).to(tl.int64)
        in_blk = kv_pos % BLOCK_SIZE
        kt = tl.load(
            k_head + blk[None, :] * stride_kb + in_blk[None, :] * stride_ks + offs_d[:, None],
            mask=kv_valid[None, :] & d_valid[:, None],
            other=0.0,
        )
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        s = s * scale_log2
        causal = (kv_pos[None, :] <= q_abs[:, None]) & kv_valid[None, :]
        s = tl.where(causal, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_head + blk[:, None] * stride_vb + in_blk[:, None] * stride_vs + offs_d[None, :],
            mask=kv_valid[:, None] & d_valid[None, :],
            other=0.0,
        )
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    store_mask = row_valid[:, None] & d_valid[None, :]
    if NUM_SPLITS == 1:
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / l_safe[:, None]
        tl.store(
            out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=store_mask,
        )
    else:
        # Partial buffers are contiguous: m/l [T, H, S], out [T, H, S, HEAD_DIM].
        row = (token.to(tl.int64) * num_heads + head) * NUM_SPLITS + split
        tl.store(part_m_ptr + row, m_i, mask=row_valid)
        tl.store(part_l_ptr + row, l_i, mask=row_valid)
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=store_mask)


def default_tile_config(
    group: int, head_dim: int, max_query_len: int | None, dtype: torch.dtype
) -> AttentionTileConfig:
    """Pick the tile shape from host-side hints only (never a device read).

    Args:
        group: query heads per KV head (``num_heads // num_kv_heads``).
        head_dim: per-head dimension.
        max_query_len: longest q_len of the step if known (1 means a pure decode step).
        dtype: query/cache dtype (fp32 halves the tile to fit shared memory).

    Returns:
        A decode tile (16 rows, wide KV steps) for ``max_query_len == 1``, a 64- or
        128-row tile for prefill.
    """
    group_pad = triton.next_power_of_2(group)
    big = dtype == torch.float32 or head_dim > 128
    if max_query_len == 1:
        block_m = max(16, group_pad)
        return AttentionTileConfig(block_m=block_m, block_n=32 if big else 64, num_warps=4, num_stages=2)
    want = 64 if max_query_len is None else triton.next_power_of_2(max_query_len * group_pad)
    block_m = max(16, group_pad, min(want, 64 if big else 128))
    if block_m >= 128:
        return AttentionTileConfig(block_m=block_m, block_n=64, num_warps=8, num_stages=2)
    return AttentionTileConfig(block_m=block_m, block_n=32 if big else 64, num_warps=4, num_stages=2)


def choose_num_splits(
    num_seqs: int,
    num_kv_heads: int,
    max_query_len: int | None,
    max_seq_len: int | None,
    num_sms: int,
    max_splits: int = 32,
    min_kv_per_split: int = 256,
) -> int:
    """Heuristic number of KV splits (flash-decoding) from host-side hints.

    Splitting pays only when a pure decode step has too few (sequence, KV head) programs
    to fill the GPU and contexts are long. The result is a power of 2 so few kernel
    variants get compiled; any value is correct (splits partition each sequence's KV
    tiles evenly in the kernel).

    Args:
        num_seqs: sequences in the step (padded count under CUDA graphs).
        num_kv_heads: KV heads of this rank.
        max_query_len: longest q_len of the step; splitting is used only when it is 1.
        max_seq_len: longest context of the step in tokens (under graph capture pass the
            longest context the graph may replay with, e.g. ``max_model_len``).
        num_sms: streaming multiprocessors of the GPU.
        max_splits: upper bound on the result.
        min_kv_per_split: smallest KV share (tokens) worth a split of its own.

    Returns:
        The number of splits, 1 meaning the single-pass kernel.
    """
    if max_query_len != 1 or max_seq_len is None:
        return 1
    programs = num_seqs * num_kv_heads
    # One KV-streaming program per SM is latency bound (~1.7 TB/s measured on an H200 at
    # 128 programs); about four per SM reach HBM bandwidth.
    if programs >= 3 * num_sms:
        return 1
    splits = min(triton.cdiv(4 * num_sms, programs), max_seq_len // min_kv_per_split, max_splits)
    if splits <= 1:
        return 1
    return 1 << (splits.bit_length() - 1)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    num_splits: int = 1,
    max_query_len: int | None = None,
    config: AttentionTileConfig | None = None,
) -> torch.Tensor:
    """Causal attention of a varlen batch of query tokens over a paged KV cache.

    Query ``i`` of sequence ``b`` (``q_len = query_start_loc[b+1] - query_start_loc[b]``)
    sits at position ``seq_lens[b] - q_len + i`` and attends to keys ``0..position``;
    query head ``h`` uses KV head ``h // (num_heads // num_kv_heads)``. The cache must
    already hold the new tokens' K/V.

    Args:
        q: ``[num_tokens, num_heads, head_dim]`` fp16/bf16/fp32, last dim contiguous. Rows
            beyond ``query_start_loc[-1]`` are padding.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, same dtype
            as ``q``, last dim contiguous.
        query_start_loc: ``[num_seqs + 1]`` int32 (``cu_seqlens_q``).
        seq_lens: ``[num_seqs]`` int32 context lengths (cached + new tokens).
        block_table: ``[num_seqs, max_blocks_per_seq]`` int32 KV block ids.
        scale: softmax scale (usually ``head_dim ** -0.5``).
        out: optional ``[num_tokens, num_heads, head_dim]`` output buffer.
        num_splits: KV splits (1 = single pass; >1 = flash-decoding with a reduce kernel).
        max_query_len: optional host hint for the tile shape; any value is correct.
        config: optional tile override (benchmarks, tuning).

    Returns:
        ``out``: ``[num_tokens, num_heads, head_dim]`` in ``q``'s dtype; padding rows are
        unspecified (zero on the split path).

    Raises:
        ValueError: on inconsistent shapes, dtypes or ``num_splits < 1``.
    """
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    num_seqs = seq_lens.shape[0]
    if cache_head_dim != head_dim or v_cache.shape != k_cache.shape:
        raise ValueError(f"cache shape {tuple(k_cache.shape)} does not match q {tuple(q.shape)}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"dtype mismatch: q {q.dtype}, cache {k_cache.dtype}/{v_cache.dtype}")
    if query_start_loc.shape[0] != num_seqs + 1 or block_table.shape[0] < num_seqs:
        raise ValueError("query_start_loc must be [num_seqs + 1] and block_table [num_seqs, *]")
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1 or block_table.stride(1) != 1:
        raise ValueError("q, k_cache, v_cache and block_table need a contiguous last dimension")
    if out is None:
        out = torch.empty_like(q)
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    cfg = config or default_tile_config(group, head_dim, max_query_len, q.dtype)
    block_m = max(cfg.block_m, group_pad)
    block_q = block_m // group_pad
    num_q_tiles = num_tokens // block_q + num_seqs
    if num_splits > 1:
        part_out = torch.empty(
            (num_tokens, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        part_m = torch.empty((num_tokens, num_heads, num_splits), dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
    else:
        part_out = part_m = part_l = out
    grid = (num_q_tiles, num_kv_heads, num_splits)
    _paged_attention_kernel[grid](
        out,
        part_out,
        part_m,
        part_l,
        q,
        k_cache,
        v_cache,
        block_table,
        seq_lens,
        query_start_loc,
        scale * _LOG2E,
        num_seqs,
        num_heads,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_table.stride(0),
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        BLOCK_N=cfg.block_n,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size,
        NUM_SPLITS=num_splits,
        IEEE=q.dtype == torch.float32,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if num_splits > 1:
        attention_reduce(part_out, part_m, part_l, query_start_loc, out)
    return out
