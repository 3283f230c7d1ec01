"""Block-scaled FP8 layers' prefill steps on cuBLAS's block-scaled GEMM, without a GPU: which steps
and shapes take it (the start-up probe mocked, the cuBLAS call replaced by a torch model of it
that checks the operand layouts it is given), the padding and the bias, and the CPU emulation's
mirror (activations quantized per token and 128-column group exactly on those steps)."""

from __future__ import annotations

import logging

import pytest
import torch

from surge.layers.linear import ReplicatedLinear
from surge.quant import fp8_linear
from surge.quant.config import Fp8Config
from surge.quant.fp8 import dequantize, dequantize_per_token_group, fp8_linear_reference, quantize_block
from surge.quant.fp8_linear import SPLITK_MAX_M, Fp8LinearMethod
from tests.kernels.splitk_spy import record_splitk_configs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = (128, 128)


def _fake_cublas(calls: list[int]) -> object:
    """A torch model of :func:`surge.quant.fp8_linear.cublas_block_scaled_mm` that asserts the
    layouts cuBLAS needs (rows padded, scales outer-dim-major, weight scales ``[N/128, K/128]``)
    and records the padded row count of each call."""

    def fake(
        xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, out_dtype: torch.dtype
    ) -> torch.Tensor:
        m_pad, k = xq.shape
        n = w.shape[0]
        assert m_pad % fp8_linear.BLOCK_SCALED_MM_ROWS == 0 and xq.is_contiguous()
        assert xs.shape == (m_pad, k // 128) and xs.stride() == (1, m_pad)
        assert ws.shape == (n // 128, k // 128) and ws.is_contiguous() and w.is_contiguous()
        calls.append(m_pad)
        xf = dequantize_per_token_group(xq, xs)
        return (xf @ dequantize(w, ws, BLOCK).t()).to(out_dtype)

    return fake


def _group_mags(k: int) -> torch.Tensor:
    """``[K]``: one magnitude per 128-column group, ``1, 2**-5, 2**-10, 2**-15, 1, ...``: one scale
    per token leaves the smallest groups e4m3's subnormals or zero."""
    return (2.0 ** -(5 * (torch.arange(k // 128) % 4))).repeat_interleave(128)


def _layer(
    n: int,
    k: int,
    block: tuple[int, int],
    emulate: bool,
    seed: int,
    bias: bool = False,
    probed: dict[tuple[int, int, str], bool] | None = None,
) -> ReplicatedLinear:
    """A block-scaled FP8 layer whose weight columns are scaled by the inverse of :func:`_x`'s
    group magnitudes, so that every group of the input matters as much to the output."""
    gen = torch.Generator().manual_seed(seed)
    layer = ReplicatedLinear(k, n, bias=bias, dtype=torch.bfloat16).to("cpu" if emulate else DEVICE)
    layer.weight.data.copy_(torch.randn(n, k, generator=gen) * 0.05 / _group_mags(k))
    if bias:
        assert layer.bias is not None
        layer.bias.data.copy_(torch.randn(n, generator=gen) * 0.1)
    method = Fp8LinearMethod(Fp8Config("block", False, block), emulate=emulate)
    method.process_weights(layer, probed)
    layer.quant_method = method
    return layer


def _x(m: int, k: int, seed: int) -> torch.Tensor:
    """Activations whose 128-column groups differ in magnitude (:func:`_group_mags`), so that
    per-group and per-token scales give visibly different results."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=gen) * _group_mags(k)).to(torch.bfloat16)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def test_eligible_shapes() -> None:
    ok = fp8_linear.block_scaled_mm_eligible
    for n, k in ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (256, 512), (128, 512)):
        assert ok(n, k, BLOCK), (n, k)
    assert not ok(256, 256, BLOCK)  # K / 128 not a multiple of 4 (refused on the H200)
    assert not ok(192, 512, BLOCK)  # N not in 128s
    assert not ok(256, 512, (64, 64)) and not ok(256, 512, (128, 64)) and not ok(256, 512, (4, 4))


def test_prefill_steps_take_cublas_where_eligible_and_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    """An eligible block layer (N = 256, K = 512, 128 x 128 blocks) whose probe passed: steps of
    more than ``SPLITK_MAX_M`` bf16 tokens run the group quantization + the cuBLAS GEMM on rows
    padded to a multiple of 16 (then sliced back, bias added), smaller steps their unchanged
    path; the result equals the emulation's, which quantizes per 128-column group on exactly
    those steps."""
    probed: list[tuple[int, ...]] = []
    monkeypatch.setattr(
        fp8_linear, "block_scaled_mm_probe", lambda w, s: probed.append(tuple(w.shape)) or True
    )
    cublas: list[int] = []
    monkeypatch.setattr(fp8_linear, "cublas_block_scaled_mm", _fake_cublas(cublas))
    splitk = record_splitk_configs(monkeypatch)
    n, k = 256, 512
    cuda = _layer(n, k, BLOCK, emulate=False, seed=1, bias=True)
    emu = _layer(n, k, BLOCK, emulate=True, seed=1, bias=True)
    method, emu_method = cuda.quant_method, emu.quant_method
    assert isinstance(method, Fp8LinearMethod) and isinstance(emu_method, Fp8LinearMethod)
    assert method.block_scaled_mm and emu_method.block_scaled_mm and len(probed) == 1
    for m, pad in ((SPLITK_MAX_M + 1, 80), (100, 112), (128, 128)):
        assert method.block_scaled_mm_step(m) and emu_method.block_scaled_mm_step(m)
        assert not method.weight_only(m) and not method.wants_fp8_input(m, torch.bfloat16)
        cublas.clear()
        x = _x(m, k, seed=m)
        got = cuda(x.to(DEVICE)).cpu()
        assert cublas == [pad] and splitk == [] and got.shape == (m, n)
        q = cuda.weight.cpu(), cuda.weight_scale.cpu()
        assert cuda.bias is not None
        bias = cuda.bias.cpu()
        grouped = fp8_linear_reference(x, *q, bias, block_size=BLOCK, input_group=128)
        per_token = fp8_linear_reference(x, *q, bias, block_size=BLOCK)
        emulated = emu(x)
        assert torch.equal(emulated, grouped)
        # the same quantized operands: only the fp32 summation order and the fake's bf16 rounding
        # before the bias add differ (about one bf16 ulp of the largest output, <= 2**-7 of it);
        # per-token activation scales would be far off
        err, err_per_token = _rel_err(got, emulated), _rel_err(per_token, emulated)
        assert err <= 2**-6 and err_per_token > 0.05, (err, err_per_token)
    for m in (1, SPLITK_MAX_M):  # decode steps: as before (a weight-only kernel for this shape)
        assert not method.block_scaled_mm_step(m) and not emu_method.block_scaled_mm_step(m)
        cublas.clear()
        cuda(_x(m, k, seed=m).to(DEVICE))
        assert cublas == []
    x = _x(SPLITK_MAX_M + 1, k, seed=3).to(torch.float16)  # an fp16 model: never cuBLAS
    assert not method.block_scaled_mm_step(x.shape[0], x.dtype)
    assert not emu_method.block_scaled_mm_step(x.shape[0], x.dtype)


@pytest.mark.parametrize(
    "n,k,block,probe",
    [(256, 512, BLOCK, False), (256, 256, BLOCK, True), (256, 512, (64, 64), True)],
    ids=["probe-failed", "k-not-512s", "block-64"],
)
def test_other_layers_keep_the_triton_prefill_config(
    monkeypatch: pytest.MonkeyPatch, n: int, k: int, block: tuple[int, int], probe: bool
) -> None:
    """A failed probe, a ``K`` not in 512s or blocks other than 128 x 128: prefill steps keep
    :data:`BLOCK_PREFILL_TILES` (split-K, activations per token); the probe runs only for eligible
    shapes; the emulation follows the shape rule alone, never the probe."""
    probed: list[tuple[int, ...]] = []
    monkeypatch.setattr(
        fp8_linear, "block_scaled_mm_probe", lambda w, s: probed.append(tuple(w.shape)) or probe
    )
    cublas: list[int] = []
    monkeypatch.setattr(fp8_linear, "cublas_block_scaled_mm", _fake_cublas(cublas))
    splitk = record_splitk_configs(monkeypatch, block)
    cuda = _layer(n, k, block, emulate=False, seed=2)
    emu = _layer(n, k, block, emulate=True, seed=2)
    method, emu_method = cuda.quant_method, emu.quant_method
    assert isinstance(method, Fp8LinearMethod) and isinstance(emu_method, Fp8LinearMethod)
    eligible = fp8_linear.block_scaled_mm_eligible(n, k, block)
    assert len(probed) == int(eligible) and not method.block_scaled_mm
    assert emu_method.block_scaled_mm is eligible  # shape only
    m = SPLITK_MAX_M + 1
    x = _x(m, k, seed=4)
    got = cuda(x.to(DEVICE)).cpu()
    assert cublas == [] and splitk == [method.block_prefill]
    q = cuda.weight.cpu(), cuda.weight_scale.cpu()
    torch.testing.assert_close(got, fp8_linear_reference(x, *q, block_size=block), atol=2e-2, rtol=2e-2)
    want = fp8_linear_reference(x, *q, block_size=block, input_group=128 if eligible else None)
    assert torch.equal(emu(x), want)


def test_no_prefill_config_keeps_the_weight_only_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """``BLOCK_PREFILL_TILES = None`` (prefill on the weight-only kernel) turns the cuBLAS path off
    too: it replaces that config's steps only."""
    monkeypatch.setattr(fp8_linear, "BLOCK_PREFILL_TILES", None)
    monkeypatch.setattr(fp8_linear, "block_scaled_mm_probe", lambda w, s: True)
    for emulate in (False, True):
        layer = _layer(256, 512, BLOCK, emulate=emulate, seed=3)
        method = layer.quant_method
        assert isinstance(method, Fp8LinearMethod)
        assert not method.block_scaled_mm and method.weight_only(SPLITK_MAX_M + 1)


def test_probe_off_cuda_and_without_block_scaling(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    w, s = quantize_block(torch.randn(256, 512) * 0.02, BLOCK)
    with caplog.at_level(logging.INFO, logger="surge.quant"):
        if fp8_linear._scaled_mm_has_block_scaling():
            assert not fp8_linear.block_scaled_mm_probe(w, s)  # off CUDA: no GEMM, no log
            assert caplog.text == ""
        monkeypatch.setattr(fp8_linear, "_scaled_mm_has_block_scaling", lambda: False)
        assert not fp8_linear.block_scaled_mm_probe(w, s)  # a torch without it: said once
    assert "has no block-scaled F.scaled_mm" in caplog.text


def test_one_probe_per_shape_and_device_in_a_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """``process_weights`` with a shared ``probed`` dict (as :func:`surge.quant.loading.process_fp8`
    passes it) probes each eligible ``(N, K)`` once and gives its result to every layer of that
    shape; a failed shape keeps the Triton prefill config."""
    probed: list[tuple[int, ...]] = []
    monkeypatch.setattr(
        fp8_linear, "block_scaled_mm_probe", lambda w, s: probed.append(tuple(w.shape)) or w.shape[0] == 256
    )
    results: dict[tuple[int, int, str], bool] = {}
    layers = [
        _layer(n, 512, BLOCK, emulate=False, seed=i, probed=results)
        for i, n in enumerate((256, 384, 256, 384))
    ]
    assert probed == [(256, 512), (384, 512)]
    assert [layer.quant_method.block_scaled_mm for layer in layers] == [True, False, True, False]  # type: ignore[union-attr]


def test_an_a16_prefill_config_still_quantizes_the_cublas_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cuBLAS steps are w8a8 (per-group activations) whatever ``BLOCK_PREFILL_TILES`` holds:
    ``weight_only`` says so, so the emulation quantizes their input as the CUDA path does."""
    tiles = list(fp8_linear.BLOCK_PREFILL_TILES or ())
    tiles[6] = False  # a8 off
    monkeypatch.setattr(fp8_linear, "BLOCK_PREFILL_TILES", tuple(tiles))
    monkeypatch.setattr(fp8_linear, "block_scaled_mm_probe", lambda w, s: True)
    for emulate in (False, True):
        method = _layer(256, 512, BLOCK, emulate=emulate, seed=5).quant_method
        assert isinstance(method, Fp8LinearMethod)
        assert method.block_scaled_mm_step(SPLITK_MAX_M + 1) and not method.weight_only(SPLITK_MAX_M + 1)
    emu = _layer(256, 512, BLOCK, emulate=True, seed=5)
    x = _x(SPLITK_MAX_M + 1, 512, seed=6)
    q = emu.weight, emu.weight_scale
    assert torch.equal(emu(x), fp8_linear_reference(x, *q, block_size=BLOCK, input_group=128))


def test_block_scaled_mm_linear_refuses_bad_operands() -> None:
    w, s = quantize_block(torch.randn(256, 512) * 0.02, BLOCK)
    x = torch.randn(4, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="x must be 2-D bf16"):
        fp8_linear.block_scaled_mm_linear(x.float(), w, s, None)
    with pytest.raises(ValueError, match="weight must be float8_e4m3fn"):
        fp8_linear.block_scaled_mm_linear(x[:, :256].contiguous(), w, s, None)
    with pytest.raises(ValueError, match=r"weight_scale must be float32 \[2, 4\]"):
        fp8_linear.block_scaled_mm_linear(x, w, s[:1], None)
