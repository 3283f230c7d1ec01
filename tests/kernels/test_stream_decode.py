"""The persistent batch-1 FP8 stream kernel (:mod:`surge.kernels.stream_decode`): its launch
table and its torch reference on CPU; the kernel against that reference on an sm89+ GPU."""

from __future__ import annotations

import dataclasses
import struct

import pytest
import torch

from surge.kernels.stream_decode import (
    EPI_ADD,
    EPI_NONE,
    EPI_SILU,
    KIND_INPUT,
    KIND_NORM,
    KIND_NORM_STATS,
    KIND_STATS,
    STATS_LEN,
    WEIGHT_BLOCK_K,
    XMAX,
    StreamPhase,
    check_phase,
    pack_phases,
    phase_timeline,
    stream_epilogue,
    stream_input,
    stream_reference,
)
from surge.quant.fp8 import dequantize, quantize_block, quantize_per_channel

BF = torch.bfloat16
GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def _weight(
    n: int, k: int, dev: str = "cpu", seed: int = 0, block: tuple[int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row FP8, or (``block``) block-scaled FP8 whose blocks' magnitudes differ by up to 16x,
    so that a block's scale applied to another block's weights shows in the output."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * k**-0.5
    if block is None:
        q, s = quantize_per_channel(w)
    else:
        bn, bk = block
        mag = 2.0 ** torch.randint(-2, 3, (n // bn, k // bk), generator=g).float()
        q, s = quantize_block(w * mag.repeat_interleave(bn, 0).repeat_interleave(bk, 1), block)
    return q.to(dev), s.to(dev)


def _vec(k: int, dtype: torch.dtype, dev: str = "cpu", seed: int = 1, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(k, generator=g) * scale).to(dtype).to(dev)


def _stats(dev: str = "cpu") -> torch.Tensor:
    return torch.zeros(STATS_LEN, device=dev)


def test_pack_phases_lays_out_the_kernel_struct() -> None:
    w, s = _weight(48, 32)
    x, nw, s_in, s_out = _vec(32, BF), _vec(32, BF, seed=2), _stats(), _stats()
    res, out, nnw = _vec(48, BF, seed=3), torch.zeros(48, dtype=BF), _vec(48, BF, seed=4)
    y = torch.zeros(48, dtype=BF)
    ph = StreamPhase(
        w, s, KIND_NORM_STATS, y, x, nw, 1e-5, stats_in=s_in, epilogue=EPI_ADD,
        res_in=res, res_out=out, next_norm_w=nnw, stats_out=s_out,
    )  # fmt: skip
    row = pack_phases([ph])[0].tolist()
    ptrs = (
        [t.data_ptr() for t in (w, s, x, nw)] + [0] + [t.data_ptr() for t in (s_in, y, res, out, nnw, s_out)]
    )
    assert row[:11] == ptrs  # copy_out (unused) is null
    assert row[11] == 48 | (32 << 32)
    assert row[12] == KIND_NORM_STATS | (EPI_ADD << 32)
    assert row[13] & 0xFFFFFFFF == 1  # bf16 output
    assert struct.unpack("<f", struct.pack("<I", row[13] >> 32))[0] == pytest.approx(1e-5)


def test_pack_phases_gives_block_scaled_weights_their_block_rows() -> None:
    """The table's last word: 0 for one scale per row, ``bn | 128 << 32`` for block scales."""
    x = _vec(256, BF)
    per_row = StreamPhase(*_weight(64, 256), KIND_INPUT, torch.zeros(64), x)
    blocked = StreamPhase(*_weight(64, 256, block=(32, WEIGHT_BLOCK_K)), KIND_INPUT, torch.zeros(64), x)
    assert blocked.block_n == 32 and per_row.block_n == 0
    table = pack_phases([per_row, blocked])
    assert table.shape == (2, 29)
    assert table[0, -1].item() == 0
    assert table[1, -1].item() == 32 | (WEIGHT_BLOCK_K << 32)


def test_pack_phases_refuses_a_phase_reading_the_statistics_it_writes() -> None:
    stats = _stats()
    ph = StreamPhase(
        *_weight(8, 32), KIND_STATS, torch.zeros(4, dtype=BF), _vec(32, BF), stats_in=stats,
        epilogue=EPI_SILU, stats_out=stats,
    )  # fmt: skip
    with pytest.raises(ValueError, match="statistics buffer it reads"):
        pack_phases([ph])


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"weight": torch.zeros(8, 32, dtype=BF)}, "float8_e4m3fn"),
        ({"weight": torch.zeros(8, 24, dtype=torch.float8_e4m3fn)}, "multiple of 16"),
        ({"weight": torch.zeros(8, XMAX + 16, dtype=torch.float8_e4m3fn)}, "at most"),
        ({"weight_scale": torch.zeros(7)}, "weight_scale"),
        ({"y": torch.zeros(8, dtype=torch.float16)}, "y must be"),
        ({"y": None}, "needs y"),
        ({"kind": 9}, "unknown stream phase kind"),
        ({"epilogue": 7}, "unknown stream phase epilogue"),
        ({"kind": KIND_NORM}, "needs norm_w"),
        ({"kind": KIND_STATS}, "needs stats_in"),
        ({"epilogue": EPI_ADD, "y": None}, "needs res_in"),
        ({"epilogue": EPI_SILU, "y": torch.zeros(8, dtype=BF), "stats_out": _stats()}, r"y must be .* \[4\]"),
        ({"x": torch.zeros(32)}, "x must be a contiguous torch.bfloat16"),
        ({"x": torch.zeros(16, dtype=BF)}, "at least 32"),
        ({"kind": KIND_STATS, "stats_in": torch.zeros(8)}, f"stats_in must be .* at least {STATS_LEN}"),
        ({"weight_scale": torch.ones(2, 1)}, "k / 128"),  # k = 32: not whole 128-column blocks
        (
            {
                "weight": torch.zeros(8, 256, dtype=torch.float8_e4m3fn),
                "x": torch.zeros(256, dtype=BF),
                "weight_scale": torch.ones(2, 1),
            },
            r"got \[2, 1\]",
        ),  # two 128-column blocks, one scale column
        (
            {
                "weight": torch.zeros(8, 128, dtype=torch.float8_e4m3fn),
                "x": torch.zeros(128, dtype=BF),
                "weight_scale": torch.ones(3, 1),
            },
            "bn dividing n",
        ),
        (
            {
                "weight": torch.zeros(8, 128, dtype=torch.float8_e4m3fn),
                "x": torch.zeros(128, dtype=BF),
                "weight_scale": torch.ones(1, 1),
                "epilogue": EPI_SILU,
                "y": torch.zeros(4, dtype=BF),
                "stats_out": _stats(),
            },
            "n / 2 for a SwiGLU",
        ),  # one block of 8 rows would span gate and up rows
        (
            {
                "weight": torch.zeros(8, 128, dtype=torch.float8_e4m3fn),
                "x": torch.zeros(128, dtype=BF),
                "weight_scale": torch.ones(2, 1, dtype=torch.float64),
            },
            "float32",
        ),
    ],
)
def test_check_phase_refuses_what_the_kernel_cannot_run(bad: dict[str, object], message: str) -> None:
    base: dict[str, object] = {
        "weight": torch.zeros(8, 32, dtype=torch.float8_e4m3fn),
        "weight_scale": torch.ones(8),
        "kind": KIND_INPUT,
        "y": torch.zeros(8),
        "x": torch.zeros(32, dtype=BF),
    }
    with pytest.raises(ValueError, match=message):
        check_phase(StreamPhase(**{**base, **bad}))  # type: ignore[arg-type]


