"""Per-token FP8 activations handed from their producer (RMSNorm, SiLU-and-mul) to a w8a8 FP8
linear layer: the split-K GEMM on pre-quantized input, which steps the producers quantize for
(:meth:`Fp8LinearMethod.wants_fp8_input`), and that the consumer's output is unchanged, bit
for bit, against the unfused path. On the GPU when present, else under the Triton interpreter
(the CUDA ``_scaled_mm`` path only on a GPU)."""

from __future__ import annotations

from typing import Literal

import pytest
import torch

from surge.kernels.fp8_gemm_splitk import Fp8SplitKConfig, fp8_linear_splitk
from surge.kernels.fp8_quant import per_token_quant_fp8
from surge.layers.activation import SiluAndMul
from surge.layers.linear import ReplicatedLinear, RowParallelLinear, _LinearBase
from surge.layers.norm import RMSNorm
from surge.quant import fp8_linear
from surge.quant.config import Fp8Config
from surge.quant.fp8 import Fp8Activations, fp8_linear_reference, quantize_per_channel

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N, K = 64, 128


@pytest.mark.parametrize("split_k,reduce", [(1, "kernel"), (2, "kernel"), (2, "inline")])
def test_splitk_takes_prequantized_activations(split_k: int, reduce: Literal["kernel", "inline"]) -> None:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, K, generator=gen).to(torch.bfloat16).to(DEVICE)
    w, s = (t.to(DEVICE) for t in quantize_per_channel(torch.randn(N, K, generator=gen) * 0.05))
    bias = (torch.randn(N, generator=gen) * 0.1).to(torch.bfloat16).to(DEVICE)
    cfg = Fp8SplitKConfig(16, 32, 32, split_k, 2, 4, a8=True, reduce=reduce)
    xq, xs = per_token_quant_fp8(x)
    got = fp8_linear_splitk(xq, w, s, bias, config=cfg, x_scale=xs, out_dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, fp8_linear_splitk(x, w, s, bias, config=cfg))
    with pytest.raises(ValueError, match="w8a8"):
        fp8_linear_splitk(
            xq, w, s, config=Fp8SplitKConfig(16, 32, 32, 1, 2, 4), x_scale=xs, out_dtype=x.dtype
        )
    with pytest.raises(ValueError, match="x_scale"):
        fp8_linear_splitk(xq, w, s, config=cfg, x_scale=xs[:2], out_dtype=x.dtype)
    with pytest.raises(ValueError, match="out_dtype"):
        fp8_linear_splitk(xq, w, s, config=cfg, x_scale=xs, out_dtype=torch.float32)
    with pytest.raises(ValueError, match="bias"):
        fp8_linear_splitk(xq, w, s, bias.float(), config=cfg, x_scale=xs, out_dtype=x.dtype)


def _fp8_layer(layer: _LinearBase, *, emulate: bool, scheme: str = "channel") -> _LinearBase:
    gen = torch.Generator().manual_seed(6)
    layer.weight.data.copy_(torch.randn(*layer.weight.shape, generator=gen) * 0.05)
    layer = layer.to(DEVICE if not emulate else "cpu")
    block = (32, 32) if scheme == "block" else None
    method = fp8_linear.Fp8LinearMethod(Fp8Config(scheme, False, block), emulate=emulate)  # type: ignore[arg-type]
    method.process_weights(layer)
    layer.quant_method = method
    return layer


def _norm(hidden: int, device: str) -> RMSNorm:
    norm = RMSNorm(hidden, 1e-6, torch.bfloat16)
    norm.weight.data.copy_(1 + 0.3 * torch.randn(hidden, generator=torch.Generator().manual_seed(7)))
    return norm.to(device)


