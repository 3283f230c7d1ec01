"""Prefill attention (FlashAttention-2 schedule) vs a plain torch oracle.

The kernel reads the prefix from the paged cache and the new tokens from the contiguous
k/v, so the tests give it a cache whose new-token slots hold garbage (never written) while
the oracle reads a copy of the cache with the new tokens written. Over an FP8 cache it reads
the new tokens from the cache too (the KV write runs first), so those tests give it the
written cache and k/v full of NaN.
"""

from __future__ import annotations

import pytest
import torch

from surge.kernels.prefill_attention import (
    PrefillTileConfig,
    default_prefill_tile,
    prefill_attention,
    prefill_supported,
)
from surge.layers.torch_attention import TorchAttentionBackend
from surge.layers.torch_attention import write_kv_cache as torch_write_kv_cache
from surge.quant.fp8 import FP8_DTYPE
from tests.kernels.attn_utils import PagedBatch, make_batch, reference_attention

SMALL = PrefillTileConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)
# Chunked prefill over paged prefixes (23 and 16 cached tokens: mid-block and a block
# boundary), a whole prompt of odd length, a decode row (skipped), a 2-token chunk.
Q_LENS = [37, 5, 1, 20, 2]
SEQ_LENS = [60, 5, 9, 36, 50]


def _run(
    q_lens: list[int],
    seq_lens: list[int],
    group: int,
    config: PrefillTileConfig | None,
    dtype: torch.dtype = torch.float32,
    head_dim: int = 32,
    num_kv_heads: int = 2,
    block_size: int = 16,
    min_query_len: int = 2,
    device: str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, PagedBatch]:
    batch = make_batch(
        q_lens,
        seq_lens,
        num_kv_heads * group,
        num_kv_heads,
        head_dim,
        block_size=block_size,
        dtype=dtype,
        device=device,
        num_pad_tokens=2,
    )
    md = batch.metadata
    written = PagedBatch(
        batch.q, batch.k, batch.v, batch.k_cache.clone(), batch.v_cache.clone(), batch.metadata
    )
    torch_write_kv_cache(written.k, written.v, written.k_cache, written.v_cache, md.slot_mapping)
    scale = head_dim**-0.5
    sentinel = torch.full_like(batch.q, 7.0)
    out = prefill_attention(
        batch.q,
        batch.k,
        batch.v,
        batch.k_cache,
        batch.v_cache,
        md.query_start_loc,
        md.seq_lens,
        md.block_table,
        scale,
        sentinel,
        min_query_len=min_query_len,
        config=config,
    )
    return out, reference_attention(written, scale), batch


def _check(out: torch.Tensor, ref: torch.Tensor, batch: PagedBatch, min_query_len: int, tol: float) -> None:
    md = batch.metadata
    qsl = md.query_start_loc_cpu
    for b in range(md.num_seqs):
        rows = slice(qsl[b], qsl[b + 1])
        if qsl[b + 1] - qsl[b] >= min_query_len:
            torch.testing.assert_close(out[rows].float(), ref[rows], atol=tol, rtol=tol)
        else:
            assert bool((out[rows] == 7.0).all()), f"sequence {b} should have been skipped"
    assert bool((out[md.num_tokens :] == 7.0).all()), "padding rows must not be written"


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize(
    "config",
    [SMALL, PrefillTileConfig(block_m=32, block_n=16, num_warps=4, num_stages=1)],
    ids=["m16n16", "m32n16"],
)
def test_chunked_prefill_paged_prefix_gqa_fp32(group: int, config: PrefillTileConfig) -> None:
    out, ref, batch = _run(Q_LENS, SEQ_LENS, group, config)
    _check(out, ref, batch, 2, 1e-4)


def test_block_n_wider_than_a_kv_block_and_fp16() -> None:
    """32-position KV tiles over 8-token blocks; prefixes of 8, 32 and 40 tokens (block and
    tile boundaries) and a query tile boundary at 32."""
    cfg = PrefillTileConfig(block_m=32, block_n=32, num_warps=4, num_stages=1)
    q_lens = [32, 33, 17, 64]
    seq_lens = [40, 65, 49, 72]
    out, ref, batch = _run(q_lens, seq_lens, 2, cfg, dtype=torch.float16, block_size=8)
    _check(out, ref, batch, 2, 2e-3)


