"""Paged attention for prefill, chunked prefill and decode in one batch (Triton).

One kernel serves every step shape: the batch is varlen over ``query_start_loc``
(``cu_seqlens_q``), ``seq_lens`` and ``block_table``. A program owns one tile of
``BLOCK_Q`` query tokens of one sequence for one KV head; the ``num_heads // num_kv_heads``
query heads that share that KV head are packed into the rows of the tile
(``BLOCK_M = BLOCK_Q * group``, at least 16), so ``tl.dot`` runs on tensor cores even when
a sequence has one query token. Softmax is online in fp32 (FlashAttention-2, Dao 2023).

Two grids, chosen on the host from ``max_query_len`` (never from device data):

* **Mixed / prefill** (``max_query_len != 1``): ``num_tokens // BLOCK_Q + num_seqs`` query
  tiles (an upper bound on the tiles the batch needs; a program finds its sequence by
  binary search over ``query_start_loc`` and exits when it has no work) x
  ``num_kv_heads`` x ``num_splits``. The tile schedule follows vLLM's
  ``triton_unified_attention`` (Apache-2.0).
* **Decode** (``max_query_len == 1``, every decode CUDA graph): ``num_seqs`` x
  ``num_kv_heads`` x ``num_splits``; program ``b`` is sequence ``b`` with ``BLOCK_Q = 1``
  (rows = the query heads of the KV head, padded to 16), no search. A padding sequence
  (``q_len`` 0) exits at once. The loads that depend on the program id alone (the
  sequence's ``query_start_loc`` entries, ``seq_len``, its query row, the block ids of its
  first KV tile) are issued together, before anything that depends on them.

With ``num_splits > 1`` (flash-decoding, Dao et al. 2023) each split handles an even,
contiguous share of the KV tiles and writes an unnormalised partial result that
:func:`surge.kernels.attention_reduce.attention_reduce` combines. ``num_splits`` is the
launch-time maximum (the grid, fixed at graph capture); on the decode grid a sequence of
``seq_len`` tokens uses only ``clamp(cdiv(cdiv(seq_len, BLOCK_N), MIN_TILES_PER_SPLIT), 1,
num_splits)`` of them (about one per ``min_kv_per_split`` tokens, ``MIN_TILES_PER_SPLIT =
cdiv(min_kv_per_split, BLOCK_N)``), the other programs return at once, and a sequence with
one split writes its normalised output directly and no partials (the reduce skips it). The
reduce recomputes that count from ``seq_lens`` for token ``t`` when ``t`` is sequence
``t``'s token (padding sequences last, as decode batches are laid out); any other layout,
and the mixed grid, use all ``num_splits``. On the decode grid the merge may instead run
inside the attention launch (``split_counters``): the last split of a (sequence, KV head) to
finish merges its sequence's partials, as a serial split-K fix-up does, with the same bits as
the reduce kernel and one launch less per layer. No host syncs and no data-dependent
allocation: the launcher is safe inside CUDA-graph capture.

With ``rope`` (:class:`surge.kernels.kv_write.RopeKvWrite`, decode grid only) the kernel also
does what :func:`surge.kernels.kv_write.fused_qk_norm_rope_kv_write` did before it: each program
norms and rotates its query heads in registers, and the split holding a sequence's last position
norms and rotates that token's K, writes K and V into the cache and reads them back after a block
barrier. No other program of the launch may read that position: the caller passes ``rope``
only on steps whose rows read no other row's new K/V
(:attr:`surge.layers.attention_backend.AttentionMetadata.independent_rows`; not decode form,
:mod:`surge.worker.decode_form`, nor a row completing a block that another request holds).

An FP8 (``float8_e4m3fn``) cache is dequantized in registers: each K and V tile is converted
after its load (exactly, to float16: a 16-bit query is cast to float16 and both dots run in
float16 with fp32 accumulation; a float32 query keeps float32), the K scale is folded into the
softmax scale and the V scale multiplies the accumulator before it is stored (``k = k_fp8 *
k_scale``, ``v = v_fp8 * v_scale``, one scale each per layer), so the FP8 path reads half the KV
bytes and adds no pass. On the GPU the conversion is a non-pure inline-asm
``cvt.rn.f16x2.e4m3x2`` (:func:`e4m3_to_f16`, why there), which made decode over 64 x 4096
positions 279.6 -> 231.2 us per layer on the H200
(``benchmarks/results/h200-qwen3-8b-fp8/kv8-asm-cvt/``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from surge.kernels.attention_reduce import attention_reduce, merge_splits
from surge.kernels.kv_write import RopeKvWrite, norm_rope, store_heads
from surge.kernels.pdl import pdl_wait, use_pdl
from surge.quant.config import FP8_E4M3_MAX

_LOG2E = 1.4426950408889634
FP16_MAX = tl.constexpr(65504.0)
"""Largest finite float16: a bf16 query over an FP8 cache is saturated to it before its fp16 cast."""
_FP8_MAX = tl.constexpr(FP8_E4M3_MAX)
"""Largest finite e4m3 (the new K/V's clamp when ``rope`` writes an FP8 cache)."""
_NO_SKIP = 2**31 - 1

MIN_KV_PER_SPLIT = 256
"""Smallest KV share (tokens) worth a split of its own: the default of
:func:`choose_num_splits` and of the per-sequence split count on the decode grid."""


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


@triton.jit
def e4m3_to_f16(x, ASM: tl.constexpr):
    """float8_e4m3fn -> float16, exact (also used by :mod:`surge.kernels.prefill_attention`).
    With ``ASM`` (on the GPU; False under the CPU interpreter) by ``cvt.rn.f16x2.e4m3x2``,
    four values per non-pure inline asm: Triton hoists a pure conversion behind the shared
    memory store of a dot operand, so the tile would sit in shared memory as FP8 and be read back
    without ``ldmatrix`` (about 12x the shared loads of the bf16 path in the sm90 PTX); a
    non-pure op keeps the conversion in front, and the FP8 tile takes the bf16 tile's path."""
    if ASM:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            "=r,=r,r",
            [x.to(tl.uint8, bitcast=True)],
            dtype=tl.float16,
            is_pure=False,
            pack=4,
        )
    return x.to(tl.float16)


