"""Grammar token masks applied to logits in place, in Triton.

Row ``i`` of a packed bitmask (xgrammar's layout: bit ``t % 32`` of word ``t // 32`` set when
token ``t`` is allowed) belongs to logits row ``rows[i]``; every token whose bit is clear gets
``-inf``. Only the ``n`` listed rows are read or written, so a batch with a few constrained rows
pays for those rows alone. The torch reference is
:func:`surge.structured.bitmask.apply_token_bitmask_torch`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 4096
"""Tokens per program (128 mask words)."""


@triton.jit
def _token_bitmask_kernel(
    logits_ptr,
    bitmask_ptr,
    rows_ptr,
    vocab_size,
    stride_logits,
    stride_bitmask,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    row = tl.load(rows_ptr + i).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    words = tl.load(
        bitmask_ptr + i.to(tl.int64) * stride_bitmask + offs // 32, mask=offs < vocab_size, other=-1
    )
    banned = ((words >> (offs % 32)) & 1) == 0
    tl.store(logits_ptr + row * stride_logits + offs, float("-inf"), mask=banned & (offs < vocab_size))


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """Set to ``-inf``, in place, the logits of tokens a grammar forbids.

    Args:
        logits: ``[S, V]`` float logits (last dim contiguous).
        bitmask: ``[n, W]`` int32, ``W >= ceil(V / 32)``; row ``i`` applies to logits row
            ``rows[i]``; bits past ``V`` are ignored.
        rows: ``[n]`` int32 logits rows, distinct, each in ``[0, S)``.

    Raises:
        ValueError: shapes, dtypes or devices that do not match.
    """
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits must be [S, V] with a contiguous last dim, got {tuple(logits.shape)}")
    vocab = logits.shape[1]
    if (
        bitmask.dim() != 2
        or bitmask.dtype != torch.int32
        or bitmask.shape[1] * 32 < vocab
        or bitmask.stride(1) != 1
    ):
        raise ValueError(
            f"bitmask must be [n, >= {(vocab + 31) // 32}] int32, got {tuple(bitmask.shape)} {bitmask.dtype}"
        )
    if rows.dim() != 1 or rows.dtype != torch.int32 or rows.shape[0] != bitmask.shape[0]:
        raise ValueError(f"rows must be [{bitmask.shape[0]}] int32, got {tuple(rows.shape)} {rows.dtype}")
    if not logits.device == bitmask.device == rows.device:
        raise ValueError("logits, bitmask and rows must be on one device")
    n = bitmask.shape[0]
    if n == 0:
        return
    _token_bitmask_kernel[(n, triton.cdiv(vocab, _BLOCK))](
        logits, bitmask, rows, vocab, logits.stride(0), bitmask.stride(0), BLOCK=_BLOCK, num_warps=8
    )
