"""TMA weight loads of the split-K FP8 GEMM on a Hopper GPU (skipped without CUDA sm90+) at
Qwen3-8B's shapes: bit for bit the pointer loads' result (the same tiles, dots and summation
order) over operand modes, tiles, split-K reductions, block scales, pre-quantized input and
PDL, eagerly and replayed inside a captured CUDA graph.

Run on a GPU host: ``python3 -m pytest -q -m gpu tests/kernels/test_fp8_gemm_splitk_tma_gpu.py
-p no:cacheprovider -o timeout=0``
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from surge.kernels.fp8_gemm_splitk import (
    Fp8SplitKConfig,
    SplitKWorkspace,
    fp8_linear_splitk,
    splitk_workspace_size,
    tma_supported,
)
from surge.kernels.fp8_quant import per_token_quant_fp8
from surge.quant.fp8 import dequantize, quantize_block, quantize_per_channel
from surge.quant.fp8_linear import splitk_configs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or not tma_supported("cuda"), reason="needs a CUDA GPU of sm90+"
    ),
]

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}


def _weights(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w, s = quantize_per_channel(torch.randn(n, k, device="cuda", generator=gen) * 0.02)
    bias = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16) * 0.1
    return w, s, bias


def _configs(m: int, a8: bool, k: int) -> list[Fp8SplitKConfig]:
    """Pointer-load configs like the sweep's (both reductions, 32- to 128-column tiles,
    ``block_k`` 128 to 512, one to 16 slices, a ragged split) and the engine's measured ones."""
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    out = [
        Fp8SplitKConfig(bm, 64, 128, 1, 4, 4, a8, "kernel"),
        Fp8SplitKConfig(bm, 32, 128, 2, 4, 4, a8, "kernel"),
        Fp8SplitKConfig(bm, 64, 128, 4, 4, 4, a8, "inline"),
        Fp8SplitKConfig(bm, 128, 256, 8, 3, 4, a8, "inline"),
        Fp8SplitKConfig(bm, 64, 512, 2, 2, 4, a8, "kernel"),
        Fp8SplitKConfig(bm, 32, 256, 16, 4, 4, a8, "inline"),
        Fp8SplitKConfig(bm, 32, 128, 3, 3, 4, a8, "inline"),  # ragged K slices
    ]
    return [c for c in out if k >= c.split_k * c.block_k]


def _workspace(m: int, n: int, configs: list[Fp8SplitKConfig]) -> SplitKWorkspace:
    need = [splitk_workspace_size(m, n, c) for c in configs] + [(1, 1)]
    return SplitKWorkspace.allocate(max(f for f, _ in need), max(t for _, t in need), "cuda")


@pytest.mark.parametrize("layer", list(SHAPES))
@pytest.mark.parametrize("m", [1, 5, 16, 64])
@pytest.mark.parametrize("a8", [False, True])
def test_tma_equals_pointer_loads_bitwise(layer: str, m: int, a8: bool) -> None:
    n, k = SHAPES[layer]
    w, s, bias = _weights(n, k, seed=m)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xq, xs = per_token_quant_fp8(x)
    ref = (dequantize(xq, xs) if a8 else x.float()) @ dequantize(w, s).t() + bias.float()
    configs = _configs(m, a8, k)
    measured = [c for c in splitk_configs(n, k)[m : m + 1] if c is not None and c.a8 == a8]
    configs += [replace(c, tma=False) for c in measured]
    ws = _workspace(m, n, configs)
    for cfg in configs:
        ptr = fp8_linear_splitk(x, w, s, bias, config=cfg, workspace=ws)
        tma = fp8_linear_splitk(x, w, s, bias, config=replace(cfg, tma=True), workspace=ws)
        assert torch.equal(tma, ptr), (cfg, (tma.float() - ptr.float()).abs().max().item())
        err = ((tma.float() - ref).abs().max() / ref.abs().max()).item()
        assert err < 1e-2, (cfg, err)
        for pdl in (False, True):
            again = fp8_linear_splitk(x, w, s, bias, config=replace(cfg, tma=True), workspace=ws, pdl=pdl)
            assert torch.equal(again, ptr), (cfg, pdl)
        if a8:  # pre-quantized activations (a fused producer's)
            pre = fp8_linear_splitk(
                xq, w, s, bias, config=replace(cfg, tma=True), workspace=ws, x_scale=xs, out_dtype=x.dtype
            )
            assert torch.equal(pre, ptr), cfg
    torch.cuda.synchronize()
    assert int(ws.counters.abs().sum()) == 0


