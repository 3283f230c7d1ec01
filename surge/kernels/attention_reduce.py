"""Combine split-KV partial attention results (flash-decoding reduce, Triton).

Each split ``s`` of a (token, head) row leaves an unnormalised output ``acc_s``, its
running max ``m_s`` (log2 domain, scaled scores) and its softmax denominator ``l_s``. The
exact result is ``sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s`` with ``M = max_s m_s``
(Dao et al., "Flash-Decoding for long-context inference", 2023).

After a decode launch of :func:`surge.kernels.paged_attention.paged_attention` a row uses
only the first ``eff = clamp(cdiv(seq_len, min_kv_per_split), 1, num_splits)`` splits of
its sequence; this kernel recomputes ``eff`` from ``seq_lens`` the same way, merges those
splits only, and leaves the row alone when ``eff == 1`` (the attention kernel wrote it).

:func:`merge_splits` is the merge itself, shared with the decode grid of
:func:`surge.kernels.paged_attention.paged_attention`, whose last split of a (sequence, KV
head) may merge in place of this kernel: it adds the splits in order ``0 .. eff - 1`` with
explicit fused multiply-adds, so both give the same bits whatever the launch's contraction
setting or the tile's shape.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from surge.kernels.pdl import pdl_wait, use_pdl


@triton.jit
def _split_terms(
    part_out_ptr, part_m_ptr, part_l_ptr, rows, row_mask, s, eff, m_max, offs_d, d_valid, HEAD_DIM
):
    """Split ``s``'s weight ``2^(m_s - m_max)`` ``[R]``, denominator ``[R]`` and output
    ``[R, HEAD_DIM_PAD]``; all zero when ``s >= eff`` (no load)."""
    ok = row_mask & (s < eff)
    w = tl.exp2(tl.load(part_m_ptr + rows + s, mask=ok, other=float("-inf"), cache_modifier=".cg") - m_max)
    l_s = tl.load(part_l_ptr + rows + s, mask=ok, other=0.0, cache_modifier=".cg")
    acc = tl.load(
        part_out_ptr + (rows + s)[:, None] * HEAD_DIM + offs_d[None, :],
        mask=ok[:, None] & d_valid[None, :],
        other=0.0,
        cache_modifier=".cg",
    )
    return w, l_s, acc


@triton.jit
def merge_splits(
    part_out_ptr,
    part_m_ptr,
    part_l_ptr,
    rows,
    row_mask,
    eff,
    offs_d,
    d_valid,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    """The merged, normalised output ``[R, HEAD_DIM_PAD]`` fp32 of ``R`` (token, head) rows
    whose partials start at row ``rows [R]`` (int64, ``(token * num_heads + head) *
    num_splits``) of the partial buffers, over their first ``eff`` (>= 1, <= ``SPLITS_PAD``)
    splits. Rows off ``row_mask`` are not read (they come out zero). Loads go through L2
    (``.cg``), so partials that other programs of the same launch stored are seen once an
    acquire has ordered them. The splits are added in order ``0 .. eff - 1`` with explicit
    fused multiply-adds (the same bits for any ``R``, launch or contraction setting); their
    loads are issued eight splits at a time, so a long merge waits on L2 about
    ``cdiv(eff - 1, 8) + 1`` times, not ``eff`` times. Source: Dao et al., "Flash-Decoding for
    long-context inference" (2023), the rescale by ``2^(m_s - max_s m_s)``."""
    offs_s = tl.arange(0, SPLITS_PAD)
    m = tl.load(
        part_m_ptr + rows[:, None] + offs_s[None, :],
        mask=row_mask[:, None] & (offs_s < eff)[None, :],
        other=float("-inf"),
        cache_modifier=".cg",
    )
    m_max = tl.where(row_mask, tl.max(m, 1), 0.0)
    w, l_s, acc = _split_terms(
        part_out_ptr, part_m_ptr, part_l_ptr, rows, row_mask, 0, eff, m_max, offs_d, d_valid, HEAD_DIM
    )
    denom = w * l_s
    num = w[:, None] * acc
    for s in range(1, eff, 8):  # eight splits' loads, then their multiply-adds in order
        w0, l0, a0 = _split_terms(
            part_out_ptr, part_m_ptr, part_l_ptr, rows, row_mask, s, eff, m_max, offs_d, d_valid, HEAD_DIM
        )
        w1, l1, a1 = _split_terms(
            part_out_ptr, part_m_ptr, part_l_ptr, rows, row_mask, s + 1, eff, m_max, offs_d, d_valid, HEAD_DIM
        )
        w2, l2, a2 = _split_terms(
            part_out_ptr, part_m_ptr, part_l_ptr, rows, row_mask, s + 2, eff, m_max, offs_d, d_valid, HEAD_DIM
        )
        w3, l3, a3 = _split_terms(
            part_out_ptr, part_m_ptr, part_l_ptr, rows, row_mask, s + 3, eff, m_max, offs_d, d_valid, HEAD_DIM
        )
        w4, l4, a4 = _split_terms(
            part_out_ptr, part_m_ptr, part_l_ptr, rows, row_mask, s + 4, eff, m_max, offs_d, d_valid, HEAD_DIM
        )
        w5, l5, a5 = _split_terms(
            part_out_ptr, part_m_ptr, part_l_ptr, rows, row_mask, s + 5, eff, m_max, offs_d, d_valid, HEAD_DIM
        )
        w6, l6, a6 = _split_terms(
            part_out_ptr, part_m_ptr, part_l_ptr, rows, row_mask, s + 6, eff, m_max, offs_d, d_valid, HEAD_DIM
        )
        w7, l7, a7 = _split_terms(
            part_out_ptr, part_m_ptr, part_l_ptr, rows, row_mask, s + 7, eff, m_max, offs_d, d_valid, HEAD_DIM
        )
        # a split past eff adds w = 0 times zeros: the sums are unchanged
        denom = tl.fma(w0, l0, denom)
        num = tl.fma(w0[:, None], a0, num)
        denom = tl.fma(w1, l1, denom)
        num = tl.fma(w1[:, None], a1, num)
        denom = tl.fma(w2, l2, denom)
        num = tl.fma(w2[:, None], a2, num)
        denom = tl.fma(w3, l3, denom)
        num = tl.fma(w3[:, None], a3, num)
        denom = tl.fma(w4, l4, denom)
        num = tl.fma(w4[:, None], a4, num)
        denom = tl.fma(w5, l5, denom)
        num = tl.fma(w5[:, None], a5, num)
        denom = tl.fma(w6, l6, denom)
        num = tl.fma(w6[:, None], a6, num)
        denom = tl.fma(w7, l7, denom)
        num = tl.fma(w7[:, None], a7, num)
    denom = tl.where(denom > 0.0, denom, 1.0)
    return num / denom[:, None]