@triton.jit
def _attend_tile(
    acc,
    m_i,
    l_i,
    q,
    blk,
    kv_pos,
    kv_valid,
    q_abs,
    k_head,
    v_head,
    offs_d,
    d_valid,
    scale_log2,
    stride_kb,
    stride_ks,
    stride_vb,
    stride_vs,
    BLOCK_SIZE: tl.constexpr,
    CAUSAL: tl.constexpr,
    IEEE: tl.constexpr,
    FP8_KV: tl.constexpr,
    ASM_CVT: tl.constexpr,
):
    """One online-softmax step over the KV tile at ``kv_pos`` (block ids ``blk``); an FP8
    tile is converted to ``q``'s dtype, float16 for a 16-bit ``q`` (its scale is applied by the
    caller)."""
    in_blk = kv_pos % BLOCK_SIZE
    kt = tl.load(
        k_head + blk[None, :] * stride_kb + in_blk[None, :] * stride_ks + offs_d[:, None],
        mask=kv_valid[None, :] & d_valid[:, None],
        other=0.0,
    )
    if FP8_KV:
        kt = e4m3_to_f16(kt, ASM_CVT).to(q.dtype)
    if IEEE:
        s = tl.dot(q, kt, input_precision="ieee")
    else:
        s = tl.dot(q, kt)
    s = s * scale_log2
    if CAUSAL:
        visible = (kv_pos[None, :] <= q_abs[:, None]) & kv_valid[None, :]
    else:
        visible = kv_valid[None, :]
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(
        v_head + blk[:, None] * stride_vb + in_blk[:, None] * stride_vs + offs_d[None, :],
        mask=kv_valid[:, None] & d_valid[None, :],
        other=0.0,
    )
    if FP8_KV:
        v = e4m3_to_f16(v, ASM_CVT).to(q.dtype)
    if IEEE:
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    acc = acc * alpha[:, None] + pv
    return acc, m_new, l_i


@triton.jit
def _store_normalised(out_ptr, token, head, stride_ot, stride_oh, offs_d, acc, l_i, store_mask):
    """The final output of a tile, ``acc / l`` in ``out``'s dtype (``token`` is a scalar or
    one token per row)."""
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(
        out_ptr + (token * stride_ot + head * stride_oh)[:, None] + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=store_mask,
    )


