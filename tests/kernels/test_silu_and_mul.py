"""SiLU-and-mul vs :class:`surge.layers.activation.SiluAndMul`."""

from __future__ import annotations

import pytest
import torch

from surge.kernels.silu_and_mul import silu_and_mul
from surge.layers.activation import SiluAndMul


@pytest.mark.parametrize("inter", [32, 100, 1500])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch(inter: int, dtype: torch.dtype) -> None:
    x = (4 * torch.randn(3, 2 * inter, generator=torch.Generator().manual_seed(0))).to(dtype)
    tol = {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 1.6e-2}
    torch.testing.assert_close(silu_and_mul(x), SiluAndMul()(x), **tol)


def test_out_buffer_and_errors() -> None:
    x = torch.randn(2, 64)
    out = torch.empty(2, 32)
    assert silu_and_mul(x, out) is out
    torch.testing.assert_close(out, SiluAndMul()(x))
    with pytest.raises(ValueError):
        silu_and_mul(torch.randn(2, 63))
    with pytest.raises(ValueError):
        silu_and_mul(x, torch.empty(2, 31))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_qwen3_8b_mlp() -> None:
    x = torch.randn(512, 2 * 12288, device="cuda", dtype=torch.bfloat16)
    out = silu_and_mul(x)
    ref = SiluAndMul()(x)
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=1.6e-2)
    assert (out != ref).float().mean().item() < 0.01
