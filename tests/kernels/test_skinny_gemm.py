"""Skinny GEMM (and its fused SiLU-and-mul prologue) vs ``F.linear`` / ``SiluAndMul``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from surge.kernels.skinny_gemm import (
    FASTER_THAN_CUBLAS,
    SKINNY_MAX_M,
    SkinnyGemmConfig,
    skinny_config,
    skinny_linear,
    use_skinny,
)

G = torch.Generator().manual_seed(0)
TOL = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-5},
    torch.float16: {"atol": 1e-2, "rtol": 1e-3},
    torch.bfloat16: {"atol": 1e-2, "rtol": 1.6e-2},
}
SMALL = SkinnyGemmConfig(block_m=16, block_n=16, block_k=16, num_stages=2, num_warps=4)


@pytest.fixture(autouse=True, scope="module")
def _interpreter_bf16_dot() -> Iterator[None]:
    """Triton 3.6's interpreter multiplies bf16 ``tl.dot`` operands as their uint16 bit patterns
    (triton-lang/triton#11584, not supported upstream); convert them to fp32 first, as the GPU's
    bf16 MMA computes exact products. Test-only; compiled kernels are unaffected."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot

    def to_fp32(h: interpreter.TensorHandle) -> interpreter.TensorHandle:
        if h.dtype.scalar != tl.bfloat16:
            return h
        data = (np.asarray(h.data).astype(np.uint32) << 16).view(np.float32)
        return interpreter.TensorHandle(data, tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):  # noqa: ANN001, ANN202
        return original(self, to_fp32(a), to_fp32(b), d, input_precision, max_num_imprecise_acc)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
        yield


def _randn(*shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=G)).to(dtype)


def _ref_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 GEMM of the (rounded) inputs, rounded once to the input dtype, as cuBLAS does."""
    return F.linear(x.float(), w.float(), None if b is None else b.float()).to(x.dtype)


@pytest.mark.parametrize(
    ("m", "n", "k"),
    [(1, 64, 128), (5, 100, 200), (16, 48, 40), (19, 33, 72)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_skinny_linear_matches_torch(m: int, n: int, k: int, dtype: torch.dtype) -> None:
    x, w, b = _randn(m, k, dtype=dtype), _randn(n, k, dtype=dtype), _randn(n, dtype=dtype)
    torch.testing.assert_close(skinny_linear(x, w), _ref_linear(x, w), **TOL[dtype])
    torch.testing.assert_close(skinny_linear(x, w, b), _ref_linear(x, w, b), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_skinny_linear_small_blocks_k_tail(dtype: torch.dtype) -> None:
    """Several K iterations with a masked last one, several N and M blocks, strided x."""
    base = _randn(21, 90, dtype=dtype)
    x = base[:, 3:73]  # [21, 70], row stride 90
    w, b = _randn(40, 70, dtype=dtype), _randn(40, dtype=dtype)
    torch.testing.assert_close(skinny_linear(x, w, b, config=SMALL), _ref_linear(x, w, b), **TOL[dtype])


def test_skinny_linear_out_buffer_and_empty() -> None:
    x, w = _randn(3, 32), _randn(24, 32)
    out = torch.full((3, 24), float("nan"))
    assert skinny_linear(x, w, out=out) is out
    torch.testing.assert_close(out, _ref_linear(x, w), **TOL[torch.float32])
    assert skinny_linear(x[:0], w).shape == (0, 24)


def test_skinny_linear_errors() -> None:
    x, w = _randn(2, 32), _randn(8, 32)
    bad = [
        (x[0], w, None, None),  # 1-D x
        (x, _randn(8, 31), None, None),  # K mismatch
        (x, w.to(torch.bfloat16), None, None),  # dtype mismatch
        (x.to(torch.int32), w.to(torch.int32), None, None),  # unsupported dtype
        (_randn(32, 2).t(), w, None, None),  # non-contiguous last dim
        (x, w, _randn(7), None),  # bias shape
        (x, w, _randn(8, dtype=torch.bfloat16), None),  # bias dtype
        (x, w, None, torch.empty(2, 9)),  # out shape
        (x, w, None, torch.empty(2, 8, dtype=torch.bfloat16)),  # out dtype
    ]
    for xi, wi, bi, oi in bad:
        with pytest.raises(ValueError):
            skinny_linear(xi, wi, bi, oi)


def test_config_table_and_rules() -> None:
    bf16 = torch.bfloat16
    assert skinny_config(1, 4096, 12288, bf16) == SkinnyGemmConfig(16, 32, 256, 5, 4)
    assert skinny_config(16, 151936, 4096, bf16) == SkinnyGemmConfig(16, 64, 256, 3, 4)
    assert skinny_config(1, 4096, 4096, bf16).block_k == 128
    assert skinny_config(7, 4096, 4096, bf16).block_k == 256
    assert skinny_config(20, 6144, 4096, bf16).block_m == 32
    assert skinny_config(64, 1000, 20000, bf16).block_k <= 128  # BM=64: smaller K tiles
    small = skinny_config(3, 10, 20, torch.float32)
    assert (small.block_n, small.block_k) == (16, 32)
    for m in (1, 16, 32, 64):
        for n, k in ((4096, 12288), (151936, 4096), (5000, 30000)):
            for dtype in (bf16, torch.float32):
                c = skinny_config(m, n, k, dtype)
                assert c.num_stages * (c.block_m + c.block_n) * c.block_k * dtype.itemsize <= 180 * 1024


def test_use_skinny_needs_cuda_and_a_measured_shape() -> None:
    x, w = _randn(4, 4096, dtype=torch.bfloat16), _randn(4096, 4096, dtype=torch.bfloat16)
    assert (4096, 4096) in FASTER_THAN_CUBLAS
    assert not use_skinny(x, w)  # CPU tensors never take the Triton path
    assert SKINNY_MAX_M == 16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [1, 7, 16])
@pytest.mark.parametrize(
    ("n", "k"),
    [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096)],
    ids=["qkv", "o", "gate_up", "down", "lm_head"],
)
def test_gpu_qwen3_8b_shapes(m: int, n: int, k: int) -> None:
    dev, dtype = "cuda", torch.bfloat16
    x = torch.randn(m, k, device=dev, dtype=dtype)
    w = torch.randn(n, k, device=dev, dtype=dtype) * 0.02
    assert use_skinny(x, w) == ((n, k) in FASTER_THAN_CUBLAS)
    ref = F.linear(x, w)
    torch.testing.assert_close(skinny_linear(x, w), ref, atol=1e-2, rtol=1.6e-2)
