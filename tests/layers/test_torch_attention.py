"""The torch reference attention backend against plain causal attention on contiguous tensors."""

from __future__ import annotations

import math

import pytest
import torch

from surge.layers.attention_backend import AttentionMetadata
from surge.layers.torch_attention import TorchAttentionBackend


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_len: int, scale: float) -> torch.Tensor:
    """Causal attention of the last ``q_len`` rows of q over k/v ``[L, H(kv), D]`` (contiguous)."""
    length, heads, _ = k.shape
    group = q.shape[1] // heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * scale
    q_pos = torch.arange(length - q_len, length)[:, None]
    scores = scores.masked_fill(torch.arange(length)[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double()).float()


@pytest.mark.parametrize("query_chunk", [1024, 3])
def test_mixed_batch_with_random_block_tables(query_chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, head_dim, block_size, num_blocks = 4, 2, 16, 8, 64
    scale = head_dim**-0.5
    # (cached context, new tokens): a fresh prefill, a prefill chunk after cached context,
    # and three decodes.
    seqs = [(0, 13), (20, 9), (5, 1), (31, 1), (16, 1)]
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim)
    v_cache = torch.zeros_like(k_cache)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    full_k, full_v, full_q, tables, slots = [], [], [], [], []
    for ctx, new in seqs:
        length = ctx + new
        nb = math.ceil(length / block_size)
        blocks = [perm.pop() for _ in range(nb)]
        tables.append(blocks)
        kk = torch.randn(length, kv_heads, head_dim, generator=g)
        vv = torch.randn(length, kv_heads, head_dim, generator=g)
        for pos in range(ctx):  # the cached context is already in the cache
            k_cache[blocks[pos // block_size], pos % block_size] = kk[pos]
            v_cache[blocks[pos // block_size], pos % block_size] = vv[pos]
        slots += [blocks[p // block_size] * block_size + p % block_size for p in range(ctx, length)]
        full_k.append(kk)
        full_v.append(vv)
        full_q.append(torch.randn(new, heads, head_dim, generator=g))
    width = max(len(t) for t in tables)
    block_table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    q_lens = [n for _, n in seqs]
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    seq_lens = [c + n for c, n in seqs]
    num_tokens = cu[-1]
    pad = 3  # padding rows at the end of the batch, slot -1
    q = torch.cat(full_q + [torch.randn(pad, heads, head_dim, generator=g)])
    k_new = torch.cat(
        [kk[c:] for kk, (c, _) in zip(full_k, seqs, strict=True)]
        + [torch.full((pad, kv_heads, head_dim), 99.0)]
    )
    v_new = torch.cat(
        [vv[c:] for vv, (c, _) in zip(full_v, seqs, strict=True)]
        + [torch.full((pad, kv_heads, head_dim), 99.0)]
    )
    md = AttentionMetadata(
        num_tokens=num_tokens,
        num_seqs=len(seqs),
        query_start_loc=torch.tensor(cu, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=block_table,
        slot_mapping=torch.tensor(slots + [-1] * pad, dtype=torch.int64),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        query_start_loc_cpu=cu,
        seq_lens_cpu=seq_lens,
    )
    out = TorchAttentionBackend(query_chunk=query_chunk).forward(q, k_new, v_new, k_cache, v_cache, md, scale)
    assert out.shape == q.shape
    for i, (_, new) in enumerate(seqs):
        ref = _reference(full_q[i], full_k[i], full_v[i], new, scale)
        torch.testing.assert_close(out[cu[i] : cu[i + 1]], ref, atol=1e-5, rtol=1e-5)
    # New K/V landed in their slots; padding (value 99) was not written anywhere.
    for i, (ctx, new) in enumerate(seqs):
        for pos in range(ctx, ctx + new):
            blk = tables[i][pos // block_size]
            assert torch.equal(k_cache[blk, pos % block_size], full_k[i][pos])
            assert torch.equal(v_cache[blk, pos % block_size], full_v[i][pos])
    assert not (k_cache == 99.0).any()
