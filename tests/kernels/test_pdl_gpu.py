"""Programmatic dependent launch (:mod:`surge.kernels.pdl`) on a GPU (skipped without CUDA, and
without sm90): a decode-shaped chain of Surge's kernels launched with PDL gives the same bits as
the ordinary launches, eagerly and replayed many times inside a CUDA graph; and each kernel
waits for a predecessor that releases it early and writes its input late (a kernel without the
wait reads the stale input there, which the test also checks, so the harness is shown to work).

Run on a GPU host: ``python3 -m pytest -q -m gpu tests/kernels/test_pdl_gpu.py -p no:cacheprovider -o timeout=0``
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import triton
import triton.language as tl

from surge.kernels.add_rmsnorm import add_rmsnorm, add_rmsnorm_fp8, add_rmsnorm_partials
from surge.kernels.fp8_gemm_splitk import (
    Fp8SplitKConfig,
    SplitKWorkspace,
    fp8_linear_splitk,
    splitk_workspace_size,
)
from surge.kernels.fp8_quant import per_token_quant_fp8
from surge.kernels.pdl import use_pdl
from surge.kernels.silu_and_mul import silu_and_mul, silu_and_mul_fp8
from surge.quant.fp8 import SplitKPartials, quantize_per_channel

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

        def gemm(
            layer: Layer,
            name: str,
            a: torch.Tensor,
            cfg: Fp8SplitKConfig,
            a_scale: torch.Tensor | None = None,
        ) -> torch.Tensor:
            w, w_scale = layer[name]
            out_dtype = torch.bfloat16 if a_scale is not None else None
            return fp8_linear_splitk(
                a, w, w_scale, config=cfg, workspace=ws, x_scale=a_scale, out_dtype=out_dtype, pdl=pdl
            )

        for layer in layers:
            q, s, res = add_rmsnorm_fp8(x, layer["norm"][0], 1e-6, res, pdl=pdl)
            qkv = gemm(layer, "qkv", q, inline, s)
            a, _ = add_rmsnorm(qkv[:, :HIDDEN], layer["norm"][0], 1e-6, None, pdl=pdl)
            h, res = add_rmsnorm(a, layer["norm"][0], 1e-6, res, pdl=pdl)
            gu = gemm(layer, "gate_up", h, single)
            if m > 16:
                act, act_scale = silu_and_mul_fp8(gu, pdl=pdl)
                x = gemm(layer, "down", act, inline, act_scale)
            else:
                x = gemm(layer, "down", silu_and_mul(gu, pdl=pdl), kernel)
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


@triton.jit
def _late_write_kernel(dst_ptr, src_ptr, n, delay_ns, BLOCK: tl.constexpr):
    """Release the successor at once, spin ``delay_ns``, then copy ``src`` into ``dst``: a
    successor that reads ``dst`` without waiting sees the old contents."""
    tl.extra.cuda.gdc_launch_dependents()
    start = tl.extra.cuda.globaltimer()
    now = start
    while now - start < delay_ns:
        now = tl.extra.cuda.globaltimer()
    offs = tl.arange(0, BLOCK)
    for i in range(0, n, BLOCK):
        mask = i + offs < n
        tl.store(dst_ptr + i + offs, tl.load(src_ptr + i + offs, mask=mask), mask=mask)


@triton.jit
def _copy_without_wait_kernel(dst_ptr, src_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def _after_late_write(new: torch.Tensor, consumer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Run ``consumer`` on a buffer that a late writer fills with ``new`` (it starts zero) 2 ms
    after releasing its successor. The consumer must already be compiled: a first call's JIT
    would outlast the writer and hide the race."""
    buf = torch.zeros_like(new)
    torch.cuda.synchronize()
    _late_write_kernel[(1,)](buf, new, new.numel(), 2_000_000, BLOCK=1024)
    out = consumer(buf)
    torch.cuda.synchronize()
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not _SM90, reason="needs an sm90+ CUDA GPU")
def test_pdl_kernels_wait_for_a_predecessor_that_releases_them_early() -> None:
    """A predecessor that releases its successor at once and writes 2 ms later: a kernel
    launched with PDL but no wait reads the stale buffer (the harness provokes the race), and
    every Surge kernel launched with PDL reads the new contents."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    new = torch.randn(16, 4096, device="cuda", generator=gen).to(torch.bfloat16) + 3

    def no_wait(buf: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(buf)
        n = buf.numel()
        _copy_without_wait_kernel[(triton.cdiv(n, 1024),)](out, buf, n, BLOCK=1024, launch_pdl=True)
        return out

    no_wait(new)  # compile it first (see _after_late_write)
    assert not torch.equal(_after_late_write(new, no_wait), new), (
        "the harness did not provoke an early launch"
    )
    w, s = quantize_per_channel(torch.randn(1024, 4096, device="cuda", generator=gen) * 0.02)
    norm_w = torch.rand(4096, device="cuda", generator=gen).to(torch.bfloat16) + 0.5
    single = Fp8SplitKConfig(16, 64, 128, 1, 4, 4, False, "kernel")
    single_tma = Fp8SplitKConfig(16, 64, 128, 1, 4, 4, False, "kernel", True)
    parts = SplitKPartials(
        torch.randn(2, *new.shape, device="cuda", generator=gen), None, None, None, torch.bfloat16
    )
    consumers: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "silu_and_mul": lambda b: silu_and_mul(b, pdl=True),
        "silu_and_mul_fp8": lambda b: silu_and_mul_fp8(b, pdl=True)[0].view(torch.uint8),
        "add_rmsnorm": lambda b: add_rmsnorm(b, norm_w, 1e-6, pdl=True)[0],
        # the late buffer is the residual of the fused split-K reduce + add + RMSNorm
        "add_rmsnorm_partials": lambda b: add_rmsnorm_partials(parts, norm_w, 1e-6, b, pdl=True)[0],
        "per_token_quant_fp8": lambda b: per_token_quant_fp8(b, pdl=True)[0].view(torch.uint8),
        "fp8_linear_splitk": lambda b: fp8_linear_splitk(b, w, s, config=single, pdl=True),
        "fp8_linear_splitk tma": lambda b: fp8_linear_splitk(b, w, s, config=single_tma, pdl=True),
    }
    for name, consumer in consumers.items():
        want = consumer(new.clone())
        assert torch.equal(_after_late_write(new, consumer), want), name
