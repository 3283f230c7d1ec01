"""Tensor-parallel layers: each rank's shard, recombined by hand, equals the full layer."""

from __future__ import annotations

import pytest
import torch

from surge.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from surge.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)

G = torch.Generator().manual_seed(0)


def _load(layer: torch.nn.Module, name: str, tensor: torch.Tensor, shard=None) -> None:
    param = getattr(layer, name)
    param.weight_loader(param, tensor, shard)


def test_column_and_row_parallel_recombine() -> None:
    w1 = torch.randn(12, 8, generator=G)
    b1 = torch.randn(12, generator=G)
    w2 = torch.randn(8, 12, generator=G)
    b2 = torch.randn(8, generator=G)
    x = torch.randn(5, 8, generator=G)
    ref = torch.nn.functional.linear(torch.nn.functional.linear(x, w1, b1), w2, b2)
    total = torch.zeros(5, 8)
    for rank in range(3):
        col = ColumnParallelLinear(8, 12, bias=True, tp_rank=rank, tp_size=3)
        _load(col, "weight", w1)
        _load(col, "bias", b1)
        row = RowParallelLinear(12, 8, bias=False, tp_rank=rank, tp_size=3)
        _load(row, "weight", w2)
        total += torch.nn.functional.linear(col(x), row.weight)  # the all-reduce, by hand
    torch.testing.assert_close(total + b2, ref)


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_qkv_shards_hold_their_heads(tp_size: int) -> None:
    heads, kv_heads, d, hidden = 4, 2, 3, 6
    wq = torch.randn(heads * d, hidden, generator=G)
    wk = torch.randn(kv_heads * d, hidden, generator=G)
    wv = torch.randn(kv_heads * d, hidden, generator=G)
    for rank in range(tp_size):
        layer = QKVParallelLinear(hidden, d, heads, kv_heads, bias=False, tp_rank=rank, tp_size=tp_size)
        for shard, w in (("q", wq), ("k", wk), ("v", wv)):
            _load(layer, "weight", w, shard)
        q, k, v = layer.weight.split([layer.q_size, layer.kv_size, layer.kv_size])
        hq = heads // tp_size
        assert torch.equal(q, wq[rank * hq * d : (rank + 1) * hq * d])
        kv_head = rank * kv_heads // tp_size  # the KV head of this rank's query heads
        nkv = layer.num_kv_heads
        assert torch.equal(k, wk[kv_head * d : (kv_head + nkv) * d])
        assert torch.equal(v, wv[kv_head * d : (kv_head + nkv) * d])


def test_merged_column_and_replicated() -> None:
    gate = torch.randn(6, 4, generator=G)
    up = torch.randn(6, 4, generator=G)
    for rank in range(2):
        layer = MergedColumnParallelLinear(4, [6, 6], tp_rank=rank, tp_size=2)
        _load(layer, "weight", gate, 0)
        _load(layer, "weight", up, 1)
        assert torch.equal(
            layer.weight, torch.cat([gate[rank * 3 : rank * 3 + 3], up[rank * 3 : rank * 3 + 3]])
        )
    rep = ReplicatedLinear(4, 6)
    _load(rep, "weight", gate)
    assert torch.equal(rep.weight, gate)
    with pytest.raises(ValueError, match="shape"):
        _load(rep, "weight", up.t())


def test_vocab_parallel_shards_pad_and_lm_head_trims() -> None:
    vocab, hidden = 11, 4
    w = torch.randn(vocab, hidden, generator=G)
    x = torch.randn(2, hidden, generator=G)
    parts = []
    for rank in range(2):
        head = ParallelLMHead(vocab, hidden, tp_rank=rank, tp_size=2)
        _load(head, "weight", w)
        parts.append(torch.nn.functional.linear(x, head.weight))  # the all-gather, by hand
    torch.testing.assert_close(torch.cat(parts, dim=-1)[:, :vocab], x @ w.t())
    emb = VocabParallelEmbedding(vocab, hidden)
    _load(emb, "weight", w)
    tied = ParallelLMHead(vocab, hidden, tie_to=emb)
    assert tied.weight is emb.weight
    torch.testing.assert_close(tied(x), x @ w.t())
    assert torch.equal(emb(torch.tensor([3, 10])), w[[3, 10]])