def test_silu_epilogue_is_huggingface_swiglu_in_bf16() -> None:
    k = 64
    out = torch.randn(2 * k) * 4
    act = torch.zeros(k, dtype=BF)
    ph = StreamPhase(
        *_weight(2 * k, 16), KIND_INPUT, act, _vec(16, BF), epilogue=EPI_SILU, stats_out=_stats()
    )
    stream_epilogue(ph, out)
    g, u = out[:k].to(BF), out[k:].to(BF)
    want = torch.nn.functional.silu(g) * u  # bf16 ops, as the HF MLP computes them
    assert torch.equal(act, want)


def test_add_epilogue_then_norm_input_is_the_models_add_and_rmsnorm() -> None:
    from surge.layers.norm import RMSNorm

    k = 64
    norm = RMSNorm(k, 1e-6, BF)
    norm.weight.data = _vec(k, BF, seed=3, scale=0.3) + 1
    res, out, new_res = _vec(k, BF, seed=4), torch.randn(k) * 2, torch.zeros(k, dtype=BF)
    add = StreamPhase(
        *_weight(k, 16), KIND_INPUT, None, _vec(16, BF), epilogue=EPI_ADD, res_in=res, res_out=new_res,
        next_norm_w=norm.weight.data, stats_out=_stats(),
    )  # fmt: skip
    stream_epilogue(add, out)
    h = res + out.to(BF)
    assert torch.equal(new_res, h)
    nxt = StreamPhase(
        *_weight(16, k), KIND_NORM_STATS, torch.zeros(16), new_res, norm.weight.data, 1e-6, stats_in=_stats()
    )
    torch.testing.assert_close(stream_input(nxt), norm(h[None])[0].float(), rtol=1e-2, atol=1e-2)


