"""Fused residual add + RMSNorm vs :class:`surge.layers.norm.RMSNorm`."""

from __future__ import annotations

import pytest
import torch

from surge.kernels.add_rmsnorm import add_rmsnorm
from surge.layers.norm import RMSNorm


def _norm(hidden: int, dtype: torch.dtype, device: str = "cpu") -> RMSNorm:
    norm = RMSNorm(hidden, 1e-5, dtype).to(device)
    norm.weight.data = (
        (1 + 0.3 * torch.randn(hidden, generator=torch.Generator().manual_seed(5))).to(dtype).to(device)
    )
    return norm


@pytest.mark.parametrize("hidden", [64, 200])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_matches_torch(hidden: int, dtype: torch.dtype, with_residual: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(5, hidden, generator=gen)).to(dtype)
    residual = torch.randn(5, hidden, generator=gen).to(dtype) if with_residual else None
    norm = _norm(hidden, dtype)
    out, res_out = add_rmsnorm(x, norm.weight, norm.eps, residual)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 1.6e-2}
    if residual is None:
        torch.testing.assert_close(out, norm(x), **tol)
        assert res_out is None
    else:
        ref_out, ref_res = norm(x, residual)
        torch.testing.assert_close(out, ref_out, **tol)
        assert torch.equal(res_out, ref_res)


def test_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError):
        add_rmsnorm(torch.randn(3, 8), torch.ones(7), 1e-6)
    with pytest.raises(ValueError):
        add_rmsnorm(torch.randn(3, 8), torch.ones(8), 1e-6, torch.randn(3, 9))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_qwen3_8b_hidden() -> None:
    x = torch.randn(1000, 4096, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    norm = _norm(4096, torch.bfloat16, "cuda")
    out, res_out = add_rmsnorm(x, norm.weight, norm.eps, residual)
    ref_out, ref_res = norm(x, residual)
    torch.testing.assert_close(out, ref_out, atol=2e-2, rtol=1.6e-2)
    assert torch.equal(res_out, ref_res)
    assert (out != ref_out).float().mean().item() < 0.01
