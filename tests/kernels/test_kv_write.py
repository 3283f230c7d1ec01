"""K/V cache write (plain and fused with q/k RMSNorm + rotary) vs the torch layers."""

from __future__ import annotations

import pytest
import torch

from surge.kernels.kv_write import fused_qk_norm_rope_kv_write, write_kv_cache
from surge.layers.norm import RMSNorm
from surge.layers.rotary import RotaryEmbedding
from surge.layers.torch_attention import write_kv_cache as torch_write_kv_cache


def _inputs(
    num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: str = "cpu"
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(1)
    block_size = 16
    num_blocks = num_tokens // block_size + 2
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype).to(device)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype).to(device)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype).to(device)
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype).to(device)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype).to(device)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[1] = -1  # padding token
    positions = torch.randint(0, 500, (num_tokens,), generator=gen)
    return q, k, v, k_cache, v_cache, slots.to(device), positions.to(device)


@pytest.mark.parametrize("num_kv_heads,head_dim", [(2, 64), (1, 128), (3, 96)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_write_matches_torch(num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
    _, k, v, k_cache, v_cache, slots, _ = _inputs(7, 4, num_kv_heads, head_dim, dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    torch_write_kv_cache(k, v, k_ref, v_ref, slots)
    write_kv_cache(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def _reference(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    rope: RotaryEmbedding,
    q_norm: RMSNorm | None,
    k_norm: RMSNorm | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if q_norm is not None and k_norm is not None:
        q, k = q_norm(q), k_norm(k)
    return rope(positions, q, k)


@pytest.mark.parametrize("with_norm", [False, True])
@pytest.mark.parametrize("group,head_dim", [(1, 64), (2, 128), (4, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_norm_rope_write(with_norm: bool, group: int, head_dim: int, dtype: torch.dtype) -> None:
    num_kv_heads = 2
    q, k, v, k_cache, v_cache, slots, positions = _inputs(
        6, num_kv_heads * group, num_kv_heads, head_dim, dtype
    )
    rope = RotaryEmbedding(head_dim, 512, base=1_000_000.0)
    q_norm = k_norm = None
    if with_norm:
        q_norm, k_norm = RMSNorm(head_dim, 1e-6, dtype), RMSNorm(head_dim, 1e-6, dtype)
        gen = torch.Generator().manual_seed(3)
        q_norm.weight.data = (1 + 0.5 * torch.randn(head_dim, generator=gen)).to(dtype)
        k_norm.weight.data = (1 + 0.5 * torch.randn(head_dim, generator=gen)).to(dtype)
    q_ref, k_ref = _reference(q, k, positions, rope, q_norm, k_norm)
    kc_ref, vc_ref = k_cache.clone(), v_cache.clone()
    torch_write_kv_cache(k_ref, v, kc_ref, vc_ref, slots)

    fused_qk_norm_rope_kv_write(
        q,
        k,
        v,
        positions,
        rope.cos_cache,
        rope.sin_cache,
        k_cache,
        v_cache,
        slots,
        q_norm.weight if q_norm is not None else None,
        k_norm.weight if k_norm is not None else None,
        eps=1e-6,
    )
    # Same roundings as the torch layers; only the variance's summation order differs.
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1.6e-2, "rtol": 1.6e-2}
    torch.testing.assert_close(q, q_ref, **tol)
    torch.testing.assert_close(k, k_ref, **tol)
    torch.testing.assert_close(k_cache, kc_ref, **tol)
    assert torch.equal(v_cache, vc_ref)
    if not with_norm:  # rotary alone has no reduction: bit-exact
        assert torch.equal(q, q_ref) and torch.equal(k, k_ref)


def test_fused_without_cache_only_rotates() -> None:
    q, k, v, *_, positions = _inputs(5, 4, 2, 64, torch.float32)
    rope = RotaryEmbedding(64, 512)
    q_ref, k_ref = rope(positions, q, k)
    fused_qk_norm_rope_kv_write(q, k, v, positions, rope.cos_cache, rope.sin_cache)
    torch.testing.assert_close(q, q_ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(k, k_ref, atol=1e-6, rtol=1e-6)


def test_rejects_inconsistent_arguments() -> None:
    q, k, v, k_cache, v_cache, slots, positions = _inputs(3, 4, 2, 64, torch.float32)
    rope = RotaryEmbedding(64, 512)
    w = torch.ones(64)
    with pytest.raises(ValueError):
        fused_qk_norm_rope_kv_write(q, k, v, positions, rope.cos_cache, rope.sin_cache, q_norm_weight=w)
    with pytest.raises(ValueError):
        fused_qk_norm_rope_kv_write(q, k, v, positions, rope.cos_cache, rope.sin_cache, k_cache, v_cache)
    with pytest.raises(ValueError):
        write_kv_cache(k, v, k_cache[:, :, :1], v_cache, slots)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_qwen3_8b_fused() -> None:
    q, k, v, k_cache, v_cache, slots, positions = _inputs(300, 32, 8, 128, torch.bfloat16, "cuda")
    rope = RotaryEmbedding(128, 40960, base=1_000_000.0).cuda()
    q_norm, k_norm = RMSNorm(128, 1e-6, torch.bfloat16).cuda(), RMSNorm(128, 1e-6, torch.bfloat16).cuda()
    q_norm.weight.data.uniform_(0.5, 1.5)
    k_norm.weight.data.uniform_(0.5, 1.5)
    q_ref, k_ref = _reference(q, k, positions, rope, q_norm, k_norm)
    kc_ref, vc_ref = k_cache.clone(), v_cache.clone()
    torch_write_kv_cache(k_ref, v, kc_ref, vc_ref, slots)
    fused_qk_norm_rope_kv_write(
        q,
        k,
        v,
        positions,
        rope.cos_cache,
        rope.sin_cache,
        k_cache,
        v_cache,
        slots,
        q_norm.weight,
        k_norm.weight,
    )
    torch.testing.assert_close(q, q_ref, atol=1.6e-2, rtol=1.6e-2)
    torch.testing.assert_close(k_cache, kc_ref, atol=1.6e-2, rtol=1.6e-2)
    assert torch.equal(v_cache, vc_ref)
    # Differences come only from rounding flips of the norm (the GPU's approximate rsqrt moves
    # some bf16 roundings by one ulp; measured on the H200: 14 % of elements), never more.
    assert (q != q_ref).float().mean().item() < 0.25