def test_reference_scales_inputs_so_fp16_products_cannot_overflow() -> None:
    """Inputs of magnitude 1e4 (beyond fp16 once multiplied by an e4m3 weight of 448) and
    1e-6 (fp16 subnormals) give the float32 product to fp16's relative precision."""
    k, n = 256, 32
    w, s = _weight(n, k)
    for scale in (1e4, 1e-6):
        x = _vec(k, BF, seed=5, scale=scale)
        y = torch.zeros(n)
        stream_reference([StreamPhase(w, s, KIND_INPUT, y, x=x)])
        exact = (w.float() * s[:, None]) @ x.float()
        assert torch.isfinite(y).all()
        assert ((y - exact).abs().max() / exact.abs().max()).item() < 2e-3


def _chain(
    n_q: int, hidden: int, inter: int, dev: str, block: tuple[int, int] | None = None
) -> tuple[list[StreamPhase], dict[str, torch.Tensor]]:
    """o -> gate_up -> down -> qkv, as one engine launch (input: an attention output), with the
    optional outputs of the ADD epilogues (``o``, ``down``) kept for the checks; ``block``:
    block-scaled weights."""
    buf = {
        "attn": _vec(hidden, BF, dev, seed=6),
        "res": _vec(hidden, BF, dev, seed=7),
        "res_a": torch.zeros(hidden, dtype=BF, device=dev),
        "res_b": torch.zeros(hidden, dtype=BF, device=dev),
        "o": torch.zeros(hidden, device=dev),
        "act": torch.zeros(inter, dtype=BF, device=dev),
        "down": torch.zeros(hidden, device=dev),
        "qkv": torch.zeros(n_q, dtype=BF, device=dev),
    }
    s0, s1 = _stats(dev), _stats(dev)
    nw1, nw2 = _vec(hidden, BF, dev, seed=8, scale=0.2) + 1, _vec(hidden, BF, dev, seed=9, scale=0.2) + 1
    phases = [
        StreamPhase(
            *_weight(hidden, hidden, dev, 10, block), KIND_INPUT, buf["o"], buf["attn"], epilogue=EPI_ADD,
            res_in=buf["res"], res_out=buf["res_a"], next_norm_w=nw1, stats_out=s0,
        ),
        StreamPhase(
            *_weight(2 * inter, hidden, dev, 11, block), KIND_NORM_STATS, buf["act"], buf["res_a"], nw1,
            stats_in=s0, epilogue=EPI_SILU, stats_out=s1,
        ),
        StreamPhase(
            *_weight(hidden, inter, dev, 12, block), KIND_STATS, buf["down"], buf["act"], stats_in=s1,
            epilogue=EPI_ADD, res_in=buf["res_a"], res_out=buf["res_b"], next_norm_w=nw2, stats_out=s0,
        ),
        StreamPhase(*_weight(n_q, hidden, dev, 13, block), KIND_NORM_STATS, buf["qkv"], buf["res_b"], nw2, stats_in=s0),
    ]  # fmt: skip
    return phases, buf