def test_min_query_len_leaves_short_rows() -> None:
    out, ref, batch = _run([3, 9, 16], [3, 30, 16], 2, SMALL, min_query_len=9)
    _check(out, ref, batch, 9, 1e-4)


def test_strided_views_of_a_fused_qkv() -> None:
    """q/k/v as column views of one [T, (H + 2 Hkv) * D] projection output, as the layers pass
    them, and an output view with its own row stride."""
    heads, kv_heads, d = 4, 2, 16
    batch = make_batch([12, 7], [30, 7], heads, kv_heads, d, num_pad_tokens=1)
    md = batch.metadata
    t = batch.q.shape[0]
    qkv = torch.cat([batch.q.reshape(t, -1), batch.k.reshape(t, -1), batch.v.reshape(t, -1)], dim=1)
    q = qkv[:, : heads * d].view(t, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(t, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d :].view(t, kv_heads, d)
    out_buf = torch.zeros(t, heads, 2 * d)
    out = out_buf[:, :, :d]
    written_k, written_v = batch.k_cache.clone(), batch.v_cache.clone()
    torch_write_kv_cache(batch.k, batch.v, written_k, written_v, md.slot_mapping)
    prefill_attention(
        q, k, v, batch.k_cache, batch.v_cache, md.query_start_loc, md.seq_lens, md.block_table, d**-0.5, out,
        config=SMALL,
    )  # fmt: skip
    ref = reference_attention(PagedBatch(batch.q, batch.k, batch.v, written_k, written_v, md), d**-0.5)
    torch.testing.assert_close(out[: md.num_tokens], ref, atol=1e-4, rtol=1e-4)
    assert bool((out_buf[:, :, d:] == 0).all())


def _run_fp8(
    q_lens: list[int],
    seq_lens: list[int],
    dtype: torch.dtype,
    config: PrefillTileConfig | None,
    head_dim: int = 32,
    num_kv_heads: int = 2,
    group: int = 2,
    device: str = "cpu",
    scales: tuple[float, float] = (0.5, 0.25),
) -> tuple[torch.Tensor, torch.Tensor, PagedBatch]:
    """An FP8 cache whose prefix slots hold FP8 values; the reference is the torch backend,
    which writes the new tokens through FP8 (as the KV write does before attention) and attends
    over the dequantized cache. The kernel gets that written cache and ``k``/``v`` of NaN, so
    reading the new tokens anywhere but from the cache shows."""
    batch = make_batch(
        q_lens, seq_lens, num_kv_heads * group, num_kv_heads, head_dim, dtype=dtype, device=device,
        num_pad_tokens=2,
    )  # fmt: skip
    md = batch.metadata
    k_cache = (batch.k_cache.float() * 4).to(FP8_DTYPE)
    v_cache = batch.v_cache.to(FP8_DTYPE)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    scale = head_dim**-0.5
    ref = TorchAttentionBackend().forward(batch.q, batch.k, batch.v, k_ref, v_ref, md, scale, True, *scales)
    out = prefill_attention(
        batch.q,
        torch.full_like(batch.k, float("nan")),
        torch.full_like(batch.v, float("nan")),
        k_ref,
        v_ref,
        md.query_start_loc,
        md.seq_lens,
        md.block_table,
        scale,
        torch.full_like(batch.q, 7.0),
        config=config,
        k_scale=scales[0],
        v_scale=scales[1],
    )
    return out, ref.float(), batch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_cache_matches_the_torch_backend(dtype: torch.dtype) -> None:
    """Prefix and the chunk's own K/V from an FP8 cache, K scale in the softmax, V scale on the
    output. In fp32 the tolerance is far below FP8's rounding (up to 6 %), so a scale left out
    fails, and a chunk read from ``k``/``v`` (NaN here) fails."""
    out, ref, batch = _run_fp8(Q_LENS, SEQ_LENS, dtype, SMALL)
    _check(out, ref, batch, 2, 2e-5 if dtype == torch.float32 else 2e-2)


def test_fp8_cache_beyond_the_e4m3_range_saturates() -> None:
    """A K scale of 1/500: most scaled keys pass ±448 and are stored saturated; the kernel
    reads those ±448 keys back (times the scale) as the reference does."""
    scales = (0.002, 1.0)
    out, ref, batch = _run_fp8([9, 20], [9, 36], torch.float32, SMALL, scales=scales)
    assert (batch.k.abs() / scales[0] > 448).float().mean() > 0.2
    _check(out, ref, batch, 2, 2e-5)


def test_default_tile_fits_wide_rows() -> None:
    assert default_prefill_tile(128, torch.bfloat16) == PrefillTileConfig(128, 64, 8, 3)
    assert default_prefill_tile(128, torch.float32) == PrefillTileConfig(64, 32, 4, 2)
    assert default_prefill_tile(256, torch.float16) == PrefillTileConfig(64, 32, 4, 2)
    fp8 = torch.float8_e4m3fn
    assert default_prefill_tile(128, torch.bfloat16, fp8) == PrefillTileConfig(128, 128, 8, 3)
    assert default_prefill_tile(128, torch.bfloat16, torch.bfloat16) == PrefillTileConfig(128, 64, 8, 3)
    assert default_prefill_tile(128, torch.float32, fp8) == PrefillTileConfig(64, 32, 4, 2)


def test_refuses_what_it_cannot_run() -> None:
    batch = make_batch([4], [4], 2, 1, 24)
    assert not prefill_supported(batch.q, batch.k_cache)
    fp16 = make_batch([4], [4], 2, 1, 16, dtype=torch.float16)
    assert prefill_supported(fp16.q, fp16.k_cache)
    assert prefill_supported(fp16.q, fp16.k_cache.to(torch.float8_e4m3fn))
    assert not prefill_supported(fp16.q, fp16.k_cache.to(torch.float32))
    md = batch.metadata
    args = (md.query_start_loc, md.seq_lens, md.block_table, 0.2)
    with pytest.raises(ValueError, match="unsupported"):
        prefill_attention(batch.q, batch.k, batch.v, batch.k_cache, batch.v_cache, *args)
    good = make_batch([4], [4], 4, 2, 16)
    with pytest.raises(ValueError, match="KV heads"):
        prefill_attention(good.q, good.q, good.q, good.k_cache, good.v_cache, *args)
    k8, v8 = good.k_cache.to(torch.float8_e4m3fn), good.v_cache.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="positive"):
        prefill_attention(good.q, good.k, good.v, k8, v8, *args, k_scale=0.0)
    with pytest.raises(ValueError, match="unsupported"):
        prefill_attention(good.q, good.k, good.v, k8, good.v_cache, *args)
    with pytest.raises(ValueError, match="block_n"):
        PrefillTileConfig(block_m=32, block_n=64)
    with pytest.raises(ValueError, match="power of 2"):
        PrefillTileConfig(block_m=48)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "config",
    [PrefillTileConfig(), PrefillTileConfig(block_n=128), PrefillTileConfig(block_m=64, num_warps=4)],
    ids=["m128n64", "m128n128", "m64n64"],
)
def test_gpu_qwen3_8b_shapes(config: PrefillTileConfig) -> None:
    """32 q heads, 8 KV heads, head_dim 128, bf16: a fresh 1000-token prompt, a chunk after
    a 3000-token prefix, a short chunk, a decode row (skipped)."""
    q_lens = [1000, 517, 1, 40]
    seq_lens = [1000, 3517, 2000, 2088]
    out, ref, batch = _run(q_lens, seq_lens, 4, config, torch.bfloat16, 128, 8, device="cuda")
    _check(out, ref, batch, 2, 2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_fp8_cache_qwen3_8b_shapes() -> None:
    """bf16 queries over an FP8 cache at Qwen3-8B's head shapes, the default tile."""
    q_lens = [1000, 517, 1, 40]
    seq_lens = [1000, 3517, 2000, 2088]
    out, ref, batch = _run_fp8(q_lens, seq_lens, torch.bfloat16, None, 128, 8, 4, device="cuda")
    _check(out, ref, batch, 2, 2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("dtype", "head_dim"), [(torch.float32, 128), (torch.bfloat16, 256)])
def test_gpu_default_tile_for_wide_rows(dtype: torch.dtype, head_dim: int) -> None:
    """fp32 at head_dim 128 and bf16 at 256 compile with the default (smaller) tile."""
    out, ref, batch = _run([300, 1, 77], [812, 40, 77], 4, None, dtype, head_dim, 2, device="cuda")
    _check(out, ref, batch, 2, 1e-4 if dtype == torch.float32 else 2e-2)
