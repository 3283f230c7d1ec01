"""FP8 kernels vs the torch reference of :mod:`surge.quant.fp8`: per-token activation
quantization (bit for bit) and the weight-only FP8 GEMM (per-channel and block-wise scales)."""

from __future__ import annotations

import pytest
import torch

from surge.kernels.fp8_gemm import Fp8GemmConfig, fp8_linear
from surge.kernels.fp8_quant import per_token_quant_fp8
from surge.quant.fp8 import (
    fp8_linear_reference,
    quantize_block,
    quantize_per_channel,
    quantize_per_token,
)
from surge.quant.fp8_linear import scaled_mm_linear

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("m,k", [(1, 64), (5, 200), (3, 4096), (2, 12288)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_token_quant_is_bit_exact(m: int, k: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(m, k, generator=gen) * 3).to(dtype)
    x[0, :3] = torch.tensor([1000.0, -0.001, 0.0])  # a wide row
    if m > 2:
        x[2] = 0  # all-zero row: the floor scale
    q, s = per_token_quant_fp8(x.to(DEVICE))
    q_ref, s_ref = quantize_per_token(x)
    assert s.shape == (m, 1) and q.dtype == torch.float8_e4m3fn
    assert torch.equal(s.cpu(), s_ref)
    assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("m,n,k", [(1, 48, 64), (7, 40, 96), (33, 64, 160)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fp8_linear_per_channel(m: int, n: int, k: int, dtype: torch.dtype, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w, s = quantize_per_channel(torch.randn(n, k, generator=gen) * 0.05)
    bias = (torch.randn(n, generator=gen) * 0.1).to(dtype) if with_bias else None
    ref = fp8_linear_reference(x, w, s, bias, quantize_input=False)
    dev = DEVICE
    out = fp8_linear(x.to(dev), w.to(dev), s.to(dev), None if bias is None else bias.to(dev))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.cpu(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize(
    "m,n,k,block", [(2, 64, 96, (32, 32)), (20, 50, 70, (16, 32)), (3, 40, 128, (16, 64))]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linear_block_scales(m: int, n: int, k: int, block: tuple[int, int], dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w_full = torch.randn(n, k, generator=gen) * 0.05
    w_full[: block[0], : block[1]] *= 20  # blocks of very different ranges
    w, s = quantize_block(w_full, block)
    ref = fp8_linear_reference(x, w, s, block_size=block, quantize_input=False)
    cfg = Fp8GemmConfig(16, 16, 16, 2, 4)  # several K steps per scale block
    for config in (None, cfg):
        out = fp8_linear(x.to(DEVICE), w.to(DEVICE), s.to(DEVICE), block_size=block, config=config)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out.cpu(), ref, atol=tol, rtol=tol)


def test_fp8_linear_rejects_bad_inputs() -> None:
    x = torch.randn(2, 32)
    w, s = quantize_per_channel(torch.randn(16, 32))
    with pytest.raises(ValueError, match="float8"):
        fp8_linear(x, w.float(), s)
    with pytest.raises(ValueError, match="per-channel"):
        fp8_linear(x, w, s[:3])
    with pytest.raises(ValueError, match="block scale"):
        fp8_linear(x, w, s, block_size=(16, 16))
    with pytest.raises(ValueError, match="divide"):
        wb, sb = quantize_block(torch.randn(16, 48), (16, 48))
        fp8_linear(torch.randn(2, 48), wb, sb, block_size=(16, 48), config=Fp8GemmConfig(16, 16, 32, 2, 4))


@pytest.mark.parametrize("m", [1, 6, 40])
def test_scaled_mm_linear_layouts(m: int) -> None:
    """Per-token quantization + ``torch._scaled_mm`` with ``a_scale [M, 1]``, ``b_scale [1, N]``
    and the column-major weight (torch's CPU ``_scaled_mm`` here, cuBLASLt on a GPU) equals the
    w8a8 reference."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(m, 64, generator=gen).to(torch.bfloat16)
    w, s = quantize_per_channel(torch.randn(48, 64, generator=gen) * 0.05)
    bias = (torch.randn(48, generator=gen) * 0.1).to(torch.bfloat16)
    ref = fp8_linear_reference(x, w, s, bias)
    out = scaled_mm_linear(x.to(DEVICE), w.to(DEVICE), s.view(1, -1).to(DEVICE), bias.to(DEVICE))
    assert out.dtype == torch.bfloat16 and out.shape == (m, 48)
    torch.testing.assert_close(out.cpu(), ref, atol=2e-2, rtol=2e-2)