@pytest.mark.parametrize(
    "block, n_q, hidden, inter",
    [(None, 96, 64, 128), ((128, 128), 384, 256, 384), ((64, 128), 192, 128, 256)],
)
def test_reference_chain_matches_float32_layer_math(
    block: tuple[int, int] | None, n_q: int, hidden: int, inter: int
) -> None:
    """The reference's phases (fp16 inputs) against the same layer in float32 torch with bf16
    roundings where the model has them; per-row and block-scaled weights."""
    phases, buf = _chain(n_q, hidden, inter, "cpu", block)
    stream_reference(phases)

    def lin(i: int, x: torch.Tensor) -> torch.Tensor:
        return dequantize(phases[i].weight, phases[i].weight_scale, block) @ x.float()

    def rmsnorm(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        hf = h.float()
        return (w.float() * (hf * torch.rsqrt(hf.pow(2).mean() + 1e-6)).to(BF).float()).to(BF)

    def cos(a: torch.Tensor, b: torch.Tensor) -> float:
        return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=0).item()

    o = lin(0, buf["attn"])
    assert cos(buf["o"], o) > 0.9999
    torch.testing.assert_close(buf["res_a"].float(), (buf["res"] + o.to(BF)).float(), rtol=2e-2, atol=2e-2)
    gu = lin(1, rmsnorm(buf["res_a"], phases[1].norm_w))
    act = torch.nn.functional.silu(gu[:inter].to(BF)) * gu[inter:].to(BF)
    assert cos(buf["act"], act) > 0.999
    down = lin(2, buf["act"])
    assert cos(buf["down"], down) > 0.9999
    assert torch.equal(buf["res_b"], buf["res_a"] + buf["down"].to(BF))
    qkv = lin(3, rmsnorm(buf["res_b"], phases[3].norm_w))
    assert cos(buf["qkv"], qkv) > 0.999


@pytest.mark.skipif(not GPU, reason="needs an sm89+ CUDA GPU")
@pytest.mark.parametrize(
    "n_q, hidden, inter, block",
    [
        (6144, 4096, 12288, None),
        (6144, 4096, 14336, None),
        (96, 1040, 2064, None),
        (40, 64, 128, None),
        (6144, 4096, 12288, (128, 128)),
        (6144, 4096, 14336, (128, 128)),
        (384, 1152, 2304, (64, 128)),
    ],
    ids=[
        "qwen3-8b",
        "llama-8b-inter",
        "partial-segments",
        "fewer-rows-than-warps",
        "qwen3-8b-block128",
        "llama-8b-inter-block128",
        "partial-segments-block64x128",
    ],
)
def test_kernel_matches_reference(n_q: int, hidden: int, inter: int, block: tuple[int, int] | None) -> None:
    from surge.kernels.stream_decode import StreamDecodeKernel

    kern = StreamDecodeKernel.compile(torch.device("cuda"), block_scaled=block is not None)
    phases, buf = _chain(n_q, hidden, inter, "cuda", block)
    stream_reference(phases)
    want = {k: v.float().clone() for k, v in buf.items()}
    outputs = ("o", "act", "down", "qkv", "res_a", "res_b")
    for k in outputs:
        buf[k].fill_(float("nan"))
    kern.reset()
    kern.launch(pack_phases(phases), 0)
    torch.cuda.synchronize()
    assert not kern.hung()
    for k in outputs:
        got, ref = buf[k].float(), want[k]
        cos = torch.nn.functional.cosine_similarity(got, ref, dim=0).item()
        rel = ((got - ref).abs().max() / ref.abs().max()).item()
        assert cos > 0.9999 and rel < 2e-2, (k, cos, rel)
    # the epilogues' new residuals are exactly the bf16 adds of the residual and the kernel's outputs
    assert torch.equal(buf["res_a"], buf["res"] + buf["o"].to(BF))
    assert torch.equal(buf["res_b"], buf["res_a"] + buf["down"].to(BF))


@pytest.mark.skipif(not GPU, reason="needs an sm89+ CUDA GPU")
def test_each_build_takes_only_its_scales() -> None:
    """Each build, launched with the other layout's weights, reports the launch hung instead of
    computing them with the wrong scales."""
    from surge.kernels.stream_decode import StreamDecodeKernel

    dev = torch.device("cuda")
    for block_scaled, block in ((True, None), (False, (64, 128))):
        kern = StreamDecodeKernel.compile(dev, block_scaled=block_scaled)
        phases, _ = _chain(384, 1152, 2304, "cuda", block)
        if block is not None:  # the per-row build reads scale[row]: block scales, padded to n floats
            padded = [torch.zeros(ph.weight.shape[0] + ph.weight_scale.numel(), device=dev) for ph in phases]
            for ph, pad in zip(phases, padded, strict=True):
                pad[: ph.weight_scale.numel()] = ph.weight_scale.flatten()
            phases = [
                dataclasses.replace(
                    ph, weight_scale=pad[: ph.weight_scale.numel()].view(ph.weight_scale.shape)
                )
                for ph, pad in zip(phases, padded, strict=True)
            ]
        kern.reset()
        kern.launch(pack_phases(phases), 0)
        torch.cuda.synchronize()
        assert kern.hung(), block_scaled


