"""Programmatic dependent launch (:mod:`surge.kernels.pdl`) on a GPU (skipped without CUDA, and
without sm90): a decode-shaped chain of Surge's kernels launched with PDL gives the same bits as
the ordinary launches, eagerly and replayed many times inside a CUDA graph (where a missing
``griddepcontrol.wait`` would show as a race).

Run on a GPU host: ``python3 -m pytest -q -m gpu tests/kernels/test_pdl_gpu.py -p no:cacheprovider -o timeout=0``
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from surge.kernels.add_rmsnorm import add_rmsnorm, add_rmsnorm_fp8
from surge.kernels.fp8_gemm_splitk import (
    Fp8SplitKConfig,
    SplitKWorkspace,
    fp8_linear_splitk,
    splitk_workspace_size,
)
from surge.kernels.pdl import use_pdl
from surge.kernels.silu_and_mul import silu_and_mul, silu_and_mul_fp8
from surge.quant.fp8 import quantize_per_channel

_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)

HIDDEN, INTER = 4096, 12288


Layer = dict[str, tuple[torch.Tensor, torch.Tensor]]


def _chain(
    m: int, pdl: bool, layers: list[Layer], ws: SplitKWorkspace
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A decoder-like chain of norms, activations and every split-K mode (inline and kernel
    reductions, one slice; w8a8 with pre-quantized input, w8a16)."""
    block_m = 16 if m <= 16 else 64
    inline = Fp8SplitKConfig(block_m, 64, 128, 4, 4, 4, True, "inline")
    kernel = Fp8SplitKConfig(block_m, 64, 128, 8, 4, 4, False, "kernel")
    single = Fp8SplitKConfig(block_m, 64, 128, 1, 4, 4, True, "kernel")

    def run(x: torch.Tensor) -> torch.Tensor:
        res = torch.zeros_like(x)
        for layer in layers:
            q, s, res = add_rmsnorm_fp8(x, layer["norm"][0], 1e-6, res, pdl=pdl)
            w, ws_ = layer["qkv"]
            qkv = fp8_linear_splitk(
                q,
                w,
                ws_,
                config=inline,
                workspace=ws,
                x_scale=s,
                out_dtype=x.dtype,
                pdl=pdl,
            )
            a, _ = add_rmsnorm(qkv[:, :HIDDEN], layer["norm"][0], 1e-6, None, pdl=pdl)
            h, res = add_rmsnorm(a, layer["norm"][0], 1e-6, res, pdl=pdl)
            w, ws_ = layer["gate_up"]
            gu = fp8_linear_splitk(h, w, ws_, config=single, pdl=pdl)
            if m > 16:
                act, acts = silu_and_mul_fp8(gu, pdl=pdl)
                w, ws_ = layer["down"]
                x = fp8_linear_splitk(
                    act,
                    w,
                    ws_,
                    config=inline,
                    workspace=ws,
                    x_scale=acts,
                    out_dtype=h.dtype,
                    pdl=pdl,
                )
            else:
                act = silu_and_mul(gu, pdl=pdl)
                w, ws_ = layer["down"]
                x = fp8_linear_splitk(act, w, ws_, config=kernel, pdl=pdl)
        return x

    return run


@pytest.mark.gpu
@pytest.mark.skipif(not _SM90, reason="needs an sm90+ CUDA GPU")
@pytest.mark.parametrize("m", [1, 64])
def test_pdl_chain_matches_ordinary_launches(m: int) -> None:
    assert use_pdl(torch.zeros(1, device="cuda"))
    gen = torch.Generator(device="cuda").manual_seed(m)
    layers = []
    for _ in range(4):
        layer = {}
        for name, (n, k) in {
            "qkv": (6144, HIDDEN),
            "gate_up": (2 * INTER, HIDDEN),
            "down": (HIDDEN, INTER),
        }.items():
            layer[name] = quantize_per_channel(torch.randn(n, k, device="cuda", generator=gen) * k**-0.5)
        layer["norm"] = (
            torch.rand(HIDDEN, device="cuda", generator=gen).to(torch.bfloat16) + 0.5,
            torch.empty(0),
        )
        layers.append(layer)
    floats, tiles = splitk_workspace_size(
        m, 6144, Fp8SplitKConfig(16 if m <= 16 else 64, 64, 128, 4, 4, 4, True, "inline")
    )
    ws = SplitKWorkspace.allocate(floats, tiles, "cuda")
    x = torch.randn(m, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    want = _chain(m, False, layers, ws)(x).clone()
    run = _chain(m, True, layers, ws)
    assert torch.equal(run(x), want)
    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(static_x)
    for i in range(50):
        static_x.copy_(x if i % 2 == 0 else -x)
        graph.replay()
        if i % 2 == 0:
            torch.cuda.synchronize()
            assert torch.equal(out, want), f"replay {i}"
    torch.cuda.synchronize()