def test_wants_fp8_input_follows_the_chosen_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only w8a8 steps (split-K ``a8`` buckets, ``_scaled_mm`` above the table) of a per-channel
    bf16 layer want FP8 input: not w8a16 buckets, the Triton decode kernel, other dtypes or an
    unquantized layer; a block-scaled layer's w8a8 split-K decode steps do, its prefill steps
    (above the table) and shapes without a split-K table do not; under emulation, exactly where
    the layer quantizes."""
    monkeypatch.setattr(
        fp8_linear,
        "SPLITK_MEASURED",
        {(N, K): {1: (16, 32, 32, 2, 2, 4, True), 4: (16, 32, 32, 2, 2, 4, False), 64: None}},
    )
    layer = _fp8_layer(ReplicatedLinear(K, N, dtype=torch.bfloat16), emulate=False)
    bf16 = torch.bfloat16
    assert [layer.wants_fp8_input(m, bf16) for m in (1, 2, 3, 4, 5, 64, 65, 300)] == [
        True, False, False, False, True, True, True, True,
    ]  # fmt: skip
    assert not layer.wants_fp8_input(1, torch.float16)
    assert not layer.wants_fp8_input(1, torch.float32)
    method = layer.quant_method
    assert isinstance(method, fp8_linear.Fp8LinearMethod)
    method.splitk_by_m, method.triton_for_decode = (), True
    assert not layer.wants_fp8_input(16, bf16) and layer.wants_fp8_input(17, bf16)
    assert not ReplicatedLinear(K, N, dtype=bf16).wants_fp8_input(1, bf16)
    block = _fp8_layer(ReplicatedLinear(K, N, dtype=bf16), emulate=False, scheme="block")
    assert not block.wants_fp8_input(1, bf16) and not block.wants_fp8_input(300, bf16)  # no table
    monkeypatch.setattr(fp8_linear, "SPLITK_BLOCK_FASTER", frozenset({(N, K)}))
    monkeypatch.setattr(fp8_linear, "BLOCK_SPLITK_A8_FROM", 2)
    for emulate in (False, True):
        block = _fp8_layer(ReplicatedLinear(K, N, dtype=bf16), emulate=emulate, scheme="block")
        assert [block.wants_fp8_input(m, bf16) for m in (1, 2, 64, 65, 300)] == [
            False,
            True,
            True,
            False,
            False,
        ]
        assert not block.wants_fp8_input(2, torch.float32)
    emulated = _fp8_layer(ReplicatedLinear(K, N, dtype=bf16), emulate=True)
    assert emulated.wants_fp8_input(1, bf16) and emulated.wants_fp8_input(1, torch.float32)


@pytest.mark.parametrize("emulate", [False, True])
@pytest.mark.parametrize("m", [1, 3, 70])
def test_norm_and_activation_feed_their_w8a8_layer(
    monkeypatch: pytest.MonkeyPatch, emulate: bool, m: int
) -> None:
    """RMSNorm (with and without a residual) -> linear and SiLU-and-mul -> row-parallel linear:
    where the linear runs w8a8 the producer returns :class:`Fp8Activations` and the linear's
    output equals, bit for bit, the unfused path's; elsewhere the producer's output is its
    plain tensor."""
    if m > fp8_linear.SPLITK_MAX_M and DEVICE == "cpu" and not emulate:
        pytest.skip("torch._scaled_mm needs a GPU")
    monkeypatch.setattr(
        fp8_linear,
        "SPLITK_MEASURED",
        {(N, K): {1: (16, 32, 32, 2, 2, 4, True), 4: (16, 32, 32, 2, 2, 4, False), 64: None}},
    )
    dev = "cpu" if emulate else DEVICE
    gen = torch.Generator().manual_seed(8)
    qkv = _fp8_layer(ReplicatedLinear(K, N, dtype=torch.bfloat16), emulate=emulate)
    down = _fp8_layer(RowParallelLinear(K, N, dtype=torch.bfloat16), emulate=emulate)
    norm, plain_norm = _norm(K, dev), _norm(K, dev)
    norm.feeds(qkv)
    act = SiluAndMul()
    act.feeds(down)
    assert dict(norm.named_modules()).keys() == {""} and dict(act.named_modules()).keys() == {""}
    x = (3 * torch.randn(m, K, generator=gen)).to(torch.bfloat16).to(dev)
    residual = torch.randn(m, K, generator=gen).to(torch.bfloat16).to(dev)
    gate_up = (3 * torch.randn(m, 2 * K, generator=gen)).to(torch.bfloat16).to(dev)
    wants = qkv.wants_fp8_input(m, torch.bfloat16)
    assert wants == (emulate or m != 3)

    fused = norm(x)
    assert isinstance(fused, Fp8Activations) == wants
    assert torch.equal(qkv(fused), qkv(plain_norm(x)))
    fused_r, res = norm(x, residual)
    want_out, want_res = plain_norm(x, residual)
    assert isinstance(fused_r, Fp8Activations) == wants and torch.equal(res, want_res)
    assert torch.equal(qkv(fused_r), qkv(want_out))
    if emulate and wants:
        assert isinstance(fused_r, Fp8Activations)
        ref = fp8_linear_reference(want_out, qkv.weight, qkv.weight_scale)
        assert torch.equal(qkv(fused_r), ref)

    fused_a = act(gate_up)
    assert isinstance(fused_a, Fp8Activations) == wants
    assert torch.equal(down(fused_a), down(SiluAndMul()(gate_up)))
    if not wants:
        with pytest.raises(ValueError, match="FP8 activations"):
            down(Fp8Activations(*per_token_quant_fp8(gate_up[:, :K].contiguous()), torch.bfloat16))
