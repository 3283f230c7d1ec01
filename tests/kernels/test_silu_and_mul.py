"""SiLU-and-mul vs :class:`surge.layers.activation.SiluAndMul`."""

from __future__ import annotations

import pytest
import torch

from surge.kernels.silu_and_mul import ONE_PASS_MAX_ROWS, silu_and_mul, silu_and_mul_fp8
from surge.layers.activation import SiluAndMul
from surge.quant.fp8 import quantize_per_token

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("inter", [32, 100, 1500])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch(inter: int, dtype: torch.dtype) -> None:
    x = (4 * torch.randn(3, 2 * inter, generator=torch.Generator().manual_seed(0))).to(dtype)
    tol = {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 1.6e-2}
    torch.testing.assert_close(silu_and_mul(x), SiluAndMul()(x), **tol)


@pytest.mark.parametrize(
    "m,inter", [(1, 32), (3, 100), (2, 1500), (3, 5000), (3, 12288), (2, 17000), (ONE_PASS_MAX_ROWS + 1, 300)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_output_is_the_quantized_product(m: int, inter: int, dtype: torch.dtype) -> None:
    """``silu_and_mul_fp8`` = per-token quantization of ``silu_and_mul``'s output, bit for bit
    (one-pass rows up to ONE_PASS_MAX_COLS, a two-pass row wider than that, a step of more than
    ONE_PASS_MAX_ROWS rows on the two passes, an all-zero row: the floor scale)."""
    x = (4 * torch.randn(m, 2 * inter, generator=torch.Generator().manual_seed(2))).to(dtype)
    x[0, :2] = torch.tensor([30.0, 50.0])
    x[0, inter : inter + 2] = torch.tensor([20.0, 1e-3])
    if m > 2:
        x[2] = 0
    xd = x.to(DEVICE)
    q, scale = silu_and_mul_fp8(xd)
    q_ref, s_ref = quantize_per_token(silu_and_mul(xd).cpu())
    assert q.dtype == torch.float8_e4m3fn and q.shape == (m, inter) and scale.shape == (m, 1)
    assert torch.equal(scale.cpu(), s_ref)
    assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))
    if m > 2:
        assert scale[2].item() == pytest.approx(1e-12) and not q[2].float().any()


def test_out_buffer_and_errors() -> None:
    x = torch.randn(2, 64)
    out = torch.empty(2, 32)
    assert silu_and_mul(x, out) is out
    torch.testing.assert_close(out, SiluAndMul()(x))
    with pytest.raises(ValueError):
        silu_and_mul(torch.randn(2, 63))
    with pytest.raises(ValueError):
        silu_and_mul(x, torch.empty(2, 31))
    with pytest.raises(ValueError):
        silu_and_mul_fp8(torch.randn(2, 63))
    q, scale = silu_and_mul_fp8(torch.randn(0, 64))
    assert q.shape == (0, 32) and scale.shape == (0, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_qwen3_8b_mlp() -> None:
    x = torch.randn(512, 2 * 12288, device="cuda", dtype=torch.bfloat16)
    out = silu_and_mul(x)
    ref = SiluAndMul()(x)
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=1.6e-2)
    assert (out != ref).float().mean().item() < 0.01


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [1, 16, 64])
def test_gpu_fp8_output_qwen3_8b_mlp(m: int) -> None:
    """At Qwen3-8B's intermediate size: the fused FP8 output equals the FP8 quantization kernel
    and the torch reference applied to the bf16 output, bit for bit."""
    from surge.kernels.fp8_quant import per_token_quant_fp8

    x = 3 * torch.randn(m, 2 * 12288, device="cuda", dtype=torch.bfloat16)
    q, scale = silu_and_mul_fp8(x)
    out = silu_and_mul(x)
    for q_ref, s_ref in (per_token_quant_fp8(out), quantize_per_token(out)):
        assert torch.equal(scale, s_ref)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize(
    ("m", "inter", "launch"),
    [
        (ONE_PASS_MAX_ROWS + 1, 300, (512, False, 4)),
        (ONE_PASS_MAX_ROWS + 1, 1500, (2048, False, 8)),
        (ONE_PASS_MAX_ROWS + 1, 12288, (4096, False, 8)),
        (2, 17000, (4096, False, 8)),
        (ONE_PASS_MAX_ROWS, 300, (512, True, 4)),
        (1, 12288, (16384, True, 32)),
    ],
)
def test_fp8_two_pass_steps_launch_as_before_the_one_pass(
    m: int, inter: int, launch: tuple[int, bool, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``(BLOCK, ONE_PASS, num_warps)`` of a launch: a step on the two passes (more than
    ONE_PASS_MAX_ROWS rows, or a row wider than ONE_PASS_MAX_COLS) keeps the launch it had before
    the one pass existed (``BLOCK = min(4096, width)``, 8 warps from 2048 on, else 4), as
    :data:`ONE_PASS_MAX_ROWS` says; a one-pass step holds its whole row."""
    from surge.kernels import silu_and_mul as mod

    seen: list[tuple[int, bool, int]] = []

    class Recorder:
        def __getitem__(self, grid: object) -> object:
            def launch_(*args: object, **kw: object) -> None:
                seen.append((kw["BLOCK"], kw["ONE_PASS"], kw["num_warps"]))  # type: ignore[arg-type]

            return launch_

    monkeypatch.setattr(mod, "_silu_and_mul_fp8_kernel", Recorder())
    silu_and_mul_fp8(torch.zeros(m, 2 * inter))
    assert seen == [launch]
