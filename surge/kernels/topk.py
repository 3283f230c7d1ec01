"""Top-``k`` values and token ids of every row of a ``[B, V]`` logits tensor, for small ``k``.

The sampler's window (:func:`surge.layers.top_k_top_p.sample_top_k_window`) needs the 32 or 64
largest logits of each row of a 152k-token vocabulary. ``torch.topk`` does it by radix select,
several passes over the row per launch (about 180 us per decode step at 64 rows on the H200).
This kernel does it in two launches, each sorting only a few candidates with bitonic top-``k``
(Triton's ``tl.topk``):

1. grid ``(B, cdiv(V, CHUNK))``: each program reads ``CHUNK`` logits of one row once. The
   ``k``-th largest of the maxima of its groups of ``GROUP`` logits is a lower bound of the
   chunk's ``k``-th largest logit (``k`` groups reach it), so every logit of the chunk's top
   ``k`` is at least that bound: the program stores the logits above it (usually a little more
   than ``k``), up to ``2 k`` of them, as 64-bit keys in id order. When more pass (many logits
   tied at the bound, or a row masked to ``-inf``), it stores its exact top ``k`` instead.
2. grid ``(B,)``: each program filters its row's candidates the same way (groups of ``GROUP``
   keys, when its block holds at least ``k`` groups), compacts them, and writes the top ``k``
   values and ids in descending order.

``CHUNK`` and ``GROUP`` are launch-time choices of :func:`topk_rows` (``chunk=``, ``group=``;
by default :data:`TOPK_GROUP`, and :data:`TOPK_CHUNK` or, for a few rows,
:data:`TOPK_FEW_ROWS_CHUNK`): any powers of two with
``CHUNK // GROUP >= k`` give the same values, only the time differs.

A key packs a logit and its id so that one integer comparison orders them: the high 32 bits are
the float32's bits made order-preserving as a signed integer (negative floats get their 31 low
bits flipped), the low 32 bits are ``2**32 - 1 - id``, so among equal logits the smaller id
ranks first. The values are therefore exactly ``torch.topk``'s (the same multiset, sorted);
among tied logits the ids kept may differ from ``torch.topk``'s, which guarantees no order
either (``-0.0`` and ``+0.0`` count as equal; the values come back as ``+0.0``). A NaN logit
is kept as a candidate and sorts by its sign bit, largest (positive) or smallest (negative), so
every id returned is a real position even for NaN rows. The candidate filter is this module's
own (a lower bound from group maxima); the selection network is from the paper below.
Source of the selection network: Shanbhag et al., 2018, "Efficient Top-K Query Processing on
Massively Parallel Hardware" (bitonic top-k), as implemented by ``triton.language.topk``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TOPK_CHUNK = 4096
"""Logits per program of the first launch: :func:`topk_rows`' default ``chunk`` above
:data:`TOPK_FEW_ROWS` rows."""

TOPK_FEW_ROWS = 4
"""Most rows that take :data:`TOPK_FEW_ROWS_CHUNK` by default."""

TOPK_FEW_ROWS_CHUNK = 8192
"""Default ``chunk`` of a launch of at most :data:`TOPK_FEW_ROWS` rows. On the H200 (V = 151,936,
float32 logits (the sampler's dtype then; it now gets the model's, not re-measured),
``benchmarks/topk_bench.py --chunk-group``, ``benchmarks/results/h200-qwen3-8b-fp8/session15/``),
8192 logits per program (group 16) took 23.5 us against 28.9 at one row and k = 32, 23.7 against
31.3 at 4 rows, and 22.1 against 45.9 at one row and k = 64; at 16 rows both took 42.1 us, and at
64 rows 4096 was faster (90.3 against 106.1 us)."""

TOPK_VARIANT_ROWS: tuple[int, ...] = (1, TOPK_FEW_ROWS + 1)
"""Row counts that take each default ``chunk`` of :func:`topk_rows` once (see
:func:`default_chunk`; the row count is otherwise only the launch grid, which Triton does not
specialise on): a warm-up that runs these at a given ``k`` compiles that ``k``'s default variants."""

TOPK_GROUP = 16
"""Logits per group of the candidate filter (see the module docstring): :func:`topk_rows`'
default ``group``."""

TOPK_MAX_K = 256
"""Largest ``k`` the kernel takes (a power of two); larger windows use ``torch.topk``."""

