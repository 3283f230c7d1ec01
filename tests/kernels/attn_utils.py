"""Builders and a plain torch oracle for the paged-attention tests."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from surge.layers.attention_backend import AttentionMetadata


@dataclass
class PagedBatch:
    """A random step: queries, new K/V, a shuffled paged cache and its metadata."""

    q: torch.Tensor  # [T_pad, H, D]
    k: torch.Tensor  # [T_pad, Hkv, D]
    v: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    metadata: AttentionMetadata


def make_batch(
    q_lens: list[int],
    seq_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    num_pad_tokens: int = 0,
    seed: int = 0,
) -> PagedBatch:
    """Random batch; sequence ``b`` has ``q_lens[b]`` new tokens and context ``seq_lens[b]``.

    Physical blocks are a random permutation (block tables point anywhere in the cache),
    unused cache slots hold random garbage, and ``num_pad_tokens`` padding rows with slot -1
    follow the real tokens.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    max_blocks = max(blocks_per_seq) + 1
    perm = torch.randperm(num_blocks, generator=gen)
    block_table = torch.zeros(len(q_lens), max_blocks, dtype=torch.int32)
    used = 0
    for b, nb in enumerate(blocks_per_seq):
        block_table[b, :nb] = perm[used : used + nb].to(torch.int32)
        used += nb
    slots: list[int] = []
    for b, (ql, sl) in enumerate(zip(q_lens, seq_lens, strict=True)):
        for i in range(ql):
            pos = sl - ql + i
            slots.append(int(block_table[b, pos // block_size]) * block_size + pos % block_size)
    slots += [-1] * num_pad_tokens
    num_tokens = sum(q_lens)
    total = num_tokens + num_pad_tokens

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    qsl = [0]
    for ql in q_lens:
        qsl.append(qsl[-1] + ql)
    metadata = AttentionMetadata(
        num_tokens=num_tokens,
        num_seqs=len(q_lens),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table=block_table.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=list(seq_lens),
    )
    return PagedBatch(
        q=rnd(total, num_heads, head_dim),
        k=rnd(total, num_kv_heads, head_dim),
        v=rnd(total, num_kv_heads, head_dim),
        k_cache=rnd(num_blocks, block_size, num_kv_heads, head_dim),
        v_cache=rnd(num_blocks, block_size, num_kv_heads, head_dim),
        metadata=metadata,
    )


def reference_attention(batch: PagedBatch, scale: float) -> torch.Tensor:
    """fp32 causal GQA attention of the real query rows over the (already written) cache."""
    md = batch.metadata
    num_heads, head_dim = batch.q.shape[1:]
    num_kv_heads = batch.k_cache.shape[2]
    block_size = batch.k_cache.shape[1]
    out = torch.zeros(md.num_tokens, num_heads, head_dim, dtype=torch.float32, device=batch.q.device)
    for b in range(md.num_seqs):
        q0, q1 = md.query_start_loc_cpu[b], md.query_start_loc_cpu[b + 1]
        sl = md.seq_lens_cpu[b]
        pos = torch.arange(sl, device=batch.q.device)
        phys = md.block_table[b].long()[pos // block_size] * block_size + pos % block_size
        keys = batch.k_cache.reshape(-1, num_kv_heads, head_dim)[phys].float()
        vals = batch.v_cache.reshape(-1, num_kv_heads, head_dim)[phys].float()
        group = num_heads // num_kv_heads
        keys = keys.repeat_interleave(group, dim=1)  # [L, H, D]
        vals = vals.repeat_interleave(group, dim=1)
        qq = batch.q[q0:q1].float()
        scores = torch.einsum("qhd,khd->hqk", qq, keys) * scale
        q_pos = torch.arange(q1 - q0, device=batch.q.device) + sl - (q1 - q0)
        scores.masked_fill_(pos[None, :] > q_pos[:, None], float("-inf"))
        out[q0:q1] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vals)
    return out


def reverse_interpreter_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under Triton's CPU interpreter, run every grid's programs last to first (for the rest of
    the test): a kernel whose programs depend on each other's order (a writer split, the last
    split to arrive) is then exercised in the order that grid order never shows. On a GPU the
    programs race for real; this does nothing there."""
    _reorder_interpreter_programs(monkeypatch, "reverse")


def split_major_interpreter_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under Triton's CPU interpreter, run every grid's programs axis 2 first: all programs
    with ``program_id(2) == 0``, then those with 1, ... (the interpreter otherwise runs axis 2
    innermost). On the paged-attention decode grid (axis 2 = the KV split) the splits of
    different (sequence, KV head) pairs then interleave, as they do on a GPU, so per-pair
    arrival counters that collided would be caught. Nothing on a GPU."""
    _reorder_interpreter_programs(monkeypatch, "split_major")


def _reorder_interpreter_programs(monkeypatch: pytest.MonkeyPatch, order: str) -> None:
    if torch.cuda.is_available():
        return
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    set_idx = type(builder).set_grid_idx

    def reordered_idx(self: object, x: int, y: int, z: int) -> None:
        gx, gy, gz = builder.grid_dim
        if order == "reverse":
            set_idx(builder, gx - 1 - x, gy - 1 - y, gz - 1 - z)
            return
        i = (x * gy + y) * gz + z  # the interpreter's position of (x, y, z)
        z2, rest = divmod(i, gx * gy)
        x2, y2 = divmod(rest, gy)
        set_idx(builder, x2, y2, z2)

    monkeypatch.setattr(builder, "set_grid_idx", reordered_idx.__get__(builder))
