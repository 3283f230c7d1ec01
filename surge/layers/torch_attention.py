"""The torch reference attention backend: paged K/V writes and causal attention per sequence.

Slow but simple: it runs the CPU path and is the oracle for the Triton backend's tests. An FP8
(``float8_e4m3fn``) cache is written with :func:`surge.quant.fp8.quantize_kv` and read back as
``fp8.float() * scale`` (K and V each have one scale per layer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from surge.layers.attention_backend import AttentionBackend, AttentionMetadata
from surge.quant.fp8 import FP8_DTYPE, quantize_kv

if TYPE_CHECKING:
    from surge.kernels.kv_write import RopeKvWrite


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Store ``k``/``v [T, Hkv, D]`` at ``slot_mapping [T]`` of the caches, skipping slot -1.

    The caches are ``[num_blocks, block_size, Hkv, D]`` and must be contiguous; slot ``s``
    is block ``s // block_size``, offset ``s % block_size``. An FP8 cache stores
    ``quantize_kv(x, scale)``; ``k_scale``/``v_scale`` are ignored for other caches.
    """
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if k_cache.dtype == FP8_DTYPE:
        new_k, new_v = quantize_kv(k[valid], k_scale), quantize_kv(v[valid], v_scale)
    else:
        new_k, new_v = k[valid].to(k_cache.dtype), v[valid].to(v_cache.dtype)
    k_cache.view(-1, num_kv_heads, head_dim)[slots] = new_k
    v_cache.view(-1, num_kv_heads, head_dim)[slots] = new_v


def gather_kv(
    cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int, scale: float = 1.0
) -> torch.Tensor:
    """The first ``seq_len`` tokens of one sequence from ``cache``: ``[seq_len, Hkv, D]``
    (float32 ``fp8 * scale`` for an FP8 cache, else the cache's dtype)."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    blocks = block_table_row[:num_blocks].long()
    out = cache[blocks].reshape(-1, cache.shape[2], cache.shape[3])[:seq_len]
    return out.float() * scale if cache.dtype == FP8_DTYPE else out


class TorchAttentionBackend(AttentionBackend):
    """Reference :class:`AttentionBackend` in plain torch (CPU and GPU).

    Loops over the sequences on the host; for each, gathers its K/V from the block table
    and computes softmax attention in float32. Query ``i`` of a sequence with ``q_len``
    new tokens and context ``seq_len`` sits at position ``seq_len - q_len + i`` and sees
    keys ``0..seq_len - q_len + i``. Grouped-query attention: query head ``h`` uses KV
    head ``h // (H / Hkv)``. Queries are processed in chunks of ``query_chunk`` rows to
    bound the score matrix's memory.
    """

    name = "torch"

    def __init__(self, query_chunk: int = 1024) -> None:
        self.query_chunk = query_chunk

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        write_kv: bool = True,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        rope: RopeKvWrite | None = None,
    ) -> torch.Tensor:
        """See :meth:`AttentionBackend.forward`. Padding rows of the output are zero.

        Raises:
            ValueError: ``rope`` (this backend does not fuse rotary; the layer runs it).
        """
        if rope is not None:
            raise ValueError("the torch backend does not take rope: apply rotary before forward")
        n = metadata.num_tokens
        if write_kv:
            write_kv_cache(k[:n], v[:n], k_cache, v_cache, metadata.slot_mapping[:n], k_scale, v_scale)
        out = torch.zeros_like(q)
        num_heads, head_dim = q.shape[1], q.shape[2]
        num_kv_heads = k_cache.shape[2]
        group = num_heads // num_kv_heads
        starts = metadata.query_start_loc_cpu
        for i in range(metadata.num_seqs):
            q_start, q_end = starts[i], starts[i + 1]
            q_len = q_end - q_start
            seq_len = metadata.seq_lens_cpu[i]
            if q_len == 0:
                continue
            row = metadata.block_table[i]
            keys = gather_kv(k_cache, row, seq_len, k_scale).float()  # [L, Hkv, D]
            values = gather_kv(v_cache, row, seq_len, v_scale).float()
            for c0 in range(0, q_len, self.query_chunk):
                c1 = min(q_len, c0 + self.query_chunk)
                qq = q[q_start + c0 : q_start + c1].float().view(c1 - c0, num_kv_heads, group, head_dim)
                scores = torch.einsum("qhgd,khd->hgqk", qq, keys) * scale
                q_pos = torch.arange(c0, c1, device=q.device) + (seq_len - q_len)
                k_pos = torch.arange(seq_len, device=q.device)
                mask = k_pos[None, :] > q_pos[:, None]  # [q, L]: True = masked
                scores.masked_fill_(mask, float("-inf"))
                probs = torch.softmax(scores, dim=-1)
                o = torch.einsum("hgqk,khd->qhgd", probs, values)
                out[q_start + c0 : q_start + c1] = o.reshape(c1 - c0, num_heads, head_dim).to(q.dtype)
        return out
