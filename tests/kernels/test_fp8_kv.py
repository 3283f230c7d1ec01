"""FP8 KV cache: the Triton K/V write (plain and fused) and paged attention (mixed grid,
decode grid, split-KV) against the torch reference backend on float8_e4m3fn caches."""

from __future__ import annotations

import pytest
import torch

from surge.kernels.kv_write import fused_qk_norm_rope_kv_write, write_kv_cache
from surge.kernels.paged_attention import AttentionTileConfig, default_tile_config, paged_attention
from surge.layers.rotary import RotaryEmbedding
from surge.layers.torch_attention import TorchAttentionBackend
from surge.layers.torch_attention import write_kv_cache as torch_write_kv_cache
from surge.quant.fp8 import FP8_DTYPE, quantize_kv
from tests.kernels.attn_utils import make_batch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL_TILE = AttentionTileConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)


def _fp8_caches(num_blocks: int, block_size: int, hkv: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    shape = (num_blocks, block_size, hkv, d)
    return (
        torch.randn(shape, generator=gen).to(FP8_DTYPE).to(DEVICE),
        torch.randn(shape, generator=gen).to(FP8_DTYPE).to(DEVICE),
    )


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.uint8)


@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.5, 0.03125)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_write_quantizes_like_torch(scales: tuple[float, float], dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    k = (torch.randn(9, 2, 64, generator=gen) * 40).to(dtype).to(DEVICE)  # some beyond ±448 * scale
    v = torch.randn(9, 2, 64, generator=gen).to(dtype).to(DEVICE)
    slots = torch.randperm(4 * 16, generator=gen)[:9]
    slots[2] = -1
    slots = slots.to(DEVICE)
    k_cache, v_cache = _fp8_caches(4, 16, 2, 64)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    torch_write_kv_cache(k, v, k_ref, v_ref, slots, *scales)
    write_kv_cache(k, v, k_cache, v_cache, slots, *scales)
    assert torch.equal(_bits(k_cache), _bits(k_ref)) and torch.equal(_bits(v_cache), _bits(v_ref))
    written = k_ref.view(-1, 2, 64)[slots[slots >= 0].long()].cpu()
    assert torch.equal(_bits(written), _bits(quantize_kv(k[slots >= 0].cpu(), scales[0])))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_norm_rope_write_fp8(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    t, hkv, group, d = 6, 2, 2, 64
    q = torch.randn(t, hkv * group, d, generator=gen).to(dtype).to(DEVICE)
    k = torch.randn(t, hkv, d, generator=gen).to(dtype).to(DEVICE)
    v = torch.randn(t, hkv, d, generator=gen).to(dtype).to(DEVICE)
    positions = torch.randint(0, 100, (t,), generator=gen).to(DEVICE)
    slots = torch.randperm(3 * 16, generator=gen)[:t].to(DEVICE)
    rope = RotaryEmbedding(d, 128, 10000.0).to(DEVICE)
    k_cache, v_cache = _fp8_caches(3, 16, hkv, d)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    q_ref, k_rot = rope(positions, q.clone(), k.clone())
    torch_write_kv_cache(k_rot, v, k_ref, v_ref, slots, 0.25, 2.0)
    fused_qk_norm_rope_kv_write(
        q, k, v, positions, rope.cos_cache, rope.sin_cache, k_cache, v_cache, slots, k_scale=0.25, v_scale=2.0
    )
    assert torch.equal(_bits(k_cache), _bits(k_ref)) and torch.equal(_bits(v_cache), _bits(v_ref))
    torch.testing.assert_close(q, q_ref)


def test_write_rejects_non_positive_scale() -> None:
    k = torch.randn(2, 1, 16, device=DEVICE)
    k_cache, v_cache = _fp8_caches(1, 16, 1, 16)
    with pytest.raises(ValueError, match="positive"):
        write_kv_cache(k, k, k_cache, v_cache, torch.tensor([0, 1], device=DEVICE), 0.0, 1.0)


@pytest.mark.parametrize(
    "q_lens,seq_lens,num_splits",
    [
        ([5, 1, 1, 7, 1], [21, 37, 1, 7, 16], 1),  # mixed prefill + decode grid
        ([1, 1, 1, 1], [5, 40, 100, 17], 1),  # decode grid
        ([1, 1, 1, 1], [5, 40, 100, 17], 4),  # decode grid, split-KV
        ([5, 1, 7], [21, 37, 7], 2),  # mixed grid, split-KV
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_fp8_matches_torch_backend(
    q_lens: list[int], seq_lens: list[int], num_splits: int, dtype: torch.dtype
) -> None:
    group, hkv, d = 2, 2, 64
    batch = make_batch(q_lens, seq_lens, hkv * group, hkv, d, dtype=dtype, device=DEVICE, num_pad_tokens=1)
    md = batch.metadata
    k_cache = (batch.k_cache.float() * 4).to(FP8_DTYPE)  # garbage in unused slots, as in serving
    v_cache = batch.v_cache.to(FP8_DTYPE)
    k_scale, v_scale = 0.5, 0.25
    torch_write_kv_cache(batch.k, batch.v, k_cache, v_cache, md.slot_mapping, k_scale, v_scale)
    scale = d**-0.5
    ref = TorchAttentionBackend().forward(
        batch.q, batch.k, batch.v, k_cache, v_cache, md, scale, False, k_scale, v_scale
    )
    out = paged_attention(
        batch.q,
        k_cache,
        v_cache,
        md.query_start_loc,
        md.seq_lens,
        md.block_table,
        scale,
        num_splits=num_splits,
        max_query_len=md.max_query_len,
        config=SMALL_TILE,
        min_kv_per_split=16,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    n = md.num_tokens
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out[:n].float().cpu(), ref[:n].float().cpu(), atol=tol, rtol=tol)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_fp8_decode_takes_its_own_default_tile(num_splits: int) -> None:
    """A decode step over an FP8 cache runs 128-position KV steps by default (64 for bf16):
    contexts across several such steps, split and unsplit, match the torch backend."""
    assert default_tile_config(4, 128, 1, torch.bfloat16, FP8_DTYPE).block_n == 128
    assert default_tile_config(4, 128, 1, torch.bfloat16).block_n == 64
    assert default_tile_config(4, 128, 7, torch.bfloat16, FP8_DTYPE).block_n == 64  # prefill tiles unchanged
    group, hkv, d = 2, 2, 64
    q_lens, seq_lens = [1, 1, 1, 1], [5, 300, 129, 700]
    batch = make_batch(
        q_lens, seq_lens, hkv * group, hkv, d, dtype=torch.bfloat16, device=DEVICE, num_pad_tokens=1
    )
    md = batch.metadata
    k_cache, v_cache = batch.k_cache.to(FP8_DTYPE), batch.v_cache.to(FP8_DTYPE)
    torch_write_kv_cache(batch.k, batch.v, k_cache, v_cache, md.slot_mapping, 0.5, 0.25)
    ref = TorchAttentionBackend().forward(
        batch.q, batch.k, batch.v, k_cache, v_cache, md, d**-0.5, False, 0.5, 0.25
    )
    out = paged_attention(
        batch.q,
        k_cache,
        v_cache,
        md.query_start_loc,
        md.seq_lens,
        md.block_table,
        d**-0.5,
        num_splits=num_splits,
        max_query_len=1,
        min_kv_per_split=128,
        k_scale=0.5,
        v_scale=0.25,
    )
    n = md.num_tokens
    torch.testing.assert_close(out[:n].float().cpu(), ref[:n].float().cpu(), atol=2e-2, rtol=2e-2)


def test_torch_backend_fp8_is_dequantized_bf16_attention() -> None:
    """The reference FP8 path equals attention over the dequantized values."""
    batch = make_batch([3, 1], [9, 20], 4, 2, 32, dtype=torch.float32)
    md = batch.metadata
    k8, v8 = batch.k_cache.to(FP8_DTYPE), batch.v_cache.to(FP8_DTYPE)
    backend = TorchAttentionBackend()
    out = backend.forward(batch.q, batch.k, batch.v, k8, v8, md, 0.2, True, 0.5, 2.0)
    k_deq, v_deq = k8.float() * 0.5, v8.float() * 2.0
    expect = backend.forward(batch.q, batch.k, batch.v, k_deq, v_deq, md, 0.2, False)
    torch.testing.assert_close(out[: md.num_tokens], expect[: md.num_tokens])


_PTX_SCRIPT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from surge.kernels.kv_write import _FP_FUSION, _kv_write_kernel as k

ptr = {"slot_mapping_ptr": "*i64", "positions_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
       "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv"}
const = dict(NUM_HEADS=32, HEADS_PAD=32, NUM_KV_HEADS=8, KV_HEADS_PAD=8, HALF=64, HALF_PAD=64,
             BLOCK_SIZE=16, ROPE=True, NORM=False, WRITE_CACHE=True, FP8_KV=True, FP8_MAX=448.0)
sig = {}
for n in k.arg_names:
    if n in const:
        sig[n] = "constexpr"
    elif n.endswith("_ptr"):
        sig[n] = ptr.get(n, "*bf16")
    else:
        sig[n] = "fp32" if n in ("eps", "k_inv_scale", "v_inv_scale") else "i32"
src = ASTSource(fn=k, signature=sig, constexprs={(k.arg_names.index(n),): v for n, v in const.items()})
print(triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "enable_fp_fusion": _FP_FUSION}).asm["ptx"])
"""


def test_kv_write_rope_compiles_without_fma_contraction() -> None:
    """The H200 run found FP8 K bytes one rounding off torch's: the GPU compiler had contracted
    rotary's bf16 ``x1*cos - x2*sin`` into ``fma.rn.bf16`` (one rounding where torch rounds the
    product first). Compiles the kernel for sm90 (no GPU needed) and checks the PTX rounds each
    product (``mul.rn.bf16``) and has no bf16 FMA, with the launch options the launcher uses."""
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "-c", _PTX_SCRIPT], capture_output=True, text=True, env=env, timeout=300
    )
    if res.returncode != 0:
        pytest.skip(f"cannot compile for sm90 here: {res.stderr.strip().splitlines()[-1:]}")
    assert "mul.rn.bf16" in res.stdout
    assert "fma.rn.bf16" not in res.stdout


def test_fp8_cache_query_beyond_float16_stays_finite() -> None:
    """Over an FP8 cache a 16-bit query is cast to float16 for the dots: a bf16 query element
    beyond float16's range (70,000 here) saturates instead of turning its rows to NaN, in the
    decode and the prefill kernel; the other tokens' rows still match the torch backend."""
    from surge.kernels.prefill_attention import PrefillTileConfig, prefill_attention

    for q_lens, seq_lens, decode in (([1, 1], [20, 9], True), ([20], [30], False)):
        b = make_batch(q_lens, seq_lens, 4, 2, 32, dtype=torch.bfloat16, num_pad_tokens=0)
        md = b.metadata
        kc, vc = b.k_cache.to(FP8_DTYPE), b.v_cache.to(FP8_DTYPE)
        k = b.k * 0.01
        torch_write_kv_cache(k, b.v, kc, vc, md.slot_mapping, 0.01, 1.0)
        q = b.q.clone()
        q[0, :, 0] = 7.0e4
        ref = TorchAttentionBackend().forward(q, k, b.v, kc, vc, md, 32**-0.5, False, 0.01, 1.0)
        if decode:
            out = paged_attention(
                q, kc, vc, md.query_start_loc, md.seq_lens, md.block_table, 32**-0.5,
                max_query_len=1, k_scale=0.01, v_scale=1.0,
            )  # fmt: skip
        else:
            out = prefill_attention(
                q, k, b.v, kc, vc, md.query_start_loc, md.seq_lens, md.block_table, 32**-0.5,
                config=PrefillTileConfig(16, 16, 4, 1), k_scale=0.01, v_scale=1.0,
            )  # fmt: skip
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out[1:].float(), ref[1:].float(), atol=2e-2, rtol=2e-2)