@pytest.mark.skipif(not GPU, reason="needs an sm89+ CUDA GPU")
def test_kernel_in_a_cuda_graph_with_x0_and_phase_base() -> None:
    """Two launches per step, the first fed an attention output through ``x0``, replayed from a
    CUDA graph: the same values as eager launches."""
    from surge.kernels.stream_decode import StreamDecodeKernel

    kern = StreamDecodeKernel.compile(torch.device("cuda"))
    phases, buf = _chain(512, 1024, 2048, "cuda")
    first, rest = pack_phases(phases[:2]), pack_phases(phases[2:])
    x0 = _vec(1024, BF, "cuda", seed=20)

    def step() -> None:
        kern.reset()
        kern.launch(first, 0, x0)
        kern.launch(rest, 2)

    def poison() -> None:  # a phase that read before its producer finished would see NaNs
        for name in ("o", "act", "down", "qkv", "res_a", "res_b"):
            buf[name].fill_(float("nan"))

    poison()
    step()
    torch.cuda.synchronize()
    eager = buf["qkv"].clone()
    assert torch.isfinite(eager.float()).all()
    poison()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    assert not kern.hung()
    assert torch.equal(buf["qkv"], eager)
    stream_reference(phases, x0)
    ref = buf["qkv"].float()
    assert torch.nn.functional.cosine_similarity(eager.float(), ref, dim=0).item() > 0.9999


def test_self_test_runs_its_phases_and_compares_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up self-test's own code (its phases, their packing, the comparison) on CPU, with
    the reference standing in for the kernel; and that a wrong kernel output fails it."""
    import surge.kernels.stream_decode as sd

    kern = sd.StreamDecodeKernel(
        device=torch.device("cpu"), counter=torch.zeros(1, dtype=torch.int32), num_sms=4
    )
    packed: list[list[StreamPhase]] = []
    real_pack = sd.pack_phases

    def pack(phases: list[StreamPhase]) -> torch.Tensor:
        real_pack(phases)  # validates every operand
        packed.append(phases)
        return torch.zeros(len(phases), 14, dtype=torch.int64)

    monkeypatch.setattr(sd, "pack_phases", pack)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(
        sd.StreamDecodeKernel,
        "launch",
        lambda self, table, base, x0=None, trace=None: sd.stream_reference(packed[-1]),
    )
    kern.self_test()
    assert len(packed) == 1
    assert [(p.kind, p.epilogue) for p in packed[0]] == [
        (KIND_NORM, EPI_SILU),
        (KIND_STATS, EPI_ADD),
        (KIND_NORM_STATS, EPI_NONE),
    ]

    def wrong(self: object, table: torch.Tensor, base: int, x0: object = None, trace: object = None) -> None:
        sd.stream_reference(packed[-1])
        y = packed[-1][-1].y
        assert y is not None
        y.neg_()

    monkeypatch.setattr(sd.StreamDecodeKernel, "launch", wrong)
    with pytest.raises(RuntimeError, match="differs"):
        kern.self_test()


def test_a_trace_builds_self_test_gives_its_launch_a_trace_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace build's start-up self-test launches with a stamps buffer of its phases, which
    :meth:`launch`'s check accepts (without one, compiling a trace build always failed)."""
    import surge.kernels.stream_decode as sd

    kern = sd.StreamDecodeKernel(
        device=torch.device("cpu"), counter=torch.zeros(1, dtype=torch.int32), num_sms=4, trace=True
    )
    seen: list[torch.Tensor | None] = []
    real_launch = sd.StreamDecodeKernel.launch
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)

    def launch(
        self: sd.StreamDecodeKernel, table: torch.Tensor, base: int, x0: object = None, trace: object = None
    ):
        assert trace is None or isinstance(trace, torch.Tensor)
        seen.append(trace)
        self._fn = lambda **kw: None  # the real launch's checks, then no kernel
        real_launch(self, table, base, None, trace)
        sd.stream_reference(phases[-1])

    phases: list[list[StreamPhase]] = []
    real_pack = sd.pack_phases

    def pack(ph: list[StreamPhase]) -> torch.Tensor:
        phases.append(ph)
        return real_pack(ph)

    monkeypatch.setattr(sd, "pack_phases", pack)
    monkeypatch.setattr(sd.StreamDecodeKernel, "launch", launch)
    kern.self_test()
    assert len(seen) == 1 and seen[0] is not None
    assert seen[0].shape == (3, 4, 4) and seen[0].dtype == torch.int64