@pytest.mark.parametrize("layer", ["qkv", "down"])
@pytest.mark.parametrize("m", [1, 16])
def test_tma_equals_pointer_loads_with_block_scales(layer: str, m: int) -> None:
    """128 x 128 block scales (an FP8 checkpoint's), w8a16 as the engine runs them and w8a8."""
    n, k = SHAPES[layer]
    gen = torch.Generator(device="cuda").manual_seed(3)
    w, s = quantize_block(torch.randn(n, k, device="cuda", generator=gen) * 0.02, (128, 128))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    configs = [c for a8 in (False, True) for c in _configs(m, a8, k) if c.block_k <= 128]
    ws = _workspace(m, n, configs)
    for cfg in configs:
        ptr = fp8_linear_splitk(x, w, s, config=cfg, block_size=(128, 128), workspace=ws)
        tma = fp8_linear_splitk(x, w, s, config=replace(cfg, tma=True), block_size=(128, 128), workspace=ws)
        assert torch.equal(tma, ptr), cfg


@pytest.mark.parametrize("m", [1, 16, 64])
def test_tma_in_a_cuda_graph(m: int) -> None:
    """The four layer shapes in sequence on one workspace, TMA on, captured in one CUDA graph
    (the descriptors' bytes recorded at capture) and replayed eight times with new inputs:
    every replay equals the eager pointer-load result for its input bit for bit; the counters
    are zero after the replays."""
    bm = 16 if m <= 16 else 64
    layers = {name: _weights(n, k, seed=i) for i, (name, (n, k)) in enumerate(SHAPES.items())}
    configs = {
        "qkv": Fp8SplitKConfig(bm, 64, 128, 4, 4, 4, True, "inline", True),
        "o": Fp8SplitKConfig(bm, 32, 256, 4, 4, 4, False, "inline", True),
        "gate_up": Fp8SplitKConfig(bm, 64, 128, 1, 4, 4, True, "kernel", True),
        "down": Fp8SplitKConfig(bm, 64, 128, 8, 4, 4, False, "kernel", True),
    }
    need = [splitk_workspace_size(m, SHAPES[name][0], c) for name, c in configs.items()]
    ws = SplitKWorkspace.allocate(max(f for f, _ in need), max(t for _, t in need), "cuda")
    static = {name: torch.zeros(m, k, device="cuda", dtype=torch.bfloat16) for name, (_, k) in SHAPES.items()}

    def step(cfg_of: dict[str, Fp8SplitKConfig]) -> dict[str, torch.Tensor]:
        return {
            name: fp8_linear_splitk(static[name], *layers[name], config=cfg_of[name], workspace=ws)
            for name in SHAPES
        }

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(configs)  # warm-up: compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step(configs)
    pointer = {name: replace(c, tma=False) for name, c in configs.items()}
    for r in range(8):
        for x in static.values():
            x.copy_(torch.randn_like(x, dtype=torch.float32).to(torch.bfloat16) * (1 + r))
        graph.replay()
        torch.cuda.synchronize()
        got = {name: y.clone() for name, y in outs.items()}
        want = step(pointer)
        for name in SHAPES:
            assert torch.equal(got[name], want[name]), (name, r)
    torch.cuda.synchronize()
    assert int(ws.counters.abs().sum()) == 0
