"""The split-K FP8 GEMM's gated (SwiGLU) epilogue, ``fp8_linear_splitk(..., gated=True)``:
bit for bit the plain GEMM of the merged ``[gate; up]`` weight followed by
:func:`surge.kernels.silu_and_mul.silu_and_mul`, in both operand modes, with pointer and TMA
weight loads, bias, ragged column tiles, ragged ``K`` and pre-quantized input; what it
refuses; and ``GatedMLP`` taking it on exactly the steps it may. Runs under Triton's CPU
interpreter, and on a GPU at Qwen3-8B's MLP shape."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from surge.kernels.fp8_gemm_splitk import Fp8SplitKConfig, fp8_linear_splitk, tma_supported
from surge.kernels.fp8_quant import per_token_quant_fp8
from surge.kernels.silu_and_mul import silu_and_mul
from surge.layers.mlp import GatedMLP
from surge.quant import fp8_linear
from surge.quant.config import Fp8Config
from surge.quant.fp8 import Fp8Activations, quantize_block, quantize_per_channel

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _problem(
    m: int, n_half: int, k: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w, s = quantize_per_channel(torch.randn(2 * n_half, k, generator=gen) * 0.3)
    bias = (torch.randn(2 * n_half, generator=gen) * 0.5).to(torch.bfloat16)
    return x.to(DEVICE), w.to(DEVICE), s.to(DEVICE), bias.to(DEVICE)


@pytest.mark.parametrize("m,n_half,k", [(1, 64, 128), (5, 40, 96), (16, 48, 256), (20, 32, 64)])
@pytest.mark.parametrize("a8", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("tma", [False, True])
def test_gated_equals_gemm_then_silu_and_mul(
    m: int, n_half: int, k: int, a8: bool, with_bias: bool, tma: bool
) -> None:
    if tma and DEVICE == "cuda" and not tma_supported(DEVICE):
        pytest.skip("TMA needs sm90+")
    x, w, s, bias = _problem(m, n_half, k, seed=m + n_half + k)
    b = bias if with_bias else None
    block_k = 64 if k % 64 == 0 else 32
    cfg = Fp8SplitKConfig(16, 32, block_k, 1, 2, 4, a8=a8, tma=tma)
    got = fp8_linear_splitk(x, w, s, b, config=cfg, gated=True)
    want = silu_and_mul(fp8_linear_splitk(x, w, s, b, config=cfg))
    assert got.shape == (m, n_half) and got.dtype == torch.bfloat16
    assert torch.equal(got, want)


def test_gated_takes_pre_quantized_activations() -> None:
    x, w, s, _ = _problem(3, 64, 128, seed=7)
    q, xs = per_token_quant_fp8(x)
    cfg = Fp8SplitKConfig(16, 32, 64, 1, 2, 4, a8=True)
    got = fp8_linear_splitk(q, w, s, config=cfg, x_scale=xs, out_dtype=torch.bfloat16, gated=True)
    want = silu_and_mul(fp8_linear_splitk(q, w, s, config=cfg, x_scale=xs, out_dtype=torch.bfloat16))
    assert torch.equal(got, want)
    assert not torch.equal(
        got, silu_and_mul(fp8_linear_splitk(x, w, s, config=Fp8SplitKConfig(16, 32, 64, 1, 2, 4)))
    )


def test_gated_refuses_what_it_cannot_fuse() -> None:
    x, w, s, _ = _problem(2, 32, 128, seed=3)
    with pytest.raises(ValueError, match="split_k == 1"):
        fp8_linear_splitk(x, w, s, config=Fp8SplitKConfig(16, 32, 64, 2, 2, 4), gated=True)
    with pytest.raises(ValueError, match="even N"):
        fp8_linear_splitk(x, w[:63], s[:63], config=Fp8SplitKConfig(16, 32, 64, 1, 2, 4), gated=True)
    wb, sb = quantize_block(w.float().cpu(), (32, 64))
    with pytest.raises(ValueError, match="per-channel"):
        fp8_linear_splitk(
            x,
            wb.to(DEVICE),
            sb.to(DEVICE),
            config=Fp8SplitKConfig(16, 32, 64, 1, 2, 4),
            block_size=(32, 64),
            gated=True,
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("a8,tma", [(True, True), (True, False), (False, False)])
def test_gpu_gated_qwen3_8b_mlp(m: int, a8: bool, tma: bool) -> None:
    """Qwen3-8B's gate_up (2 x 12288 rows, K 4096) with the engine's M <= 16 tiles."""
    if tma and not tma_supported("cuda"):
        pytest.skip("TMA needs sm90+")
    x, w, s, _ = _problem(m, 12288, 4096, seed=m)
    cfg = Fp8SplitKConfig(16, 32, 256, 1, 4, 4, a8=a8, tma=tma)
    got = fp8_linear_splitk(x, w, s, config=cfg, gated=True)
    want = silu_and_mul(fp8_linear_splitk(x, w, s, config=cfg))
    assert torch.equal(got, want)


def _fp8_mlp(hidden: int, inter: int, gate_up_by_m: tuple, down_by_m: tuple) -> GatedMLP:
    """A GatedMLP whose two projections run the CUDA path's FP8 method (under the interpreter
    on CPU) with the given split-K tables."""
    mlp = GatedMLP(hidden, inter, True, torch.bfloat16)
    gen = torch.Generator().manual_seed(5)
    for layer in (mlp.gate_up_proj, mlp.down_proj):
        layer.weight.data.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.2)
        assert layer.bias is not None
        layer.bias.data.copy_(torch.randn(layer.bias.shape, generator=gen) * 0.1)
    mlp = mlp.to(DEVICE)
    for layer, by_m in ((mlp.gate_up_proj, gate_up_by_m), (mlp.down_proj, down_by_m)):
        method = fp8_linear.Fp8LinearMethod(Fp8Config("channel", False), emulate=False)
        method.process_weights(layer)
        method.splitk_by_m = by_m
        layer.quant_method = method
    return mlp


def test_gated_mlp_fuses_where_down_takes_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """``GatedMLP`` takes the fused epilogue exactly on the steps whose gate_up config has one
    slice and whose down projection takes bf16 (w8a16), bf16 or pre-quantized input, and gives
    the unfused output bit for bit; other steps keep the GEMM + activation pair."""
    one_a8 = Fp8SplitKConfig(16, 32, 64, 1, 2, 4, a8=True)
    one_a16 = Fp8SplitKConfig(16, 32, 64, 1, 2, 4)
    split = Fp8SplitKConfig(16, 32, 64, 2, 2, 4, a8=True)
    down_a16 = Fp8SplitKConfig(16, 32, 64, 2, 2, 4)
    down_a8 = Fp8SplitKConfig(16, 32, 64, 2, 2, 4, a8=True)
    # m:         0       1        2         3        4       5
    gate_up = (one_a8, one_a8, one_a16, one_a8, split, one_a8)
    down = (down_a16, down_a16, down_a16, down_a8, down_a16, down_a16)
    mlp = _fp8_mlp(128, 64, gate_up, down)
    fused: list[int] = []
    method = mlp.gate_up_proj.quant_method
    assert isinstance(method, fp8_linear.Fp8LinearMethod)
    real = method.apply_gated

    def spy(layer, x, bias):  # type: ignore[no-untyped-def]
        out = real(layer, x, bias)
        if out is not None:
            fused.append(out.shape[0])
        return out

    monkeypatch.setattr(method, "apply_gated", spy)
    gen = torch.Generator().manual_seed(11)
    for m, fuses in ((1, True), (2, True), (3, False), (4, False), (5, True)):
        x = torch.randn(m, 128, generator=gen).to(torch.bfloat16).to(DEVICE)
        fused.clear()
        got = mlp(x)
        assert fused == ([m] if fuses else []), m
        if fuses:
            want = mlp.down_proj(silu_and_mul(mlp.gate_up_proj(x)))
        else:
            want = mlp.down_proj(mlp.act(mlp.gate_up_proj(x)))
        assert torch.equal(got, want), m
    x = torch.randn(5, 128, generator=gen).to(torch.bfloat16).to(DEVICE)
    act = Fp8Activations(*per_token_quant_fp8(x), torch.bfloat16)
    fused.clear()
    got = mlp(act)
    assert fused == [5]
    assert torch.equal(got, mlp.down_proj(silu_and_mul(mlp.gate_up_proj(act))))


def test_gated_mlp_never_fuses_under_emulation() -> None:
    mlp = GatedMLP(128, 64, False, torch.bfloat16)
    for layer in (mlp.gate_up_proj, mlp.down_proj):
        layer.weight.data.copy_(torch.randn(layer.weight.shape) * 0.2)
        method = fp8_linear.Fp8LinearMethod(Fp8Config("channel", False), emulate=True)
        method.process_weights(layer)
        method.splitk_by_m = (Fp8SplitKConfig(16, 32, 64, 1, 2, 4),) * 4
        layer.quant_method = method
    x = torch.randn(2, 128).to(torch.bfloat16)
    assert mlp.gate_up_proj.swiglu(x) is None
    assert torch.equal(mlp(x), mlp.down_proj(mlp.act(mlp.gate_up_proj(x))))


_COMPILE_SM90_GATED = """
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from surge.kernels.fp8_gemm_splitk import FP8_PROMOTE_K, _fp8_splitk_kernel as kern

