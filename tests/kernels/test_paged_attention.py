"""Paged attention (single pass, split-KV, decode grid) vs a plain torch oracle."""

from __future__ import annotations

import pytest
import torch

from surge.kernels.attention_reduce import attention_reduce
from surge.kernels.paged_attention import AttentionTileConfig, choose_num_splits, paged_attention
from surge.layers.torch_attention import write_kv_cache as torch_write_kv_cache
from tests.kernels.attn_utils import (
    make_batch,
    reference_attention,
    reverse_interpreter_programs,
    split_major_interpreter_programs,
)

# Mixed step: a prefill chunk over 16 cached tokens, decodes (one at a block boundary, one
# with a single-token context), and a whole 7-token prefill.
MIXED_Q_LENS = [5, 1, 1, 7, 1]
MIXED_SEQ_LENS = [21, 37, 1, 7, 16]
SMALL_TILE = AttentionTileConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)
# Decode batch: one-tile contexts (16-token KV steps) next to long ones, a block boundary and
# a single-token context. With 32 KV tokens per split the sequences use 1, 1, 1, 2, 4, 6 and
# 1 splits (capped at num_splits).
DECODE_SEQ_LENS = [5, 16, 17, 40, 100, 161, 1]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _run(
    group: int,
    head_dim: int,
    num_splits: int,
    config: AttentionTileConfig | None,
    dtype: torch.dtype,
    device: str = "cpu",
    q_lens: list[int] = MIXED_Q_LENS,
    seq_lens: list[int] = MIXED_SEQ_LENS,
    num_kv_heads: int = 2,
    min_kv_per_split: int = 256,
    inline: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output rows and the oracle's; ``inline`` merges the decode grid's splits in the
    attention launch (``split_counters``, checked to come back zero)."""
    batch = make_batch(
        q_lens,
        seq_lens,
        num_kv_heads * group,
        num_kv_heads,
        head_dim,
        dtype=dtype,
        device=device,
        num_pad_tokens=2,
    )
    md = batch.metadata
    torch_write_kv_cache(batch.k, batch.v, batch.k_cache, batch.v_cache, md.slot_mapping)
    scale = head_dim**-0.5
    counters = torch.zeros(len(seq_lens) * num_kv_heads, dtype=torch.int32, device=device)
    out = paged_attention(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        md.query_start_loc,
        md.seq_lens,
        md.block_table,
        scale,
        num_splits=num_splits,
        max_query_len=md.max_query_len,
        config=config,
        min_kv_per_split=min_kv_per_split,
        split_counters=counters if inline else None,
    )
    assert torch.all(counters == 0)
    return out[: md.num_tokens].float(), reference_attention(batch, scale)


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_mixed_batch_fp16(group: int, head_dim: int, num_splits: int) -> None:
    out, ref = _run(group, head_dim, num_splits, None, torch.float16)
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("group", [1, 4])
def test_small_tiles_many_q_tiles_and_kv_steps(group: int, num_splits: int) -> None:
    """16-row tiles split the prefills over several query tiles and 16-wide KV steps."""
    out, ref = _run(group, 64, num_splits, SMALL_TILE, torch.float16)
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)


def test_fp32_exact_precision() -> None:
    out, ref = _run(2, 64, 1, None, torch.float32)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_pure_decode_split_matches_single_pass() -> None:
    q_lens, seq_lens = [1, 1, 1], [50, 3, 33]
    one, ref = _run(4, 64, 1, None, torch.float16, q_lens=q_lens, seq_lens=seq_lens)
    many, _ = _run(4, 64, 8, None, torch.float16, q_lens=q_lens, seq_lens=seq_lens)
    torch.testing.assert_close(one, ref, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(many, ref, atol=2e-3, rtol=2e-3)


def test_split_path_zeroes_padding_rows() -> None:
    batch = make_batch([2, 1], [9, 4], 4, 2, 64, dtype=torch.float16, num_pad_tokens=3)
    md = batch.metadata
    torch_write_kv_cache(batch.k, batch.v, batch.k_cache, batch.v_cache, md.slot_mapping)
    out = torch.full_like(batch.q, float("nan"))
    paged_attention(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        md.query_start_loc,
        md.seq_lens,
        md.block_table,
        0.125,
        out,
        num_splits=2,
    )
    assert torch.all(out[md.num_tokens :] == 0)
    assert not torch.isnan(out[: md.num_tokens]).any()


@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 4, 8])
def test_decode_grid_short_and_long_contexts(
    num_splits: int, dtype: torch.dtype, inline: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decode grid: per-sequence split counts from 1 (direct write) up to num_splits, merged
    by the reduce kernel or by each sequence's last split (programs split-major, so the
    pairs' splits interleave)."""
    if inline:
        split_major_interpreter_programs(monkeypatch)
    q_lens = [1] * len(DECODE_SEQ_LENS)
    out, ref = _run(
        4,
        32,
        num_splits,
        SMALL_TILE,
        dtype,
        q_lens=q_lens,
        seq_lens=DECODE_SEQ_LENS,
        min_kv_per_split=32,
        inline=inline,
    )
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_grid_gqa_groups(group: int) -> None:
    """Packed rows: 1, 4 or 8 query heads per KV head, padded to the 16-row tile."""
    seq_lens = [3, 70, 33]
    out, ref = _run(
        group, 32, 4, SMALL_TILE, torch.float32, q_lens=[1, 1, 1], seq_lens=seq_lens, min_kv_per_split=16
    )
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_grid_padded_sequences(num_splits: int) -> None:
    """As a CUDA graph bucket runs it: padding sequences (q_len 0, seq_len 0) after the real
    ones and padding token rows; real rows match, padding rows are zero on the split path
    (the reduce kernel's; see the in-kernel merge's test below)."""
    q_lens, seq_lens = [1, 1, 1, 0, 0], [40, 2, 90, 0, 0]
    batch = make_batch(q_lens, seq_lens, 8, 2, 32, num_pad_tokens=2)
    md = batch.metadata
    torch_write_kv_cache(batch.k, batch.v, batch.k_cache, batch.v_cache, md.slot_mapping)
    out = torch.full_like(batch.q, float("nan"))
    paged_attention(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        md.query_start_loc,
        md.seq_lens,
        md.block_table,
        32**-0.5,
        out,
        num_splits=num_splits,
        max_query_len=1,
        config=SMALL_TILE,
        min_kv_per_split=32,
    )
    torch.testing.assert_close(
        out[: md.num_tokens], reference_attention(batch, 32**-0.5), atol=1e-5, rtol=1e-5
    )
    if num_splits > 1:
        assert torch.all(out[md.num_tokens :] == 0)


@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_grid_sequence_without_token_in_the_middle(num_splits: int, inline: bool) -> None:
    """A q_len-0 sequence before real ones: tokens no longer sit at their sequence's index,
    and the kernels fall back to reading query_start_loc (and to all splits)."""
    out, ref = _run(
        2,
        32,
        num_splits,
        SMALL_TILE,
        torch.float32,
        q_lens=[1, 0, 1, 1],
        seq_lens=[20, 0, 70, 5],
        min_kv_per_split=16,
        inline=inline,
    )
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("order", ["grid", "reverse", "split_major"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_kernel_merge_same_bits_as_reduce_kernel(
    dtype: torch.dtype, order: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decode grid's in-kernel merge (``split_counters``) gives the reduce kernel's bits,
    whichever split arrives last and however the (sequence, KV head) pairs' splits interleave
    (the interpreter's programs in grid order, reversed, split-major), on a graph bucket with
    padding sequences, whose rows it leaves alone; a second call on the same counters (a graph
    replay) does the same."""
    if order == "reverse":
        reverse_interpreter_programs(monkeypatch)
    elif order == "split_major":
        split_major_interpreter_programs(monkeypatch)
    q_lens, seq_lens = [1, 1, 1, 1, 0, 0], [40, 2, 90, 161, 0, 0]
    batch = make_batch(q_lens, seq_lens, 8, 2, 32, dtype=dtype, device=DEVICE, num_pad_tokens=2)
    md = batch.metadata
    torch_write_kv_cache(batch.k, batch.v, batch.k_cache, batch.v_cache, md.slot_mapping)
    args = (batch.q, batch.k_cache, batch.v_cache, md.query_start_loc, md.seq_lens, md.block_table, 32**-0.5)
    kw = dict(num_splits=8, max_query_len=1, config=SMALL_TILE, min_kv_per_split=32)
    want = paged_attention(*args, **kw)
    counters = torch.zeros(len(q_lens) * 2, dtype=torch.int32, device=DEVICE)
    for _ in range(2):
        out = torch.full_like(batch.q, 7.0)
        paged_attention(*args, out, split_counters=counters, **kw)
        assert torch.equal(out[: md.num_tokens], want[: md.num_tokens])
        assert torch.all(out[md.num_tokens :] == 7.0)
        assert torch.all(counters == 0)


def test_in_kernel_merge_rejects_bad_counters() -> None:
    batch = make_batch([1, 1], [40, 90], 8, 2, 32, device=DEVICE)
    md = batch.metadata
    args = (batch.q, batch.k_cache, batch.v_cache, md.query_start_loc, md.seq_lens, md.block_table, 0.1)
    for bad in (torch.zeros(3, dtype=torch.int32), torch.zeros(4, dtype=torch.int64)):
        with pytest.raises(ValueError, match="split_counters"):
            paged_attention(*args, num_splits=4, max_query_len=1, split_counters=bad.to(DEVICE))
    # ignored where nothing merges: one split
    one = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    paged_attention(*args, num_splits=1, max_query_len=1, split_counters=one)


def test_reduce_merges_only_the_splits_a_decode_row_used() -> None:
    """With decode seq_lens the reduce reads the first cdiv(seq_len, min_kv_per_split)
    partials only and leaves one-split rows alone; unwritten partials are NaN here."""
    num_seqs, num_heads, splits, head_dim = 4, 2, 4, 8
    seq_lens = torch.tensor([10, 40, 1000, 0], dtype=torch.int32)  # 1, 2, 4 splits; padding
    qsl = torch.tensor([0, 1, 2, 3, 3], dtype=torch.int32)
    gen = torch.Generator().manual_seed(0)
    part_out = torch.full((num_seqs + 1, num_heads, splits, head_dim), float("nan"))
    part_m = torch.full((num_seqs + 1, num_heads, splits), float("nan"))
    part_l = torch.full_like(part_m, float("nan"))
    for t, used in [(1, 2), (2, 4)]:
        part_out[t, :, :used] = torch.randn(num_heads, used, head_dim, generator=gen)
        part_m[t, :, :used] = torch.randn(num_heads, used, generator=gen)
        part_l[t, :, :used] = torch.rand(num_heads, used, generator=gen) + 0.5
    out = torch.full((num_seqs + 1, num_heads, head_dim), 7.0)
    attention_reduce(part_out, part_m, part_l, qsl, out, decode_seq_lens=seq_lens, min_kv_per_split=32)
    assert torch.all(out[0] == 7.0)  # one split: written by the attention kernel, untouched
    for t, used in [(1, 2), (2, 4)]:
        w = torch.exp2(part_m[t, :, :used] - part_m[t, :, :used].amax(-1, keepdim=True))
        want = (w[..., None] * part_out[t, :, :used]).sum(1) / (w * part_l[t, :, :used]).sum(1)[:, None]
        torch.testing.assert_close(out[t], want)
    assert torch.all(out[3:] == 0)  # padding rows


def test_rejects_bad_shapes() -> None:
    batch = make_batch([1], [4], 4, 2, 64)
    md = batch.metadata
    with pytest.raises(ValueError):
        paged_attention(
            batch.q[:, :3], batch.k_cache, batch.v_cache, md.query_start_loc, md.seq_lens, md.block_table, 1.0
        )
    with pytest.raises(ValueError):
        paged_attention(
            batch.q,
            batch.k_cache,
            batch.v_cache,
            md.query_start_loc,
            md.seq_lens,
            md.block_table,
            1.0,
            num_splits=0,
        )
    with pytest.raises(ValueError):
        paged_attention(
            batch.q,
            batch.k_cache,
            batch.v_cache,
            md.query_start_loc,
            md.seq_lens,
            md.block_table,
            1.0,
            num_splits=2,
            max_query_len=1,
            min_kv_per_split=0,
        )


def test_choose_num_splits() -> None:
    # Prefill or mixed steps and unknown lengths never split.
    assert choose_num_splits(1, 8, 7, 8192, 132) == 1
    assert choose_num_splits(1, 8, 1, None, 132) == 1
    # Enough programs already: no split.
    assert choose_num_splits(64, 8, 1, 4096, 132) == 1
    # Batch 1, long context: many splits, a power of 2, bounded.
    s = choose_num_splits(1, 8, 1, 4096, 132)
    assert s > 1 and s & (s - 1) == 0 and s <= 32
    # Short contexts do not split.
    assert choose_num_splits(1, 8, 1, 200, 132) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("num_splits", [1, 8])
def test_gpu_qwen3_8b_shapes(num_splits: int) -> None:
    """32 q heads, 8 KV heads, head_dim 128, bf16, contexts up to 8192, mixed step."""
    q_lens = [300, 1, 1, 1, 1, 64, 1]
    seq_lens = [1324, 8192, 4000, 17, 1, 64, 2049]
    out, ref = _run(4, 128, num_splits, None, torch.bfloat16, "cuda", q_lens, seq_lens, num_kv_heads=8)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("num_splits", [1, 16])
def test_gpu_decode_batch(num_splits: int, inline: bool) -> None:
    seq_lens = [8192, 4096, 1, 777, 16, 4097, 2048, 3000]
    q_lens = [1] * len(seq_lens)
    out, ref = _run(4, 128, num_splits, None, torch.bfloat16, "cuda", q_lens, seq_lens, 8, inline=inline)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("inline", [False, True])
def test_gpu_decode_graph_splits_with_padding(inline: bool) -> None:
    """Qwen3-8B decode as a graph captured for a long max_model_len runs it: 32 splits at
    most, contexts from 1 token to 8192, two padding sequences and padding rows; merged by
    the reduce kernel or in the attention launch."""
    seq_lens = [40, 8192, 1, 300, 4097, 17, 0, 0]
    q_lens = [1] * 6 + [0, 0]
    out, ref = _run(4, 128, 32, None, torch.bfloat16, "cuda", q_lens, seq_lens, 8, inline=inline)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize(("batch", "num_splits"), [(64, 1), (64, 2), (16, 4)])
def test_gpu_decode_large_batch_long_contexts(batch: int, num_splits: int, inline: bool) -> None:
    """The serving matrix's large decode steps: up to 64 sequences at 4k+ contexts."""
    seq_lens = [4096 + 37 * (i % 9) for i in range(batch)]
    out, ref = _run(4, 128, num_splits, None, torch.bfloat16, "cuda", [1] * batch, seq_lens, 8, inline=inline)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_fp32_long_prefill() -> None:
    out, ref = _run(4, 128, 1, None, torch.float32, "cuda", [2048, 1], [4096, 300], 8)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_non_power_of_two_head_dim() -> None:
    out, ref = _run(2, 96, 2, None, torch.float16)
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)