def test_phase_timeline_reads_the_stamps_of_each_phase() -> None:
    """Two phases of three blocks with hand-set stamps (ns): medians over blocks, the slowest
    block, the last arrival's trail and the barrier's latency, in microseconds."""
    us = 1000
    stamps = (
        torch.tensor(
            [
                # released, built, done, arrived
                [[0, 2, 10, 11], [0, 3, 12, 13], [1, 3, 20, 21]],
                [[24, 26, 30, 31], [25, 26, 31, 32], [25, 28, 33, 34]],
            ],
            dtype=torch.int64,
        )
        * us
    )
    first, second = phase_timeline(stamps, {0})
    assert first == {
        "build": 2.0, "rows": 9.0, "rows_max": 17.0, "tail": 8.0, "wait": 0.0, "span": 21.0, "launch_start": 1.0,
    }  # fmt: skip
    assert second == {
        "build": 2.0, "rows": 5.0, "rows_max": 5.0, "tail": 2.0, "wait": 4.0, "span": 13.0, "launch_start": 0.0,
    }  # fmt: skip


def test_a_trace_build_refuses_a_launch_without_its_buffer() -> None:
    import surge.kernels.stream_decode as sd

    kern = sd.StreamDecodeKernel(
        device=torch.device("cpu"), counter=torch.zeros(1, dtype=torch.int32), num_sms=4, trace=True
    )
    table = torch.zeros(2, 14, dtype=torch.int64)
    with pytest.raises(ValueError, match="trace buffer"):
        kern.launch(table, 1)
    with pytest.raises(ValueError, match="trace buffer"):
        kern.launch(table, 1, trace=torch.zeros(2, 4, 4, dtype=torch.int64))  # 3 phases needed
    with pytest.raises(ValueError, match="trace buffer"):
        kern.launch(table, 1, trace=torch.zeros(3, 4, 8, dtype=torch.int32))  # 4-byte stamps


@pytest.mark.skipif(not GPU, reason="needs an sm89+ CUDA GPU")
def test_trace_build_stamps_every_phase_in_barrier_order() -> None:
    """The diagnostic build computes the same values and stamps each block's phases in order;
    no block is released before every block has done the previous phase's rows."""
    from surge.kernels.stream_decode import StreamDecodeKernel

    kern = StreamDecodeKernel.compile(torch.device("cuda"), trace=True)
    phases, buf = _chain(512, 1024, 2048, "cuda")
    stream_reference(phases)
    want = buf["qkv"].float().clone()
    buf["qkv"].fill_(float("nan"))
    stamps = torch.zeros(len(phases), kern.num_sms, 4, dtype=torch.int64, device="cuda")
    kern.reset()
    kern.launch(pack_phases(phases), 0, trace=stamps)
    torch.cuda.synchronize()
    assert torch.nn.functional.cosine_similarity(buf["qkv"].float(), want, dim=0).item() > 0.9999
    t = stamps.cpu()
    assert (t > 0).all()
    assert (t[:, :, 1:] >= t[:, :, :-1]).all()  # released <= built <= done <= arrived
    for p in range(1, len(phases)):
        assert t[p, :, 0].min() >= t[p - 1, :, 2].max()
    rows = phase_timeline(t, {0})
    assert all(r["span"] > 0 for r in rows)


def test_pdl_launch_structs_match_the_driver_layout() -> None:
    """``CUlaunchConfig`` and ``CUlaunchAttribute`` as cuda.h lays them out on 64-bit hosts."""
    import ctypes

    from surge.kernels.stream_decode import _LaunchAttribute, _LaunchConfig

    assert ctypes.sizeof(_LaunchAttribute) == 72 and _LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(_LaunchConfig) == 56
    assert (_LaunchConfig.shared_mem.offset, _LaunchConfig.stream.offset) == (24, 32)
    assert (_LaunchConfig.attrs.offset, _LaunchConfig.num_attrs.offset) == (40, 48)