out = []
for a8, tma in ((True, True), (True, False), (False, False)):
    for gated in (False, True):
        const = dict(A8=a8, PARTIALS=False, INLINE=False, BLOCK_SCALES=False, SCALE_BN=1, SCALE_BK=1,
                     HAS_BIAS=False, EVEN_K=True, DOT_IEEE=False, PROMOTE_K=min(256, FP8_PROMOTE_K),
                     BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, TMA=tma, GATED=gated, PDL=True)
        ptr = {"y_ptr": "*bf16", "p_ptr": "*fp32", "cnt_ptr": "*i32", "b_ptr": "*bf16",
               "x_ptr": "*fp8e4nv" if a8 else "*bf16", "w_ptr": "*fp8e4nv",
               "w_desc": "tensordesc<fp8e4nv[32, 256]>" if tma else "*fp8e4nv"}
        sig = {a: "constexpr" if a in const else ptr.get(a, "*fp32" if a.endswith("_ptr") else "i32")
               for a in kern.arg_names}
        # what the launch specializes: 16-byte aligned pointers, N, K and row strides multiples of 16
        div = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(kern.arg_names)
               if a.endswith("_ptr") or a in ("N", "K", "stride_xm", "stride_wn", "stride_ym")}
        k = triton.compile(ASTSource(kern, sig, constexprs=const, attrs=div), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 4, "num_stages": 4, "launch_pdl": True})
        ttgir = k.asm["ttgir"]
        out.append(dict(a8=a8, tma=tma, gated=gated, dots=ttgir.count("tt.dot "),
                        tma_copies=ttgir.count("ttng.async_tma_copy_global_to_local"),
                        cp_async=ttgir.count("ttg.async_copy_global_to_local")))
print(json.dumps(out))
"""


def test_gated_kernel_compiles_for_sm90_with_two_pipelined_weight_tiles() -> None:
    """Compiled for sm90 outside the interpreter (no GPU needed; the interpreter is lenient about
    names defined under a constexpr branch): the gated kernel builds in both operand modes and
    with TMA, with two dots per ``K`` step and twice the weight copies of the plain kernel."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE_SM90_GATED], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    for plain, gated in zip(rows[::2], rows[1::2], strict=True):
        assert not plain["gated"] and gated["gated"]
        assert gated["dots"] == 2 * plain["dots"] > 0, (plain, gated)
        if plain["tma"]:
            assert gated["tma_copies"] == 2 * plain["tma_copies"] > 0, (plain, gated)
        else:
            assert gated["cp_async"] > plain["cp_async"] > 0, (plain, gated)