@triton.jit
def _store_partial(
    part_out_ptr,
    part_m_ptr,
    part_l_ptr,
    part_rows,
    offs_d,
    acc,
    m_i,
    l_i,
    row_valid,
    store_mask,
    HEAD_DIM: tl.constexpr,
):
    """One split's unnormalised output, running max and denominator (fp32)."""
    tl.store(part_m_ptr + part_rows, m_i, mask=row_valid)
    tl.store(part_l_ptr + part_rows, l_i, mask=row_valid)
    tl.store(part_out_ptr + part_rows[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=store_mask)


@triton.jit(do_not_specialize=["num_seqs", "num_q_rows", "stride_bt", "bt_width", "skip_q_len"])
def _paged_attention_kernel(
    out_ptr,
    part_out_ptr,
    part_m_ptr,
    part_l_ptr,
    cnt_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    scale_log2,
    v_scale,
    num_seqs,
    num_q_rows,
    num_heads,
    skip_q_len,
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
    bt_width,
    k_new_ptr,
    v_new_ptr,
    slot_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    q_norm_ptr,
    k_norm_ptr,
    eps,
    k_inv_scale,
    v_inv_scale,
    stride_knt,
    stride_knh,
    stride_vnt,
    stride_vnh,
    stride_cos,
    stride_sin,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    MIN_TILES_PER_SPLIT: tl.constexpr,
    DECODE: tl.constexpr,
    INLINE_REDUCE: tl.constexpr,
    IEEE: tl.constexpr,
    FP8_KV: tl.constexpr,
    ASM_CVT: tl.constexpr,
    ROPE_KV: tl.constexpr,
    QK_NORM: tl.constexpr,
    HALF: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    if DECODE:
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM_PAD)
        offs_n = tl.arange(0, BLOCK_N)
        d_valid = offs_d < HEAD_DIM
        # One query token per sequence (BLOCK_Q == 1): program axis 0 = sequence, rows =
        # the query heads of this KV head. First every load that needs only the program id.
        seq_idx = tl.program_id(0)
        q_start = tl.load(query_start_loc_ptr + seq_idx)
        q_end = tl.load(query_start_loc_ptr + seq_idx + 1)
        seq_len = tl.load(seq_lens_ptr + seq_idx)
        head = kv_head * GROUP + offs_m
        row_valid = offs_m < GROUP
        q_mask = row_valid[:, None] & d_valid[None, :]
        q_offs = head[:, None] * stride_qh + offs_d[None, :]
        # Speculative: a decode batch keeps sequence b's token in row b (padding sequences
        # last); the row is reloaded below when it does not.
        spec = seq_idx < num_q_rows
        if ROPE_KV:  # the query as halves (rotary pairs them), its position, this KV head's new K/V
            offs_h = tl.arange(0, HALF)
            h_offs = head[:, None] * stride_qh + offs_h[None, :]
            h_mask = row_valid[:, None] & spec
            q1 = tl.load(q_ptr + seq_idx.to(tl.int64) * stride_qt + h_offs, mask=h_mask, other=0.0)
            q2 = tl.load(q_ptr + seq_idx.to(tl.int64) * stride_qt + h_offs + HALF, mask=h_mask, other=0.0)
            pos = tl.load(pos_ptr + seq_idx, mask=spec, other=0).to(tl.int64)
            slot = tl.load(slot_ptr + seq_idx, mask=spec, other=-1)
            kv_offs = kv_head * stride_knh + offs_h[None, :]  # [1, HALF]
            k_row = k_new_ptr + seq_idx.to(tl.int64) * stride_knt + kv_offs
            v_row = v_new_ptr + seq_idx.to(tl.int64) * stride_vnt + kv_offs
            k1 = tl.load(k_row, mask=spec, other=0.0)
            k2 = tl.load(k_row + HALF, mask=spec, other=0.0)
            v1 = tl.load(v_row, mask=spec, other=0.0)
            v2 = tl.load(v_row + HALF, mask=spec, other=0.0)
        else:
            q = tl.load(q_ptr + seq_idx.to(tl.int64) * stride_qt + q_offs, mask=q_mask & spec, other=0.0)
        bt_row = block_table_ptr + seq_idx.to(tl.int64) * stride_bt
        # Block ids of KV tile 0 (split 0's first tile), masked to the table row only.
        blk_first = tl.load(
            bt_row + offs_n // BLOCK_SIZE, mask=(offs_n < bt_width * BLOCK_SIZE) & (split == 0), other=0
        ).to(tl.int64)
        # Padding sequence (q_len 0). ``seq_len < 0`` never holds: testing it makes ptxas
        # issue the seq_len and block-table loads above before this branch, not after it
        # (one dependent round trip less; checked in the sm_90 SASS).
        if (q_end == q_start) | (seq_len < 0):
            return
        in_place = q_start == seq_idx
        if ROPE_KV:
            if q_start != seq_idx:
                q_row = q_ptr + q_start.to(tl.int64) * stride_qt
                q1 = tl.load(q_row + h_offs, mask=row_valid[:, None], other=0.0)
                q2 = tl.load(q_row + h_offs + HALF, mask=row_valid[:, None], other=0.0)
                pos = tl.load(pos_ptr + q_start).to(tl.int64)
                slot = tl.load(slot_ptr + q_start)
                k_row = k_new_ptr + q_start.to(tl.int64) * stride_knt + kv_offs
                v_row = v_new_ptr + q_start.to(tl.int64) * stride_vnt + kv_offs
                k1 = tl.load(k_row)
                k2 = tl.load(k_row + HALF)
                v1 = tl.load(v_row)
                v2 = tl.load(v_row + HALF)
            cos = tl.load(cos_ptr + pos * stride_cos + offs_h).to(tl.float32)
            sin = tl.load(sin_ptr + pos * stride_sin + offs_h).to(tl.float32)
            q1, q2 = norm_rope(q1, q2, q_norm_ptr, cos, sin, eps, HALF, HALF, QK_NORM, True)
            # [rows, 2, HALF] -> [rows, HEAD_DIM]: the halves side by side, as the cache holds k
            q = tl.reshape(tl.permute(tl.join(q1, q2), (0, 2, 1)), (BLOCK_M, HEAD_DIM_PAD))
        else:
            if q_start != seq_idx:
                q = tl.load(q_ptr + q_start.to(tl.int64) * stride_qt + q_offs, mask=q_mask, other=0.0)
        token = q_start
        q_abs = offs_m  # unused: the only query sits at the end of the context
        num_kv = seq_len
        num_tiles = tl.cdiv(num_kv, BLOCK_N)
        if NUM_SPLITS == 1:
            eff = 1
            tile_lo = 0
            tile_hi = num_tiles
        else:
            # Splits this sequence uses (attention_reduce recomputes the same number).
            eff = tl.minimum(tl.maximum(tl.cdiv(num_tiles, MIN_TILES_PER_SPLIT), 1), NUM_SPLITS)
            eff = tl.where(in_place, eff, NUM_SPLITS)
            if split >= eff:
                return
            # Balanced shares; none is empty when eff <= num_tiles (always, when in place).
            tile_lo = split * num_tiles // eff
            tile_hi = (split + 1) * num_tiles // eff
            if split != 0:
                first_pos = tile_lo * BLOCK_N + offs_n
                blk_first = tl.load(bt_row + first_pos // BLOCK_SIZE, mask=first_pos < num_kv, other=0).to(
                    tl.int64
                )
        if ROPE_KV:  # noqa: SIM102 (a constexpr, then a run-time test: two ifs in Triton)
            # The split holding the last position writes this KV head's new K/V, then reads it
            # back with the rest of its tiles (the barrier orders the block's stores before
            # its loads); no other program of this sequence reads that position, and the
            # caller keeps other sequences' rows off it (AttentionMetadata.independent_rows).
            if split == eff - 1:
                k1, k2 = norm_rope(k1, k2, k_norm_ptr, cos, sin, eps, HALF, HALF, QK_NORM, True)
                if slot >= 0:
                    blk = slot // BLOCK_SIZE
                    off = slot % BLOCK_SIZE
                    one = tl.arange(0, 1)
                    h_all = offs_h[None, :] < HALF
                    kc = k_cache_ptr + blk * stride_kb + off * stride_ks + kv_head * stride_kh
                    store_heads(kc, 0, one, offs_h, h_all, k1, k2, k_inv_scale, HALF, _FP8_MAX, FP8_KV)
                    vc = v_cache_ptr + blk * stride_vb + off * stride_vs + kv_head * stride_vh
                    store_heads(vc, 0, one, offs_h, h_all, v1, v2, v_inv_scale, HALF, _FP8_MAX, FP8_KV)
                tl.debug_barrier()
    else:
        q_tile = tl.program_id(0)
        seq_idx = _find_seq_idx(query_start_loc_ptr, q_tile, num_seqs, BLOCK_Q)
        q_start = tl.load(query_start_loc_ptr + seq_idx)
        q_len = tl.load(query_start_loc_ptr + seq_idx + 1) - q_start
        q_tile_local = q_tile - (q_start // BLOCK_Q + seq_idx)
        if (q_tile_local * BLOCK_Q >= q_len) | (q_len >= skip_q_len):
            return
        seq_len = tl.load(seq_lens_ptr + seq_idx)
        context_len = seq_len - q_len

        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM_PAD)
        offs_n = tl.arange(0, BLOCK_N)
        d_valid = offs_d < HEAD_DIM

        q_local = q_tile_local * BLOCK_Q + offs_m // GROUP_PAD
        head_in_group = offs_m % GROUP_PAD
        head = kv_head * GROUP + head_in_group
        row_valid = (offs_m // GROUP_PAD < BLOCK_Q) & (head_in_group < GROUP) & (q_local < q_len)
        token = q_start + q_local
        q_abs = context_len + q_local
        q = tl.load(
            q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
            mask=row_valid[:, None] & d_valid[None, :],
            other=0.0,
        )
        bt_row = block_table_ptr + seq_idx.to(tl.int64) * stride_bt

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
    k_head = k_cache_ptr + kv_head * stride_kh
    v_head = v_cache_ptr + kv_head * stride_vh
    if FP8_KV and not IEEE:  # 16-bit dots run in float16 over an FP8 cache (see e4m3_to_f16);
        # a bf16 query beyond float16's range saturates there instead of turning the row to NaN
        q = tl.minimum(tl.maximum(q.to(tl.float32), -FP16_MAX), FP16_MAX).to(tl.float16)

    if DECODE:
        # The first tile, with the block ids loaded up front (masked out if the split is
        # empty).
        kv_pos = tile_lo * BLOCK_N + offs_n
        kv_valid = kv_pos < tl.minimum(num_kv, tile_hi * BLOCK_N)
        acc, m_i, l_i = _attend_tile(
            acc,
            m_i,
            l_i,
            q,
            blk_first,
            kv_pos,
            kv_valid,
            q_abs,
            k_head,
            v_head,
            offs_d,
            d_valid,
            scale_log2,
            stride_kb,
            stride_ks,
            stride_vb,
            stride_vs,
            BLOCK_SIZE,
            False,
            IEEE,
            FP8_KV,
            ASM_CVT,
        )
        loop_lo = tile_lo + 1
    else:
        loop_lo = tile_lo
    for tile in range(loop_lo, tile_hi):
        kv_pos = tile * BLOCK_N + offs_n
        kv_valid = kv_pos < num_kv
        blk = tl.load(bt_row + kv_pos // BLOCK_SIZE, mask=kv_valid, other=0).to(tl.int64)
        acc, m_i, l_i = _attend_tile(
            acc,
            m_i,
            l_i,
            q,
            blk,
            kv_pos,
            kv_valid,
            q_abs,
            k_head,
            v_head,
            offs_d,
            d_valid,
            scale_log2,
            stride_kb,
            stride_ks,
            stride_vb,
            stride_vs,
            BLOCK_SIZE,
            not DECODE,
            IEEE,
            FP8_KV,
            ASM_CVT,
        )

    if FP8_KV:
        acc = acc * v_scale
    store_mask = row_valid[:, None] & d_valid[None, :]
    # Partial buffers are contiguous: m/l [T, H, S], out [T, H, S, HEAD_DIM].
    part_rows = (token.to(tl.int64) * num_heads + head) * NUM_SPLITS + split
    if NUM_SPLITS == 1:
        _store_normalised(out_ptr, token, head, stride_ot, stride_oh, offs_d, acc, l_i, store_mask)
    elif DECODE:
        if eff == 1:
            _store_normalised(out_ptr, token, head, stride_ot, stride_oh, offs_d, acc, l_i, store_mask)
        else:
            _store_partial(
                part_out_ptr,
                part_m_ptr,
                part_l_ptr,
                part_rows,
                offs_d,
                acc,
                m_i,
                l_i,
                row_valid,
                store_mask,
                HEAD_DIM,
            )
            if INLINE_REDUCE:
                # The last of the sequence's eff splits (for this KV head) to arrive merges
                # them: the barrier orders every thread's partial stores before the release,
                # the acquire orders the other splits' stores before the merge's loads.
                counter = cnt_ptr + seq_idx * tl.num_programs(1) + kv_head
                tl.debug_barrier()
                arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
                if arrived == eff - 1:
                    tl.debug_barrier()
                    # the KV head's GROUP query heads only (not the tile's padded rows)
                    offs_g = tl.arange(0, GROUP_PAD)
                    head_g = kv_head * GROUP + offs_g
                    g_valid = offs_g < GROUP
                    rows = (token.to(tl.int64) * num_heads + head_g) * NUM_SPLITS
                    merged = merge_splits(
                        part_out_ptr,
                        part_m_ptr,
                        part_l_ptr,
                        rows,
                        g_valid,
                        eff,
                        offs_d,
                        d_valid,
                        HEAD_DIM,
                        SPLITS_PAD,
                    )
                    out_rows = out_ptr + (token * stride_ot + head_g * stride_oh)[:, None] + offs_d[None, :]
                    tl.store(
                        out_rows,
                        merged.to(out_ptr.dtype.element_ty),
                        mask=g_valid[:, None] & d_valid[None, :],
                    )
                    tl.store(counter, 0)  # clean for the next launch (stream-ordered)
    else:
        _store_partial(
            part_out_ptr,
            part_m_ptr,
            part_l_ptr,
            part_rows,
            offs_d,
            acc,
            m_i,
            l_i,
            row_valid,
            store_mask,
            HEAD_DIM,
        )


def default_tile_config(
    group: int,
    head_dim: int,
    max_query_len: int | None,
    dtype: torch.dtype,
    kv_dtype: torch.dtype | None = None,
) -> AttentionTileConfig:
    """Pick the tile shape from host-side hints only (never a device read).

    Args:
        group: query heads per KV head (``num_heads // num_kv_heads``).
        head_dim: per-head dimension.
        max_query_len: longest q_len of the step if known (1 means a pure decode step).
        dtype: query dtype (fp32 halves the tile to fit shared memory).
        kv_dtype: cache dtype, None for ``dtype``. A decode step over an FP8 cache takes
            128-position KV steps instead of 64 (on the H200, Qwen3-8B heads: 349 -> 281 us at
            64 sequences of 4096 tokens, 94.5 -> 78.4 us at 1024; the bf16 cache is fastest at
            64, `benchmarks/attention_decode_bench.py`).

    Returns:
        A decode tile (16 rows, wide KV steps) for ``max_query_len == 1``, a 64- or
        128-row tile for prefill.
    """
    group_pad = triton.next_power_of_2(group)
    big = dtype == torch.float32 or head_dim > 128
    if max_query_len == 1:
        block_m = max(16, group_pad)
        block_n = 32 if big else 128 if kv_dtype == torch.float8_e4m3fn else 64
        return AttentionTileConfig(block_m=block_m, block_n=block_n, num_warps=4, num_stages=2)
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
    min_kv_per_split: int = MIN_KV_PER_SPLIT,
) -> int:
    """Heuristic number of KV splits (flash-decoding) from host-side hints.

    Splitting pays only when a pure decode step has too few (sequence, KV head) programs
    to fill the GPU and contexts are long. The result is a power of 2 so few kernel
    variants get compiled; any value is correct (splits partition each sequence's KV
    tiles evenly in the kernel). On the decode grid the result is only an upper bound: a
    sequence uses about ``cdiv(seq_len, min_kv_per_split)`` of them (see
    :func:`paged_attention`), so a graph captured for ``max_model_len`` stays cheap at short
    contexts.

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


def decode_rope_supported(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether :func:`paged_attention`'s decode grid can apply the q/k norm, rotary and K/V
    write itself (``rope``): a power-of-two ``head_dim`` (the rotary halves are tiles)."""
    head_dim = q.shape[-1]
    return head_dim >= 2 and head_dim & (head_dim - 1) == 0 and k_cache.shape[-1] == head_dim


def _rope_args(
    rope: RopeKvWrite | None, q: torch.Tensor, fp8: bool, k_scale: float, v_scale: float
) -> tuple[object, ...]:
    """The kernel's ``k_new_ptr .. stride_sin`` arguments (placeholders without ``rope``)."""
    if rope is None:
        return (q, q, q, q, q, q, q, q, 0.0, 1.0, 1.0, 0, 0, 0, 0, 0, 0)
    return (
        rope.k,
        rope.v,
        rope.slot_mapping,
        rope.positions,
        rope.cos_cache,
        rope.sin_cache,
        rope.q_norm_weight if rope.q_norm_weight is not None else q,
        rope.k_norm_weight if rope.k_norm_weight is not None else q,
        rope.eps,
        1.0 / k_scale if fp8 else 1.0,
        1.0 / v_scale if fp8 else 1.0,
        rope.k.stride(0),
        rope.k.stride(1),
        rope.v.stride(0),
        rope.v.stride(1),
        rope.cos_cache.stride(0),
        rope.sin_cache.stride(0),
    )


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
    min_kv_per_split: int = MIN_KV_PER_SPLIT,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    skip_query_len: int | None = None,
    rope: RopeKvWrite | None = None,
    split_counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of a varlen batch of query tokens over a paged KV cache.

    Query ``i`` of sequence ``b`` (``q_len = query_start_loc[b+1] - query_start_loc[b]``)
    sits at position ``seq_lens[b] - q_len + i`` and attends to keys ``0..position``;
    query head ``h`` uses KV head ``h // (num_heads // num_kv_heads)``. The cache must
    already hold the new tokens' K/V.

    Args:
        q: ``[num_tokens, num_heads, head_dim]`` fp16/bf16/fp32, last dim contiguous. Rows
            beyond ``query_start_loc[-1]`` are padding.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, ``q``'s dtype
            or float8_e4m3fn (dequantized with ``k_scale``/``v_scale``), last dim contiguous.
        query_start_loc: ``[num_seqs + 1]`` int32 (``cu_seqlens_q``).
        seq_lens: ``[num_seqs]`` int32 context lengths (cached + new tokens).
        block_table: ``[num_seqs, max_blocks_per_seq]`` int32 KV block ids.
        scale: softmax scale (usually ``head_dim ** -0.5``).
        out: optional ``[num_tokens, num_heads, head_dim]`` output buffer.
        num_splits: KV splits (1 = single pass; >1 = flash-decoding with a reduce kernel).
            On the decode grid this is the maximum (the grid size): a sequence uses
            ``clamp(cdiv(cdiv(seq_len, block_n), cdiv(min_kv_per_split, block_n)), 1,
            num_splits)`` splits, decided in the kernel from ``seq_lens``.
        max_query_len: host hint, the longest q_len of the step, or None if unknown. 1
            selects the decode grid, which reads one query token per sequence, so it must
            never understate the longest q_len (sequences with q_len 0 are allowed); any
            other value only shapes the tiles.
        config: optional tile override (benchmarks, tuning); the decode grid uses
            ``max(16, next_power_of_2(group))`` rows whatever ``config.block_m``.
        min_kv_per_split: smallest KV share (tokens) of a split on the decode grid.
        k_scale, v_scale: dequantization multipliers of an FP8 cache (ignored otherwise).
        skip_query_len: on the mixed grid, sequences with at least this many new tokens are
            skipped and their rows of ``out`` left as they are (for
            :func:`surge.kernels.prefill_attention.prefill_attention`); needs
            ``num_splits == 1``. None skips nothing.
        rope: decode grid only (``max_query_len == 1``, ``head_dim`` a power of two, see
            :func:`decode_rope_supported`): ``q`` and the step's K/V (``rope.k``/``rope.v``) come
            before their per-head RMSNorm and rotary, and the cache does not hold the new K/V
            yet. Each program norms and rotates its query heads in registers (``q`` is left
            as it is), and the split that holds a sequence's last position norms and rotates
            that token's K of its KV head and writes K and V into the cache (at
            ``rope.slot_mapping``; quantized with ``1 / k_scale``, ``1 / v_scale`` for FP8)
            before it reads its tiles: what :func:`surge.kernels.kv_write.fused_qk_norm_rope_kv_write`
            then this function compute, with the same roundings (the launch turns off
            multiply-add contraction, as that kernel's does), one launch less.
        split_counters: decode grid with ``num_splits > 1`` only (ignored otherwise): int32,
            at least ``num_seqs * num_kv_heads`` elements, all zero, persistent (allocated
            before any CUDA-graph capture), shared by stream-ordered calls. Each program of a
            sequence's splits counts itself in on its (sequence, KV head) counter after storing
            its partials, and the last one merges them
            (:func:`surge.kernels.attention_reduce.merge_splits`, the reduce kernel's bits) and
            sets the counter back to zero: no reduce launch (the serial split-K fix-up of
            :mod:`surge.kernels.fp8_gemm_splitk`'s ``"inline"`` reduction, applied to
            flash-decoding). None: the reduce kernel.

    Returns:
        ``out``: ``[num_tokens, num_heads, head_dim]`` in ``q``'s dtype; padding rows are
        unspecified (zero when the reduce kernel merges splits).

    Raises:
        ValueError: on inconsistent shapes, dtypes, ``num_splits < 1`` or
            ``min_kv_per_split < 1``, ``rope`` off the decode grid or with a head size
            that is not a power of two, or ``split_counters`` that is not int32, contiguous,
            on ``q``'s device and at least ``num_seqs * num_kv_heads`` long.
    """
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    num_seqs = seq_lens.shape[0]
    if cache_head_dim != head_dim or v_cache.shape != k_cache.shape:
        raise ValueError(f"cache shape {tuple(k_cache.shape)} does not match q {tuple(q.shape)}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if v_cache.dtype != k_cache.dtype or not (fp8 or k_cache.dtype == q.dtype):
        raise ValueError(f"dtype mismatch: q {q.dtype}, cache {k_cache.dtype}/{v_cache.dtype}")
    if query_start_loc.shape[0] != num_seqs + 1 or block_table.shape[0] < num_seqs:
        raise ValueError("query_start_loc must be [num_seqs + 1] and block_table [num_seqs, *]")
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if min_kv_per_split < 1:
        raise ValueError(f"min_kv_per_split must be >= 1, got {min_kv_per_split}")
    if skip_query_len is not None and num_splits != 1:
        raise ValueError("skip_query_len needs num_splits == 1")
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1 or block_table.stride(1) != 1:
        raise ValueError("q, k_cache, v_cache and block_table need a contiguous last dimension")
    if rope is not None:
        if max_query_len != 1 or not decode_rope_supported(q, k_cache):
            raise ValueError("rope needs the decode grid (max_query_len == 1) and a power-of-two head_dim")
        if (
            rope.k.shape[1:] != k_cache.shape[2:]
            or rope.v.shape != rope.k.shape
            or rope.k.shape[0] < num_tokens
        ):
            raise ValueError(f"rope.k {tuple(rope.k.shape)} / rope.v do not match the cache's heads")
        if rope.positions.shape[0] < num_tokens or rope.slot_mapping.shape[0] < num_tokens:
            raise ValueError(f"rope.positions and rope.slot_mapping need {num_tokens} rows (q's)")
        if rope.k.stride(-1) != 1 or rope.v.stride(-1) != 1:
            raise ValueError("rope.k and rope.v need a contiguous last dimension")
        if (rope.q_norm_weight is None) != (rope.k_norm_weight is None):
            raise ValueError("pass both q_norm_weight and k_norm_weight or neither")
        if fp8 and not (k_scale > 0.0 and v_scale > 0.0):
            raise ValueError(f"k_scale and v_scale must be positive, got {k_scale}, {v_scale}")
    decode = max_query_len == 1
    inline = decode and num_splits > 1 and split_counters is not None
    if inline:
        assert split_counters is not None
        if (
            split_counters.dtype != torch.int32
            or not split_counters.is_contiguous()
            or split_counters.device != q.device
            or split_counters.numel() < num_seqs * num_kv_heads
        ):
            raise ValueError(
                f"split_counters must be int32, contiguous, on {q.device} and hold at least "
                f"{num_seqs * num_kv_heads} counters, got {split_counters.dtype} "
                f"[{split_counters.numel()}] on {split_counters.device}"
            )
    if out is None:
        out = torch.empty_like(q)
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    cfg = config or default_tile_config(group, head_dim, max_query_len, q.dtype, k_cache.dtype)
    if decode:
        block_m, block_q, grid_rows = max(16, group_pad), 1, num_seqs
    else:
        block_m = max(cfg.block_m, group_pad)
        block_q = block_m // group_pad
        grid_rows = num_tokens // block_q + num_seqs
    min_tiles_per_split = triton.cdiv(min_kv_per_split, cfg.block_n)
    if num_splits > 1:
        part_out = torch.empty(
            (num_tokens, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        part_m = torch.empty((num_tokens, num_heads, num_splits), dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
    else:
        part_out = part_m = part_l = out
    grid = (grid_rows, num_kv_heads, num_splits)
    pdl = use_pdl(q)  # programmatic dependent launch on sm90+
    _paged_attention_kernel[grid](
        out,
        part_out,
        part_m,
        part_l,
        split_counters if inline else seq_lens,
        q,
        k_cache,
        v_cache,
        block_table,
        seq_lens,
        query_start_loc,
        scale * _LOG2E * (k_scale if fp8 else 1.0),
        v_scale if fp8 else 1.0,
        num_seqs,
        num_tokens,
        num_heads,
        _NO_SKIP if skip_query_len is None else skip_query_len,
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
        block_table.shape[1],
        *_rope_args(rope, q, fp8, k_scale, v_scale),
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        BLOCK_N=cfg.block_n,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size,
        NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        MIN_TILES_PER_SPLIT=min_tiles_per_split,
        DECODE=decode,
        INLINE_REDUCE=inline,
        IEEE=q.dtype == torch.float32,
        FP8_KV=fp8,
        ASM_CVT=fp8 and not isinstance(_paged_attention_kernel, InterpretedFunction),
        ROPE_KV=rope is not None,
        QK_NORM=rope is not None and rope.q_norm_weight is not None,
        HALF=head_dim // 2,
        PDL=pdl,
        launch_pdl=pdl,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        # with rope: rotary's roundings as torch's (see surge.kernels.kv_write._launch)
        enable_fp_fusion=rope is None,
    )
    if num_splits > 1 and not inline:
        attention_reduce(
            part_out,
            part_m,
            part_l,
            query_start_loc,
            out,
            decode_seq_lens=seq_lens if decode else None,
            min_kv_per_split=min_tiles_per_split * cfg.block_n,
        )
    return out
