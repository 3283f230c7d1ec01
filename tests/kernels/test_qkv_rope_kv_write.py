"""The qkv split-K reduce fused into the q/k norm, rotary and K/V write
(:func:`surge.kernels.qkv_rope_kv_write.qkv_rope_kv_write`) against the unfused pair (the
reduce, then :func:`surge.kernels.kv_write.fused_qk_norm_rope_kv_write`): q, k, v and the cache
bytes equal. Under the Triton interpreter on CPU; the ``gpu`` tests at Qwen3-8B's shapes on a
CUDA GPU (the reduce there is the GEMM's own reduce kernel)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from surge.kernels.fp8_gemm_splitk import Fp8SplitKConfig, fp8_linear_splitk, fp8_linear_splitk_partials
from surge.kernels.fp8_quant import per_token_quant_fp8
from surge.kernels.kv_write import fused_qk_norm_rope_kv_write
from surge.kernels.qkv_rope_kv_write import qkv_rope_kv_write
from surge.layers.rotary import RotaryEmbedding
from surge.quant.fp8 import SplitKPartials, quantize_block, quantize_per_channel, splitk_reduce_reference

BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn
BLOCK = 16


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == FP8 else t


def _caches(
    t: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: str, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Caches with random content, ``[T]`` distinct slots (row 1 padding) and positions."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = t // BLOCK + 3
    shape = (num_blocks, BLOCK, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * BLOCK, generator=gen)[:t]
    if t > 1:
        slots[1] = -1
    positions = torch.randint(0, 500, (t,), generator=gen)
    return k_cache.to(device), v_cache.to(device), slots.to(device), positions.to(device)


def _norm_weights(head_dim: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    qn = (1 + 0.4 * torch.randn(head_dim, generator=gen)).to(BF16).to(device)
    kn = (1 + 0.4 * torch.randn(head_dim, generator=gen)).to(BF16).to(device)
    return qn, kn


def _compare(
    p: SplitKPartials,
    reduced: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    cache_dtype: torch.dtype,
    with_norm: bool,
    seed: int,
    heads_per_program: int | None = None,
) -> None:
    """Run the fused kernel on ``p`` and the unfused K/V write on ``reduced`` (the reduce's
    ``[T, N]`` output), each on its own copy of the caches, and assert equal bits."""
    device = str(p.partials.device)
    t = p.partials.shape[1]
    k_cache, v_cache, slots, positions = _caches(t, num_kv_heads, head_dim, cache_dtype, device, seed)
    rope = RotaryEmbedding(head_dim, 512, base=1_000_000.0).to(device)
    qn, kn = _norm_weights(head_dim, device) if with_norm else (None, None)
    ks, vs = (0.05, 0.03) if cache_dtype == FP8 else (1.0, 1.0)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    want = reduced.clone()
    q, k, v = want.split([q_size, kv_size, kv_size], dim=-1)
    kc_want, vc_want = k_cache.clone(), v_cache.clone()
    fused_qk_norm_rope_kv_write(
        q.view(t, num_heads, head_dim),
        k.view(t, num_kv_heads, head_dim),
        v.view(t, num_kv_heads, head_dim),
        positions,
        rope.cos_cache,
        rope.sin_cache,
        kc_want,
        vc_want,
        slots,
        qn,
        kn,
        1e-6,
        ks,
        vs,
    )
    extra = {} if heads_per_program is None else {"heads_per_program": heads_per_program}
    got = qkv_rope_kv_write(
        p,
        num_heads,
        num_kv_heads,
        head_dim,
        positions,
        rope.cos_cache,
        rope.sin_cache,
        k_cache,
        v_cache,
        slots,
        qn,
        kn,
        1e-6,
        ks,
        vs,
        **extra,
    )
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got, want)
    assert torch.equal(_bits(k_cache), _bits(kc_want))
    assert torch.equal(_bits(v_cache), _bits(vc_want))


def _partials(
    split_k: int, t: int, n: int, a8: bool, with_bias: bool, seed: int, device: str = "cpu"
) -> SplitKPartials:
    """Hand-made partials of a GEMM's magnitude, with per-channel scales (and token scales,
    bias)."""
    gen = torch.Generator().manual_seed(seed)
    parts = torch.randn(split_k, t, n, generator=gen) * 40
    ws = torch.rand(n, generator=gen) * 0.01 + 0.001
    xs = (torch.rand(t, 1, generator=gen) * 0.05 + 0.01) if a8 else None
    bias = (torch.randn(n, generator=gen) * 0.5).to(BF16) if with_bias else None
    return SplitKPartials(
        parts.to(device),
        ws.to(device),
        None if xs is None else xs.to(device),
        None if bias is None else bias.to(device),
        BF16,
    )


@pytest.mark.parametrize("cache_dtype", [BF16, FP8])
@pytest.mark.parametrize("with_norm", [False, True])
@pytest.mark.parametrize(
    "split_k,a8,with_bias", [(2, False, False), (4, True, False), (4, False, True), (2, True, True)]
)
def test_matches_reduce_then_kv_write(
    cache_dtype: torch.dtype, with_norm: bool, split_k: int, a8: bool, with_bias: bool
) -> None:
    """bf16 or FP8 cache, Qwen3's q/k norm or none, w8a8 token scales or w8a16, a bias or none,
    S = 2 and 4; 6 query heads over programs of 4 (a masked last program), a padding slot."""
    num_heads, num_kv_heads, head_dim = 6, 2, 64
    n = (num_heads + 2 * num_kv_heads) * head_dim
    p = _partials(split_k, 5, n, a8, with_bias, seed=split_k * 10 + a8)
    _compare(p, splitk_reduce_reference(p), num_heads, num_kv_heads, head_dim, cache_dtype, with_norm, seed=3)


@pytest.mark.parametrize("heads_per_program", [1, 2, 8])
def test_other_shapes(heads_per_program: int) -> None:
    """A head size whose half is not a power of two (96), 3 KV heads, one token, and query
    heads spread over 1, 2 or 8 per program."""
    num_heads, num_kv_heads, head_dim = 6, 3, 96
    n = (num_heads + 2 * num_kv_heads) * head_dim
    for t in (1, 3):
        p = _partials(3, t, n, True, True, seed=t)
        _compare(
            p, splitk_reduce_reference(p), num_heads, num_kv_heads, head_dim, BF16, True, 4, heads_per_program
        )


@pytest.mark.parametrize("a8", [False, True])
def test_matches_the_gemm_and_its_reduce_kernel(a8: bool) -> None:
    """Partials from the split-K GEMM itself (with a bias) against that GEMM with its reduce
    kernel, then the K/V write."""
    num_heads, num_kv_heads, head_dim, hidden, t = 4, 2, 32, 128, 3
    n = (num_heads + 2 * num_kv_heads) * head_dim
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(t, hidden, generator=gen).to(BF16)
    w, s = quantize_per_channel(torch.randn(n, hidden, generator=gen) * 0.05)
    bias = (torch.randn(n, generator=gen) * 0.3).to(BF16)
    cfg = Fp8SplitKConfig(16, 32, 32, 2, 2, 4, a8=a8, reduce="kernel")
    p = fp8_linear_splitk_partials(x, w, s, bias, config=cfg)
    reduced = fp8_linear_splitk(x, w, s, bias, config=cfg)
    _compare(p, reduced, num_heads, num_kv_heads, head_dim, FP8, True, seed=7)


@pytest.mark.parametrize("a8", [False, True])
def test_block_scaled_gemm(a8: bool) -> None:
    """An FP8 checkpoint's block-scaled qkv (Qwen3-8B-FP8's layout: the scales applied per ``K``
    step, no weight scale in the partials), on activations the producer quantized (w8a8) or
    bf16 ones (w8a16)."""
    num_heads, num_kv_heads, head_dim, hidden, t = 4, 2, 32, 128, 3
    n = (num_heads + 2 * num_kv_heads) * head_dim
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(t, hidden, generator=gen).to(BF16)
    block = (32, 32)
    wb, sb = quantize_block(torch.randn(n, hidden, generator=gen) * 0.05, block)
    cfg = Fp8SplitKConfig(16, 32, 32, 4, 2, 4, a8=a8, reduce="kernel")
    reduced = fp8_linear_splitk(x, wb, sb, config=cfg, block_size=block)
    if a8:
        xq, xs = per_token_quant_fp8(x)
        p = fp8_linear_splitk_partials(xq, wb, sb, config=cfg, block_size=block, x_scale=xs, out_dtype=BF16)
    else:
        p = fp8_linear_splitk_partials(x, wb, sb, config=cfg, block_size=block)
    assert p.weight_scale is None and (p.token_scale is not None) == a8
    _compare(p, reduced, num_heads, num_kv_heads, head_dim, BF16, True, seed=2)


def test_rejections() -> None:
    num_heads, num_kv_heads, head_dim = 4, 2, 32
    n = (num_heads + 2 * num_kv_heads) * head_dim
    p = _partials(2, 3, n, False, False, seed=1)
    k_cache, v_cache, slots, positions = _caches(3, num_kv_heads, head_dim, BF16, "cpu", 1)
    rope = RotaryEmbedding(head_dim, 512)
    qn, kn = _norm_weights(head_dim, "cpu")

    def run(pp: SplitKPartials = p, heads: int = num_heads, **kw: object) -> torch.Tensor:
        args: dict[str, object] = {
            "positions": positions,
            "cos_cache": rope.cos_cache,
            "sin_cache": rope.sin_cache,
            "k_cache": k_cache,
            "v_cache": v_cache,
            "slot_mapping": slots,
        }
        args.update(kw)
        return qkv_rope_kv_write(pp, heads, num_kv_heads, head_dim, **args)  # type: ignore[arg-type]

    with pytest.raises(ValueError, match="partials"):
        run(replace(p, partials=p.partials[:1]))
    with pytest.raises(ValueError, match="columns"):
        run(heads=3)
    with pytest.raises(ValueError, match="both"):
        run(q_norm_weight=qn)
    with pytest.raises(ValueError, match="cache"):
        run(k_cache=k_cache[:, :, :1])
    with pytest.raises(ValueError, match="cache dtype"):
        run(k_cache=k_cache.float(), v_cache=v_cache.float())
    with pytest.raises(ValueError, match="rows"):
        run(slot_mapping=slots[:2])
    with pytest.raises(ValueError, match="bias"):
        run(replace(p, bias=torch.zeros(n - 1, dtype=BF16)))
    with pytest.raises(ValueError, match="positive"):
        run(k_cache=k_cache.to(FP8), v_cache=v_cache.to(FP8), k_scale=0.0)
    with pytest.raises(ValueError, match="power of two"):
        run(heads_per_program=3)
    empty = replace(p, partials=p.partials[:, :0].contiguous())
    assert run(empty).shape == (0, n)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "t,config",
    [
        (16, (16, 64, 128, 4, 4, 4, True)),
        (32, (32, 64, 128, 4, 4, 4, True)),
        (64, (64, 32, 128, 2, 4, 4, True)),
    ],
)
@pytest.mark.parametrize("cache_dtype", [BF16, FP8])
def test_gpu_qwen3_8b_bit_identical(t: int, config: tuple[int, ...], cache_dtype: torch.dtype) -> None:
    """Qwen3-8B's qkv (32 query heads, 8 KV heads, head size 128, hidden 4096) with the
    measured split-K configs of its decode buckets 16, 32 and 64 (``SPLITK_MEASURED``, w8a8):
    the GEMM's partials through the fused kernel against the GEMM with its reduce kernel, then
    the K/V write, bit for bit."""
    num_heads, num_kv_heads, head_dim, hidden = 32, 8, 128, 4096
    n = (num_heads + 2 * num_kv_heads) * head_dim
    gen = torch.Generator().manual_seed(t)
    x = torch.randn(t, hidden, generator=gen).to(BF16).cuda()
    w, s = quantize_per_channel((torch.randn(n, hidden, generator=gen) * 0.02).cuda())
    cfg = Fp8SplitKConfig(*config, reduce="kernel")  # type: ignore[arg-type]
    p = fp8_linear_splitk_partials(x, w, s, config=cfg)
    reduced = fp8_linear_splitk(x, w, s, config=cfg)
    _compare(p, reduced, num_heads, num_kv_heads, head_dim, cache_dtype, True, seed=t)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("a8", [False, True])
def test_gpu_with_bias(a8: bool) -> None:
    """A qkv bias (Qwen2) and no q/k norm at Qwen3-8B's shapes, w8a16 and w8a8, 32 tokens."""
    num_heads, num_kv_heads, head_dim, hidden, t = 32, 8, 128, 4096, 32
    n = (num_heads + 2 * num_kv_heads) * head_dim
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(t, hidden, generator=gen).to(BF16).cuda()
    w, s = quantize_per_channel((torch.randn(n, hidden, generator=gen) * 0.02).cuda())
    bias = (torch.randn(n, generator=gen) * 0.3).to(BF16).cuda()
    cfg = Fp8SplitKConfig(32, 64, 128, 4, 4, 4, a8=a8, reduce="kernel")
    p = fp8_linear_splitk_partials(x, w, s, bias, config=cfg)
    reduced = fp8_linear_splitk(x, w, s, bias, config=cfg)
    _compare(p, reduced, num_heads, num_kv_heads, head_dim, BF16, False, seed=t)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("t", [16, 64])
def test_gpu_block_scaled_qwen3_8b(t: int) -> None:
    """Qwen3-8B-FP8's block-scaled qkv (128 x 128 scale blocks, w8a8 on the producer's FP8
    activations), FP8 cache, bit for bit."""
    num_heads, num_kv_heads, head_dim, hidden = 32, 8, 128, 4096
    n = (num_heads + 2 * num_kv_heads) * head_dim
    gen = torch.Generator().manual_seed(t + 1)
    x = torch.randn(t, hidden, generator=gen).to(BF16).cuda()
    block = (128, 128)
    wb, sb = (u.cuda() for u in quantize_block(torch.randn(n, hidden, generator=gen) * 0.02, block))
    cfg = Fp8SplitKConfig(32, 64, 128, 4, 4, 4, a8=True, reduce="kernel")
    xq, xs = per_token_quant_fp8(x)
    p = fp8_linear_splitk_partials(xq, wb, sb, config=cfg, block_size=block, x_scale=xs, out_dtype=BF16)
    reduced = fp8_linear_splitk(xq, wb, sb, config=cfg, block_size=block, x_scale=xs, out_dtype=BF16)
    _compare(p, reduced, num_heads, num_kv_heads, head_dim, FP8, True, seed=t)
