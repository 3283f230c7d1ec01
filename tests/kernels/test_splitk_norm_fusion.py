"""The split-K FP8 GEMM's reduction fused into the next residual-add + RMSNorm: the fused
kernel (:func:`add_rmsnorm_partials`, ``_fp8``) against the unfused pair (split-K GEMM with its
reduce kernel, then :func:`add_rmsnorm` / ``add_rmsnorm_fp8``) bit for bit; which layers hand
:class:`SplitKPartials` to which norm; and tiny FP8 models (Qwen3, Qwen2, Llama with an MLP
bias) whose logits are identical with the fusion on and off. On the GPU when present, else
under the Triton interpreter (the norm then reduces the partials in torch)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from surge.config import ModelConfig
from surge.kernels.add_rmsnorm import (
    add_rmsnorm,
    add_rmsnorm_fp8,
    add_rmsnorm_partials,
    add_rmsnorm_partials_fp8,
)
from surge.kernels.fp8_gemm_splitk import Fp8SplitKConfig, fp8_linear_splitk, fp8_linear_splitk_partials
from surge.kernels.fp8_quant import per_token_quant_fp8
from surge.layers.linear import RowParallelLinear, _LinearBase
from surge.layers.norm import RMSNorm
from surge.model.loader import load_model
from surge.quant import fp8_linear
from surge.quant.config import Fp8Config
from surge.quant.fp8 import (
    Fp8Activations,
    SplitKPartials,
    quantize_block,
    quantize_per_channel,
    splitk_reduce_reference,
)
from tests.quant.utils import sequence_logits

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BF16 = torch.bfloat16


def _problem(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = (2 * torch.randn(m, k, generator=gen)).to(BF16)
    w, s = quantize_per_channel(torch.randn(n, k, generator=gen) * 0.05)
    bias = (torch.randn(n, generator=gen) * 0.3).to(BF16)
    residual = torch.randn(m, n, generator=gen).to(BF16)
    norm_w = (1 + 0.3 * torch.randn(n, generator=gen)).to(BF16)
    return tuple(t.to(DEVICE) for t in (x, w, s, bias, residual, norm_w))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _assert_same(got: tuple[torch.Tensor | None, ...], want: tuple[torch.Tensor | None, ...]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None
        else:
            assert g is not None and g.dtype == w.dtype and g.shape == w.shape
            assert torch.equal(_bits(g), _bits(w))


@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("a8", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("fp8_out", [False, True])
def test_fused_reduce_add_rmsnorm_is_bit_identical(
    m: int, a8: bool, with_bias: bool, with_residual: bool, fp8_out: bool
) -> None:
    """w8a16 and w8a8 (the latter also on pre-quantized activations), with and without bias
    and residual, bf16 or FP8 norm output; ``N = 80`` (a masked row tail), ragged ``K`` slices."""
    n, k = 80, 160
    x, w, s, bias, residual, norm_w = _problem(m, n, k, seed=m * 7 + a8)
    b = bias if with_bias else None
    r = residual if with_residual else None
    cfg = Fp8SplitKConfig(16, 32, 32, 3, 2, 4, a8=a8, reduce="kernel")
    y = fp8_linear_splitk(x, w, s, b, config=cfg)
    p = fp8_linear_splitk_partials(x, w, s, b, config=cfg)
    assert p.partials.shape == (3, m, n) and p.dtype == BF16
    assert (p.token_scale is not None) == a8 and p.weight_scale is s and p.bias is b
    if DEVICE == "cpu":  # the torch reduction (the CPU norm's path) equals the reduce kernel
        assert torch.equal(splitk_reduce_reference(p), y)
    inputs = [p]
    if a8:
        xq, xs = per_token_quant_fp8(x)
        inputs.append(fp8_linear_splitk_partials(xq, w, s, b, config=cfg, x_scale=xs, out_dtype=BF16))
    for part in inputs:
        if fp8_out:
            _assert_same(add_rmsnorm_partials_fp8(part, norm_w, 1e-6, r), add_rmsnorm_fp8(y, norm_w, 1e-6, r))
        else:
            _assert_same(add_rmsnorm_partials(part, norm_w, 1e-6, r), add_rmsnorm(y, norm_w, 1e-6, r))


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("a8", [False, True])
def test_fused_reduce_with_block_scales(m: int, a8: bool) -> None:
    """Block-scaled weights (the scales applied per ``K`` step), w8a16 or w8a8 (also on
    pre-quantized activations): no weight scale in the partials, the token scales with w8a8,
    and the fused norm (bf16 or FP8 output) equals the unfused pair."""
    n, k, block = 64, 128, (32, 32)
    x, _, _, bias, residual, norm_w = _problem(m, n, k, seed=11)
    wb, sb = (t.to(DEVICE) for t in quantize_block(torch.randn(n, k) * 0.05, block))
    cfg = Fp8SplitKConfig(16, 32, 32, 2, 2, 4, a8=a8, reduce="kernel")
    y = fp8_linear_splitk(x, wb, sb, bias, config=cfg, block_size=block)
    inputs = [fp8_linear_splitk_partials(x, wb, sb, bias, config=cfg, block_size=block)]
    if a8:
        xq, xs = per_token_quant_fp8(x)
        inputs.append(
            fp8_linear_splitk_partials(
                xq, wb, sb, bias, config=cfg, block_size=block, x_scale=xs, out_dtype=BF16
            )
        )
    for p in inputs:
        assert p.weight_scale is None and (p.token_scale is not None) == a8
        _assert_same(add_rmsnorm_partials(p, norm_w, 1e-6, residual), add_rmsnorm(y, norm_w, 1e-6, residual))
        _assert_same(
            add_rmsnorm_partials_fp8(p, norm_w, 1e-6, residual), add_rmsnorm_fp8(y, norm_w, 1e-6, residual)
        )


def test_partials_rejections() -> None:
    x, w, s, _, residual, norm_w = _problem(2, 64, 64, seed=3)
    for cfg in (Fp8SplitKConfig(16, 32, 32, 1, 2, 4), Fp8SplitKConfig(16, 32, 32, 2, 2, 4, reduce="inline")):
        with pytest.raises(ValueError, match="reduce='kernel'"):
            fp8_linear_splitk_partials(x, w, s, config=cfg)
    p = fp8_linear_splitk_partials(x, w, s, config=Fp8SplitKConfig(16, 32, 32, 2, 2, 4))
    with pytest.raises(ValueError, match="residual"):
        add_rmsnorm_partials(p, norm_w, 1e-6, residual[:1])
    with pytest.raises(ValueError, match="residual"):
        add_rmsnorm_partials(p, norm_w, 1e-6, residual.float())
    with pytest.raises(ValueError, match="weight"):
        add_rmsnorm_partials_fp8(p, norm_w[:32], 1e-6)
    with pytest.raises(ValueError, match="partials"):
        add_rmsnorm_partials(replace(p, partials=p.partials[:1]), norm_w, 1e-6)
    empty = fp8_linear_splitk_partials(x[:0], w, s, config=Fp8SplitKConfig(16, 32, 32, 2, 2, 4, a8=True))
    out, res = add_rmsnorm_partials(empty, norm_w, 1e-6, residual[:0])
    assert out.shape == (0, 64) and res is not None and res.shape == (0, 64)


def _fp8_row_layer(
    k: int, n: int, by_m: tuple[Fp8SplitKConfig | None, ...], tp_size: int = 1
) -> RowParallelLinear:
    layer = RowParallelLinear(k * tp_size, n, bias=True, dtype=BF16, tp_rank=0, tp_size=tp_size)
    gen = torch.Generator().manual_seed(9)
    layer.weight.data.copy_(torch.randn(n, k, generator=gen) * 0.05)
    assert layer.bias is not None
    layer.bias.data.copy_(torch.randn(n, generator=gen) * 0.3)
    layer = layer.to(DEVICE)
    method = fp8_linear.Fp8LinearMethod(Fp8Config("channel", False), emulate=False)
    method.process_weights(layer)
    method.splitk_by_m = by_m
    layer.quant_method = method
    return layer


def test_only_the_declared_norm_receives_partials() -> None:
    """A wired row-parallel FP8 layer returns :class:`SplitKPartials` exactly on its
    ``split_k > 1`` ``"kernel"`` steps (bf16 or pre-quantized input); the norm's output and new
    residual equal the unfused path's bit for bit; an unwired layer, a TP layer, an inline or
    one-launch step and an unquantized layer all return tensors."""
    n, k = 64, 128
    kernel_a16 = Fp8SplitKConfig(16, 32, 32, 2, 2, 4, reduce="kernel")
    kernel_a8 = Fp8SplitKConfig(16, 32, 32, 4, 2, 4, a8=True, reduce="kernel")
    inline = Fp8SplitKConfig(16, 32, 32, 2, 2, 4, reduce="inline")
    one = Fp8SplitKConfig(16, 32, 32, 1, 2, 4)
    by_m = (kernel_a16, kernel_a16, kernel_a8, inline, one, None)
    wired, plain = _fp8_row_layer(k, n, by_m), _fp8_row_layer(k, n, by_m)
    norm, plain_norm = RMSNorm(n, 1e-6, BF16).to(DEVICE), RMSNorm(n, 1e-6, BF16).to(DEVICE)
    norm.sums_partials_of(wired)
    assert wired.partials_consumer is norm and plain.partials_consumer is None
    assert dict(wired.named_modules()).keys() == {""}
    gen = torch.Generator().manual_seed(2)
    for m, defers in ((1, True), (2, True), (3, False), (4, False), (5, False), (6, False)):
        x = torch.randn(m, k, generator=gen).to(BF16).to(DEVICE)
        residual = torch.randn(m, n, generator=gen).to(BF16).to(DEVICE)
        want = plain(x)
        got = wired(x)
        assert isinstance(got, SplitKPartials) == defers, m
        if m == 6:  # above the table: _scaled_mm, a GPU-only path
            continue
        assert torch.equal(norm(got, residual)[0], plain_norm(want, residual)[0])
        assert torch.equal(norm(got, residual)[1], plain_norm(want, residual)[1])
        if m == 2:  # w8a8 on activations quantized by the producer
            act = Fp8Activations(*per_token_quant_fp8(x), BF16)
            got8 = wired(act)
            assert isinstance(got8, SplitKPartials) and got8.token_scale is act.scale
            assert torch.equal(norm(got8, residual)[0], plain_norm(plain(act), residual)[0])
    tp = RowParallelLinear(2 * k, n, dtype=BF16, tp_rank=0, tp_size=2)
    RMSNorm(n).sums_partials_of(tp)
    assert tp.partials_consumer is None
    unquantized = RowParallelLinear(k, n, dtype=BF16).to(DEVICE)
    RMSNorm(n).sums_partials_of(unquantized)
    assert isinstance(unquantized(torch.randn(1, k).to(BF16).to(DEVICE)), torch.Tensor)


def test_emulation_never_defers() -> None:
    layer = RowParallelLinear(128, 64, dtype=BF16)
    method = fp8_linear.Fp8LinearMethod(Fp8Config("channel", False), emulate=True)
    method.process_weights(layer)
    method.splitk_by_m = (Fp8SplitKConfig(16, 32, 32, 2, 2, 4),) * 4
    layer.quant_method = method
    RMSNorm(64).sums_partials_of(layer)
    assert isinstance(layer(torch.randn(2, 128).to(BF16)), torch.Tensor)


_TINY: dict[str, dict[str, Any]] = {
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 32},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"},
    "llama_mlp_bias": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "mlp_bias": True},
}


def _tiny_model(tmp_path: Path, kind: str) -> tuple[torch.nn.Module, ModelConfig]:
    config = {
        **_TINY[kind],
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    mc = ModelConfig.from_pretrained(
        tmp_path, dtype="bfloat16", load_format="dummy", max_model_len=256, quantization="fp8"
    )
    model = load_model(mc, DEVICE)
    gen = torch.Generator().manual_seed(1)
    for name, param in model.named_parameters():  # biases and norm weights away from 0 / 1
        if name.endswith("bias") or "norm" in name:
            param.data.add_((torch.randn(param.shape, generator=gen) * 0.2).to(param.dtype).to(DEVICE))
    return model, mc


@pytest.mark.parametrize("kind", list(_TINY))
def test_tiny_fp8_model_logits_identical_with_fusion_on_and_off(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every FP8 linear runs the split-K GEMM (w8a16 and w8a8 configs, the Triton kernels;
    ``"kernel"`` reductions for o_proj and down_proj); the same model with its norms wired
    (the fusion: every o_proj and down_proj output reaches its norm as partials) and unwired
    gives identical logits."""
    if DEVICE != "cpu":
        pytest.skip(
            "CPU form (torch attention on CPU tensors); tests/kernels/test_splitk_norm_fusion_gpu.py on a GPU"
        )
    model, mc = _tiny_model(tmp_path, kind)
    fused_calls: list[int] = []
    original = RMSNorm._forward_partials

    def counting(self: RMSNorm, p: SplitKPartials, residual: torch.Tensor | None) -> Any:
        fused_calls.append(p.partials.shape[1])
        return original(self, p, residual)

    monkeypatch.setattr(RMSNorm, "_forward_partials", counting)
    rows = []
    for layer in model.modules():
        if not isinstance(layer, _LinearBase):
            continue
        method = layer.quant_method
        assert isinstance(method, fp8_linear.Fp8LinearMethod)
        method.emulate = False  # the CUDA path's Triton kernels, here under the interpreter
        split = 3 if isinstance(layer, RowParallelLinear) else 2
        method.splitk_by_m = tuple(
            Fp8SplitKConfig(16, 32, 32, split, 2, 4, a8=m % 2 == 0, reduce="kernel")
            for m in range(fp8_linear.SPLITK_MAX_M + 1)
        )
        if isinstance(layer, RowParallelLinear):
            rows.append(layer)
    assert len(rows) == 2 * mc.num_hidden_layers and all(r.partials_consumer is not None for r in rows)
    consumers = [r.partials_consumer for r in rows]
    ids = [(13 * i + 5) % mc.vocab_size for i in range(7)]
    for n in (3, 4, 7):
        fused_calls.clear()
        on = sequence_logits(model, mc, ids[:n])
        assert fused_calls == [n] * (2 * mc.num_hidden_layers)
        for r in rows:
            r.partials_consumer = None
        fused_calls.clear()
        off = sequence_logits(model, mc, ids[:n])
        assert fused_calls == []
        for r, c in zip(rows, consumers, strict=True):
            assert c is not None
            c.sums_partials_of(r)
        assert torch.isfinite(on).all()
        assert torch.equal(on, off), (kind, n)