_PAD_KEY: tl.constexpr = tl.constexpr(-(2**63))
"""The key of a position past ``V``: below every real logit's, ``-inf`` included."""


@triton.jit
def _to_key(x, ids):
    """fp32 ``x`` and int64 ``ids`` -> int64 keys ordered as (value, -id)."""
    bits = x.to(tl.int32, bitcast=True)
    s = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (s.to(tl.int64) << 32) + (4294967295 - ids)


@triton.jit
def _group_bound(x, K: tl.constexpr, GROUP: tl.constexpr):
    """The ``K``-th largest of the maxima of ``x``'s groups of ``GROUP`` consecutive entries
    (``x`` 1-D, at least ``K * GROUP`` long): ``K`` groups reach it, so at least ``K`` entries
    are ``>=`` it and every entry of the top ``K`` is too."""
    return tl.min(tl.topk(tl.max(tl.reshape(x, [x.shape[0] // GROUP, GROUP]), axis=1), K), axis=0)


@triton.jit
def _chunk_kernel(
    logits_ptr,
    keys_ptr,
    counts_ptr,
    V,
    stride_row,
    K: tl.constexpr,
    CAP: tl.constexpr,
    GROUP: tl.constexpr,
    CHUNK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < V
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + offs, mask=mask, other=float("-inf")).to(
        tl.float32
    )
    x = x + 0.0  # -0.0 -> +0.0: equal logits get equal keys up to their ids
    keys = tl.where(mask, _to_key(x, offs.to(tl.int64)), _PAD_KEY)
    thr = _group_bound(x, K, GROUP)  # every logit of the chunk's top K is >= thr
    cand = mask & ~(x < thr)  # NaN logits (and a NaN bound: the exact branch) are kept
    count = tl.sum(cand.to(tl.int32), axis=0)
    dest = keys_ptr + (row.to(tl.int64) * tl.num_programs(1) + chunk) * CAP
    if count <= CAP:  # the usual case: store the candidates in id order
        pos = tl.cumsum(cand.to(tl.int32), axis=0) - 1
        tl.store(dest + pos, keys, mask=cand)
    else:  # many logits tied at the threshold (or -inf rows): the exact top K of the chunk
        tl.store(dest + tl.arange(0, K), tl.topk(keys, K))
    tl.store(counts_ptr + row.to(tl.int64) * tl.num_programs(1) + chunk, tl.where(count <= CAP, count, K))


@triton.jit
def _merge_kernel(
    keys_ptr,
    counts_ptr,
    scratch_ptr,
    vals_ptr,
    idx_ptr,
    CHUNKS,
    K: tl.constexpr,
    CAP: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    chunk = offs // CAP
    n = tl.load(counts_ptr + row.to(tl.int64) * CHUNKS + chunk, mask=chunk < CHUNKS, other=0)
    keys = tl.load(
        keys_ptr + row.to(tl.int64) * CHUNKS * CAP + offs,
        mask=(chunk < CHUNKS) & (offs % CAP < n),
        other=_PAD_KEY,
    )
    if BLOCK // GROUP >= K:  # the same filter as the first launch, on the keys
        thr = _group_bound(keys, K, GROUP)
        cand = keys >= thr
        count = tl.sum(cand.to(tl.int32), axis=0)
        if count <= 2 * K:  # compact the candidates through scratch, then sort only them
            slots = scratch_ptr + row.to(tl.int64) * (2 * K)
            tl.store(slots + tl.cumsum(cand.to(tl.int32), axis=0) - 1, keys, mask=cand)
            tl.debug_barrier()  # the program's stores are visible to all of its threads
            few = tl.arange(0, 2 * K)
            top = tl.topk(tl.load(slots + few, mask=few < count, other=_PAD_KEY), K)
        else:
            top = tl.topk(keys, K)
    else:
        top = tl.topk(keys, K)
    s = (top >> 32).to(tl.int32)
    bits = s ^ ((s >> 31) & 0x7FFFFFFF)
    ids = 4294967295 - (top & 4294967295)
    out = row.to(tl.int64) * K + tl.arange(0, K)
    tl.store(vals_ptr + out, bits.to(tl.float32, bitcast=True))
    tl.store(idx_ptr + out, ids)


def topk_supported(k: int, vocab: int) -> bool:
    """Whether :func:`topk_rows` takes ``k`` over rows of ``vocab`` logits: ``k`` a power of two
    in ``2..TOPK_MAX_K`` (``tl.topk`` needs two) and ``vocab >= k``."""
    return 2 <= k <= TOPK_MAX_K and k & (k - 1) == 0 and vocab >= k


def default_chunk(rows: int) -> int:
    """:func:`topk_rows`' ``chunk`` for a launch of ``rows`` rows when none is given:
    :data:`TOPK_FEW_ROWS_CHUNK` up to :data:`TOPK_FEW_ROWS` rows, else :data:`TOPK_CHUNK`."""
    return TOPK_FEW_ROWS_CHUNK if rows <= TOPK_FEW_ROWS else TOPK_CHUNK


def topk_rows(
    logits: torch.Tensor, k: int, *, chunk: int | None = None, group: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest logits of every row and their ids, in descending order.

    Args:
        logits: ``[B, V]`` fp32/fp16/bf16, last dim contiguous.
        k: a power of two in ``2..TOPK_MAX_K``, at most ``V``.
        chunk: logits per program of the first launch, a power of two (``None``:
            :data:`TOPK_FEW_ROWS_CHUNK` for at most :data:`TOPK_FEW_ROWS` rows, else
            :data:`TOPK_CHUNK`). Capped at ``max(next_power_of_2(V), k * group)``: a chunk past
            the row's end would only read padding.
        group: logits per group of both launches' candidate filter, a power of two at most
            ``chunk`` with ``chunk // group >= k`` (the bound needs ``k`` groups; ``None``:
            :data:`TOPK_GROUP`). ``chunk`` and ``group`` change the time, not the result.

    Returns:
        ``(values [B, k] float32, ids [B, k] int64)``: ``values`` equals
        ``torch.topk(logits.float(), k).values``; ``logits[b, ids[b, j]] == values[b, j]``,
        ids distinct within a row, the smaller id first among equal values.

    Raises:
        ValueError: a ``k``, ``chunk`` or ``group`` outside the above, a ``[B, V]`` shape with
            ``V < k``, another dtype, or a non-contiguous last dimension.
    """
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits must be [B, V] with a contiguous last dim, got {tuple(logits.shape)}")
    if logits.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"logits must be float32, float16 or bfloat16, got {logits.dtype}")
    b, v = logits.shape
    if not topk_supported(k, v):
        raise ValueError(f"k must be a power of two in 2..{min(TOPK_MAX_K, v)}, got {k} (V = {v})")
    if chunk is None:
        chunk = default_chunk(logits.shape[0])
    group = TOPK_GROUP if group is None else group
    for name, n in (("chunk", chunk), ("group", group)):
        if n < 1 or n & (n - 1):
            raise ValueError(f"{name} must be a power of two, got {n}")
    if chunk < group:
        raise ValueError(f"group must be at most chunk, got chunk {chunk}, group {group}")
    if chunk // group < k:
        raise ValueError(
            f"chunk // group must be at least k (the bound needs k groups per chunk), "
            f"got chunk {chunk} // group {group} = {chunk // group} < k {k}"
        )
    chunk = min(chunk, max(triton.next_power_of_2(v), k * group))  # still at least k groups
    chunks = triton.cdiv(v, chunk)
    cap = 2 * k  # candidates stored per chunk (and compacted per row by the second launch)
    vals = torch.empty((b, k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((b, k), dtype=torch.int64, device=logits.device)
    if b == 0:
        return vals, ids
    keys = torch.empty((b, chunks * cap), dtype=torch.int64, device=logits.device)
    counts = torch.empty((b, chunks), dtype=torch.int32, device=logits.device)
    _chunk_kernel[(b, chunks)](
        logits,
        keys,
        counts,
        v,
        logits.stride(0),
        K=k,
        CAP=cap,
        GROUP=group,
        CHUNK=chunk,
        num_warps=8 if chunk >= 4096 else 4,
    )
    block = triton.next_power_of_2(chunks * cap)
    scratch = torch.empty((b, 2 * k), dtype=torch.int64, device=logits.device)
    _merge_kernel[(b,)](
        keys,
        counts,
        scratch,
        vals,
        ids,
        chunks,
        K=k,
        CAP=cap,
        GROUP=group,
        BLOCK=block,
        num_warps=8 if block >= 2048 else 4,
    )
    return vals, ids