@triton.jit(do_not_specialize=["num_seqs"])
def _attention_reduce_kernel(
    out_ptr,
    part_out_ptr,
    part_m_ptr,
    part_l_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    num_seqs,
    num_heads,
    stride_ot,
    stride_oh,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    DECODE: tl.constexpr,
    MIN_KV_PER_SPLIT: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    token = tl.program_id(0)
    head = tl.program_id(1)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_valid = offs_d < HEAD_DIM
    out_row = out_ptr + token * stride_ot + head * stride_oh + offs_d
    num_real = tl.load(query_start_loc_ptr + num_seqs)
    if DECODE:
        # Token t is sequence t's query when query_start_loc[t:t+2] == [t, t+1] (a decode
        # batch with its padding sequences last); the attention kernel applied the same test.
        is_seq = token < num_seqs
        start = tl.load(query_start_loc_ptr + token, mask=is_seq, other=-1)
        end = tl.load(query_start_loc_ptr + token + 1, mask=is_seq, other=-1)
        seq_len = tl.load(seq_lens_ptr + token, mask=is_seq, other=0)
    if token >= num_real:
        tl.store(out_row, tl.zeros([HEAD_DIM_PAD], dtype=tl.float32).to(out_ptr.dtype.element_ty), d_valid)
        return
    if DECODE:
        eff = tl.minimum(tl.maximum(tl.cdiv(seq_len, MIN_KV_PER_SPLIT), 1), NUM_SPLITS)
        eff = tl.where((start == token) & (end == token + 1), eff, NUM_SPLITS)
        if eff == 1:
            return  # one split: the attention kernel wrote the final row
    else:
        eff = NUM_SPLITS
    one = tl.arange(0, 1)
    rows = (token.to(tl.int64) * num_heads + head) * NUM_SPLITS + one
    out = merge_splits(
        part_out_ptr, part_m_ptr, part_l_ptr, rows, one == 0, eff, offs_d, d_valid, HEAD_DIM, SPLITS_PAD
    )
    tl.store(out_row[None, :] + one[:, None], out.to(out_ptr.dtype.element_ty), mask=d_valid[None, :])


def attention_reduce(
    part_out: torch.Tensor,
    part_m: torch.Tensor,
    part_l: torch.Tensor,
    query_start_loc: torch.Tensor,
    out: torch.Tensor,
    *,
    decode_seq_lens: torch.Tensor | None = None,
    min_kv_per_split: int = 256,
) -> torch.Tensor:
    """Merge split-KV partials into the final attention output.

    Args:
        part_out: ``[num_tokens, num_heads, num_splits, head_dim]`` fp32 contiguous,
            unnormalised per-split outputs.
        part_m: ``[num_tokens, num_heads, num_splits]`` fp32 contiguous, per-split running
            max in the log2 domain (a split that saw no key holds a very negative value).
        part_l: ``[num_tokens, num_heads, num_splits]`` fp32 contiguous, per-split softmax
            denominators (0 for an empty split).
        query_start_loc: ``[num_seqs + 1]`` int32; rows ``>= query_start_loc[-1]`` are
            padding and get zeros.
        out: ``[num_tokens, num_heads, head_dim]`` output (any float dtype, last dim
            contiguous), written in place.
        decode_seq_lens: ``[num_seqs]`` int32 context lengths (tokens) after a decode launch
            of the attention kernel (every q_len 0 or 1); None merges all ``num_splits``
            splits of every row. With it, row ``t`` whose token belongs to sequence ``t``
            (``query_start_loc[t:t+2] == [t, t+1]``) merges only its first
            ``clamp(cdiv(decode_seq_lens[t], min_kv_per_split), 1, num_splits)`` splits and
            is left untouched when that is 1; other rows merge all splits.
        min_kv_per_split: the KV tokens per split the attention kernel used (its
            ``MIN_TILES_PER_SPLIT * BLOCK_N``); only read with ``decode_seq_lens``.

    Returns:
        ``out``.

    Raises:
        ValueError: if the partial buffers are not contiguous or shapes disagree.
    """
    num_tokens, num_heads, num_splits, head_dim = part_out.shape
    num_seqs = query_start_loc.shape[0] - 1
    if not (part_out.is_contiguous() and part_m.is_contiguous() and part_l.is_contiguous()):
        raise ValueError("partial buffers must be contiguous")
    if part_m.shape != (num_tokens, num_heads, num_splits) or part_l.shape != part_m.shape:
        raise ValueError(f"part_m/part_l shape {tuple(part_m.shape)} does not match part_out")
    if out.shape != (num_tokens, num_heads, head_dim) or out.stride(2) != 1:
        raise ValueError(f"out shape {tuple(out.shape)} does not match part_out")
    if decode_seq_lens is not None and decode_seq_lens.shape != (num_seqs,):
        raise ValueError(f"decode_seq_lens shape {tuple(decode_seq_lens.shape)} is not [{num_seqs}]")
    if min_kv_per_split < 1:
        raise ValueError(f"min_kv_per_split must be >= 1, got {min_kv_per_split}")
    pdl = use_pdl(out)  # programmatic dependent launch on sm90+
    _attention_reduce_kernel[(num_tokens, num_heads)](
        out,
        part_out,
        part_m,
        part_l,
        query_start_loc,
        query_start_loc if decode_seq_lens is None else decode_seq_lens,
        num_seqs,
        num_heads,
        out.stride(0),
        out.stride(1),
        NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        DECODE=decode_seq_lens is not None,
        MIN_KV_PER_SPLIT=min_kv_per_split,
        PDL=pdl,
        launch_pdl=pdl,
        num_warps=4,
    )
    return out
