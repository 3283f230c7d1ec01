"""The split-K FP8 GEMM against the torch reference of :mod:`surge.quant.fp8`: w8a16 and w8a8,
one launch and split-K with the reduce kernel or the inline reduction (repeated calls on one
persistent workspace), even and ragged ``K`` slices, bias, tails."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from surge.kernels.fp8_gemm_splitk import (
    Fp8SplitKConfig,
    SplitKWorkspace,
    default_splitk_config,
    fp8_linear_splitk,
    splitk_workspace_size,
)
from surge.kernels.fp8_quant import per_token_quant_fp8
from surge.quant.fp8 import (
    Fp8Activations,
    dequantize,
    fp8_linear_reference,
    quantize_block,
    quantize_per_channel,
)
from tests.kernels.emit_utils import run_emit, splitk_table
from tests.kernels.splitk_spy import record_splitk_configs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _problem(m: int, n: int, k: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w, s = quantize_per_channel(torch.randn(n, k, generator=gen) * 0.05)
    bias = (torch.randn(n, generator=gen) * 0.1).to(dtype)
    return x, w, s, bias


@pytest.mark.parametrize(
    "m,n,k,split",
    [(1, 48, 64, 1), (1, 64, 256, 4), (5, 40, 96, 2), (16, 64, 512, 8), (20, 96, 160, 3), (3, 32, 64, 4)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_w8a16_matches_reference(
    m: int, n: int, k: int, split: int, dtype: torch.dtype, with_bias: bool
) -> None:
    x, w, s, bias = _problem(m, n, k, dtype, seed=m + n + k)
    b = bias if with_bias else None
    cfg = Fp8SplitKConfig(
        block_m=16, block_n=16 if n % 32 else 32, block_k=32, split_k=split, num_stages=2, num_warps=4
    )
    out = fp8_linear_splitk(
        x.to(DEVICE), w.to(DEVICE), s.to(DEVICE), None if b is None else b.to(DEVICE), config=cfg
    )
    ref = fp8_linear_reference(x, w, s, b, quantize_input=False)
    assert out.dtype == dtype and out.shape == (m, n)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.cpu(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("m,n,k,split", [(1, 64, 128, 1), (4, 48, 256, 4), (17, 32, 96, 2)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_w8a8_matches_reference_on_its_quantized_activations(
    m: int, n: int, k: int, split: int, with_bias: bool
) -> None:
    x, w, s, bias = _problem(m, n, k, torch.bfloat16, seed=7 * m + k)
    b = bias if with_bias else None
    cfg = Fp8SplitKConfig(
        block_m=16, block_n=16, block_k=32, split_k=split, num_stages=2, num_warps=4, a8=True
    )
    out = fp8_linear_splitk(
        x.to(DEVICE), w.to(DEVICE), s.to(DEVICE), None if b is None else b.to(DEVICE), config=cfg
    )
    xq, xs = per_token_quant_fp8(x.to(DEVICE))
    ref = dequantize(xq.cpu(), xs.cpu()) @ dequantize(w, s).t()
    if b is not None:
        ref = ref + b.float()
    torch.testing.assert_close(out.cpu().float(), ref, atol=2e-2, rtol=2e-2)
    # and against the torch reference (its own per-token quantization) as the engine sees it
    torch.testing.assert_close(out.cpu(), fp8_linear_reference(x, w, s, b), atol=3e-2, rtol=3e-2)


def _block_problem(
    m: int, n: int, k: int, block: tuple[int, int], seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """bf16 ``x``, a block-quantized weight whose blocks differ in magnitude by up to ~100x
    (so a scale read from the wrong block is a large error) and a bf16 bias."""
    gen = torch.Generator().manual_seed(seed)
    bn, bk = block
    mag = torch.exp(torch.randn(-(-n // bn), -(-k // bk), generator=gen) * 1.5)
    full = (
        torch.randn(n, k, generator=gen)
        * 0.05
        * mag.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    )
    w, s = quantize_block(full, block)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    return x, w, s, (torch.randn(n, generator=gen) * 0.1).to(torch.bfloat16)


@pytest.mark.parametrize(
    "m,n,k,block,block_k,split",
    [
        (1, 64, 256, (32, 64), 32, 4),  # two steps per scale block, slices across blocks
        (1, 64, 256, (32, 64), 64, 1),  # one launch
        (5, 48, 192, (8, 64), 32, 2),  # two N blocks per 16-column tile
        (3, 40, 160, (32, 32), 32, 3),  # partial last N block, ragged K slices (a step past K)
        (17, 96, 128, (32, 128), 32, 2),  # two M tiles
    ],
)
@pytest.mark.parametrize("a8", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_block_scales_match_reference(
    m: int, n: int, k: int, block: tuple[int, int], block_k: int, split: int, a8: bool, with_bias: bool
) -> None:
    x, w, s, bias = _block_problem(m, n, k, block, seed=m + n + k + split)
    b = bias if with_bias else None
    cfg = Fp8SplitKConfig(16, 16, block_k, split, 2, 4, a8=a8)
    out = fp8_linear_splitk(
        x.to(DEVICE),
        w.to(DEVICE),
        s.to(DEVICE),
        None if b is None else b.to(DEVICE),
        config=cfg,
        block_size=block,
    )
    deq_w = dequantize(w, s, block)
    if a8:  # on the kernel's own quantized activations (see the w8a8 test above)
        xq, xs = per_token_quant_fp8(x.to(DEVICE))
        ref = dequantize(xq.cpu(), xs.cpu()) @ deq_w.t()
    else:
        ref = x.float() @ deq_w.t()
    if b is not None:
        ref = ref + b.float()
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    scale = ref.abs().max().item()
    torch.testing.assert_close(out.cpu().float(), ref, atol=1e-2 * scale, rtol=2e-2)
    if not a8:  # the engine's reference for a weight-only block layer
        want = fp8_linear_reference(x, w, s, b, block_size=block, quantize_input=False)
        torch.testing.assert_close(out.cpu(), want, atol=1e-2 * scale, rtol=2e-2)


def _same_as_reduce_kernel(got: torch.Tensor, want: torch.Tensor) -> None:
    """Both reductions sum the partials in the same order: the same bits under the interpreter;
    on a GPU allow one output ulp (the compiler may contract the epilogues differently)."""
    if DEVICE == "cpu":
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=2**-7)


@pytest.mark.parametrize(
    "m,n,k,split,block_n",
    [
        (1, 64, 256, 4, 16),
        (3, 48, 192, 3, 32),  # ragged last N tile, ragged K slices
        (16, 64, 512, 8, 32),
        (20, 40, 96, 2, 16),  # two M tiles, ragged N
        (3, 32, 64, 4, 16),  # a slice past K (empty partial)
    ],
)
@pytest.mark.parametrize("a8", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_inline_reduce_matches_reference_over_repeated_calls(
    m: int, n: int, k: int, split: int, block_n: int, a8: bool, with_bias: bool
) -> None:
    """The inline reduction: the reference and the reduce kernel's result on every one of four
    calls in a row on one workspace, whose counters are zero after each call."""
    x, w, s, bias = (t.to(DEVICE) for t in _problem(m, n, k, torch.bfloat16, seed=3 * m + n + k))
    b = bias if with_bias else None
    kernel = Fp8SplitKConfig(16, block_n, 32, split, 2, 4, a8=a8)
    inline = replace(kernel, reduce="inline")
    floats, tiles = splitk_workspace_size(m, n, inline)
    assert floats == split * m * n and tiles == -(-n // block_n) * -(-m // 16)
    ws = SplitKWorkspace.allocate(floats, tiles, DEVICE)
    ws.partials.fill_(float("nan"))  # stale partials must not matter
    want = fp8_linear_splitk(x, w, s, b, config=kernel)
    for _ in range(4):
        got = fp8_linear_splitk(x, w, s, b, config=inline, workspace=ws)
        assert got.shape == (m, n) and got.dtype == torch.bfloat16
        _same_as_reduce_kernel(got, want)
        assert int(ws.counters.abs().sum()) == 0
    if a8:
        xq, xs = per_token_quant_fp8(x)
        for _ in range(2):  # pre-quantized activations (a fused producer's), the same reduction
            pre = fp8_linear_splitk(xq, w, s, b, config=inline, workspace=ws, x_scale=xs, out_dtype=x.dtype)
            assert torch.equal(pre, got)
        ref = dequantize(xq.cpu(), xs.cpu()) @ dequantize(w.cpu(), s.cpu()).t()
        if b is not None:
            ref = ref + b.cpu().float()
        torch.testing.assert_close(got.cpu().float(), ref, atol=2e-2, rtol=2e-2)
    else:
        ref = fp8_linear_reference(
            x.cpu(), w.cpu(), s.cpu(), None if b is None else b.cpu(), quantize_input=False
        )
        torch.testing.assert_close(got.cpu(), ref, atol=2e-2, rtol=2e-2)


def test_inline_reduce_shares_one_workspace_across_shapes_and_modes() -> None:
    """Calls of different shapes, splits, dtypes and scale layouts, interleaved on one
    workspace (as a model's layers share one), each equal to its reduce-kernel result."""
    calls = []
    for m, n, k, split, dtype in ((1, 64, 256, 4, torch.bfloat16), (16, 96, 128, 2, torch.float32)):
        x, w, s, bias = (t.to(DEVICE) for t in _problem(m, n, k, dtype, seed=m * 7 + n))
        calls.append((x, w, s, bias, None, Fp8SplitKConfig(16, 32, 32, split, 2, 4)))
    x, w, s, bias = (t.to(DEVICE) for t in _block_problem(3, 64, 256, (32, 64), seed=2))
    calls.append((x, w, s, bias, (32, 64), Fp8SplitKConfig(16, 16, 32, 8, 2, 4)))
    need = [
        splitk_workspace_size(c[0].shape[0], c[1].shape[0], replace(c[5], reduce="inline")) for c in calls
    ]
    ws = SplitKWorkspace.allocate(max(f for f, _ in need), max(t for _, t in need), DEVICE)
    wants = [fp8_linear_splitk(x, w, s, b, config=c, block_size=bs) for x, w, s, b, bs, c in calls]
    order = [0, 1, 2, 0, 2, 1, 1, 0]
    for i in order:
        x, w, s, b, bs, c = calls[i]
        got = fp8_linear_splitk(x, w, s, b, config=replace(c, reduce="inline"), block_size=bs, workspace=ws)
        _same_as_reduce_kernel(got, wants[i])
    assert int(ws.counters.abs().sum()) == 0


def test_inline_reduce_workspace_checks() -> None:
    """A missing workspace is allocated for the call; one too small, or of the wrong dtype, is
    a ValueError; split_k = 1 or the reduce kernel need none; a bad reduce name is refused."""
    x, w, s, _ = (t.to(DEVICE) for t in _problem(5, 64, 256, torch.bfloat16, seed=8))
    inline = Fp8SplitKConfig(16, 32, 32, 4, 2, 4, reduce="inline")
    want = fp8_linear_splitk(x, w, s, config=replace(inline, reduce="kernel"))
    _same_as_reduce_kernel(fp8_linear_splitk(x, w, s, config=inline), want)
    assert splitk_workspace_size(5, 64, inline) == (4 * 5 * 64, 2)
    assert splitk_workspace_size(5, 64, replace(inline, split_k=1)) == (0, 0)
    assert splitk_workspace_size(5, 64, replace(inline, reduce="kernel")) == (0, 0)
    small = SplitKWorkspace.allocate(4 * 5 * 64 - 1, 2, DEVICE)
    with pytest.raises(ValueError, match="workspace"):
        fp8_linear_splitk(x, w, s, config=inline, workspace=small)
    few = SplitKWorkspace.allocate(4 * 5 * 64, 1, DEVICE)
    with pytest.raises(ValueError, match="workspace"):
        fp8_linear_splitk(x, w, s, config=inline, workspace=few)
    wrong = SplitKWorkspace(torch.zeros(4 * 5 * 64, device=DEVICE), torch.zeros(2, device=DEVICE))
    with pytest.raises(ValueError, match="workspace"):
        fp8_linear_splitk(x, w, s, config=inline, workspace=wrong)
    with pytest.raises(ValueError, match="reduce"):
        fp8_linear_splitk(x, w, s, config=replace(inline, reduce="atomic"))  # type: ignore[arg-type]
    one = replace(inline, split_k=1)
    torch.testing.assert_close(
        fp8_linear_splitk(x, w, s, config=one, workspace=small), want, atol=2e-2, rtol=2e-2
    )


def test_process_fp8_shares_one_workspace_sized_for_the_inline_layers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``"inline"`` entries in ``SPLITK_MEASURED``, :func:`process_fp8` gives every FP8
    layer one shared workspace sized for the largest need; the layers' decode steps then match
    the reference; with none (the reduce kernel only), no workspace is allocated."""
    from torch import nn

    from surge.layers.linear import ReplicatedLinear
    from surge.quant import fp8_linear
    from surge.quant.config import Fp8Config
    from surge.quant.loading import attach_fp8, process_fp8

    gen = torch.Generator().manual_seed(4)
    table = {
        (64, 128): {1: (16, 32, 32, 4, 2, 4, False, "inline"), 16: (16, 16, 32, 2, 2, 4, True, "inline")},
        (96, 64): {16: (16, 32, 32, 2, 2, 4, False, "kernel")},
    }
    for inline in (True, False):
        if not inline:
            table = {shape: {m: (*t[:7], "kernel") for m, t in by_m.items()} for shape, by_m in table.items()}
        monkeypatch.setattr(fp8_linear, "SPLITK_MEASURED", table)
        model = nn.Sequential(
            ReplicatedLinear(128, 64, dtype=torch.bfloat16), ReplicatedLinear(64, 96, dtype=torch.bfloat16)
        )
        model.to(DEVICE)
        for layer in model:
            layer.weight.data.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.05)
        config = Fp8Config("channel", from_checkpoint=False)
        attach_fp8(model, config, emulate=False, load_checkpoint=False)
        process_fp8(model)
        methods = [layer.quant_method for layer in model]
        if not inline:
            assert all(mt.splitk_workspace is None for mt in methods)
            continue
        ws = methods[0].splitk_workspace
        assert ws is not None and all(mt.splitk_workspace is ws for mt in methods)
        # the largest need: M = 16 at (64, 128) with split 2 (2 * 16 * 64), M = 1 with 2 tiles
        assert ws.partials.numel() == 2 * 16 * 64 and ws.counters.numel() == 4
        for m in (1, 3, 16):
            x = torch.randn(m, 128, generator=gen).to(torch.bfloat16)
            first, second = model[0], model[1]
            y = first(x.to(DEVICE))
            w8a16 = m == 1
            want = fp8_linear_reference(
                x, first.weight.cpu(), first.weight_scale.cpu(), quantize_input=not w8a16
            )
            torch.testing.assert_close(y.cpu(), want, atol=3e-2, rtol=3e-2)
            z = second(y)
            want2 = fp8_linear_reference(
                y.cpu(), second.weight.cpu(), second.weight_scale.cpu(), quantize_input=False
            )
            torch.testing.assert_close(z.cpu(), want2, atol=3e-2, rtol=3e-2)
        assert int(ws.counters.abs().sum()) == 0


def test_block_scales_reject_a_block_k_that_crosses_blocks() -> None:
    x, w, s, _ = _block_problem(2, 32, 128, (32, 32), seed=1)
    with pytest.raises(ValueError, match="must divide"):
        fp8_linear_splitk(x, w, s, config=Fp8SplitKConfig(16, 16, 64, 1, 2, 4), block_size=(32, 32))
    with pytest.raises(ValueError, match="block scale must be"):
        fp8_linear_splitk(x, w, s[:, :2], config=Fp8SplitKConfig(16, 16, 32, 1, 2, 4), block_size=(32, 32))
    # the default config's block_k shrinks to the scale block's
    out = fp8_linear_splitk(x.to(DEVICE), w.to(DEVICE), s.to(DEVICE), block_size=(32, 32))
    want = fp8_linear_reference(x, w, s, block_size=(32, 32), quantize_input=False)
    torch.testing.assert_close(out.cpu(), want, atol=2e-2, rtol=2e-2)


def test_default_config_splits_k_for_skinny_shapes() -> None:
    cfg = default_splitk_config(1, 4096, 12288)
    assert cfg.block_m == 16 and cfg.split_k > 1 and 2 * cfg.split_k * cfg.block_k <= 12288
    assert default_splitk_config(64, 32, 64).split_k == 1


def test_default_config_runs() -> None:
    x, w, s, _ = _problem(2, 80, 1024, torch.bfloat16, seed=3)
    out = fp8_linear_splitk(x.to(DEVICE), w.to(DEVICE), s.to(DEVICE))
    torch.testing.assert_close(
        out.cpu(), fp8_linear_reference(x, w, s, quantize_input=False), atol=2e-2, rtol=2e-2
    )


def test_rejects_bad_inputs() -> None:
    x, w, s, bias = _problem(2, 32, 64, torch.float32, seed=4)
    ok = Fp8SplitKConfig(16, 16, 32, 2, 2, 4)
    with pytest.raises(ValueError):
        fp8_linear_splitk(x, w.float(), s, config=ok)
    with pytest.raises(ValueError):
        fp8_linear_splitk(x[:, :32], w, s, config=ok)
    with pytest.raises(ValueError):
        fp8_linear_splitk(x, w, s[:16], config=ok)
    with pytest.raises(ValueError):
        fp8_linear_splitk(x, w, s, bias.to(torch.bfloat16), config=ok)
    with pytest.raises(ValueError):
        fp8_linear_splitk(x, w, s, config=Fp8SplitKConfig(16, 24, 32, 2, 2, 4))
    with pytest.raises(ValueError):
        fp8_linear_splitk(x, w, s, config=Fp8SplitKConfig(16, 16, 32, 0, 2, 4))
    with pytest.raises(ValueError):
        fp8_linear_splitk(x, w, s, config=Fp8SplitKConfig(16, 16, 32, 2, 2, 4, a8=True))


def test_measured_table_maps_each_token_count_to_its_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    from surge.quant import fp8_linear

    small, mid = (16, 32, 128, 4, 4, 4, False), (16, 64, 256, 2, 3, 4, True)
    top = fp8_linear.SPLITK_MAX_M
    # buckets 1 and 16 measured (split-K won), 2, 4, 8, 32 and 64 not swept
    monkeypatch.setattr(fp8_linear, "SPLITK_MEASURED", {(64, 128): {1: small, 16: mid}})
    by_m = fp8_linear.splitk_configs(64, 128)
    assert len(by_m) == top + 1
    assert by_m[0] == by_m[1] == Fp8SplitKConfig(*small)
    assert all(by_m[m] == Fp8SplitKConfig(*mid) for m in range(2, 17))  # next measured bucket: 16
    assert all(by_m[m] is None for m in range(17, top + 1))  # above the largest measured: _scaled_mm
    assert set(fp8_linear.splitk_configs(32, 128)) == {None}  # a shape not in the table
    # bucket 4 measured with _scaled_mm faster (None), 64 measured as split-K, 32 not swept
    table = {1: small, 4: None, 16: mid, 64: small}
    monkeypatch.setattr(fp8_linear, "SPLITK_MEASURED", {(64, 128): table})
    by_m = fp8_linear.splitk_configs(64, 128)
    assert by_m[1] == Fp8SplitKConfig(*small)
    assert all(by_m[m] is None for m in range(2, 5))
    assert all(by_m[m] == Fp8SplitKConfig(*mid) for m in range(5, 17))
    assert all(by_m[m] == Fp8SplitKConfig(*small) for m in range(17, top + 1))


def test_sweep_emit_writes_the_measured_table(tmp_path: Path) -> None:
    """``fp8_gemm_bench.py --emit F --write-source FILE`` rewrites ``SPLITK_MEASURED``: split-K
    where it beat quant + ``_scaled_mm`` by >= 3 %, None where it did not, with the reduction
    of the fastest mode (an older sweep's 7-field configs read as the reduce kernel, and its
    8-field ones as pointer loads: every entry written has all 9 fields); the new table is
    valid, ruff-formatted Python that :func:`splitk_configs` reads, and the rest of the file is
    unchanged. No TMA columns for a sweep without TMA results."""
    import json
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]

    def row(
        bf16: float, scaled: float, a16: float, a8: float, a16_inline: float | None = None
    ) -> dict[str, object]:
        cfg16, cfg8 = [16, 32, 128, 4, 4, 4, False], [16, 64, 256, 2, 3, 4, True, "kernel"]
        best: dict[str, object] = {"w8a16": [a16 * 1e-6, cfg16], "w8a8": [a8 * 1e-6, cfg8]}
        if a16_inline is not None:
            best["w8a16 inline"] = [a16_inline * 1e-6, [16, 32, 128, 4, 4, 4, False, "inline"]]
        return {"bf16": bf16 * 1e-6, "scaled_mm": scaled * 1e-6, "best": best}

    sweep = {
        "qkv": {"1": row(16, 20, 13, 14), "32": row(18, 19, 19, 18.6)},  # 32: 2 % faster, not enough
        "down": {"8": row(30, 38, 23, 22, 21), "64": row(35, 30, 31, 32, 30.5)},
    }
    data, src = tmp_path / "sweep.json", tmp_path / "fp8_linear.py"
    data.write_text(json.dumps(sweep))
    original = (repo / "surge" / "quant" / "fp8_linear.py").read_text()

    def emit(*extra: str) -> subprocess.CompletedProcess[str]:
        """``fp8_gemm_bench.py --emit`` of the sweep into a fresh copy of the engine's table."""
        return run_emit(repo, data, src, original, *extra)

    r = emit()
    assert "| qkv | 6144 x 4096 | 1 | 16.0 | 20.0 | 13.0 | 14.0 | - | - | split-K w8a16 (16," in r.stdout
    assert (
        "| down | 4096 x 12288 | 8 | 30.0 | 38.0 | 23.0 | 22.0 | 21.0 | - | split-K w8a16 inline" in r.stdout
    )
    new = src.read_text()
    assert splitk_table(src, (6144, 4096)) == {1: (16, 32, 128, 4, 4, 4, False, "kernel", False), 32: None}
    assert splitk_table(src, (4096, 12288)) == {8: (16, 32, 128, 4, 4, 4, False, "inline", False), 64: None}
    assert '1: (16, 32, 128, 4, 4, 4, False, "kernel", False),  # 16.0 / 20.0 / 13.0' in new
    assert '8: (16, 32, 128, 4, 4, 4, False, "inline", False),  # 30.0 / 38.0 / 21.0' in new
    assert "tma us" not in r.stdout
    # The emitted table must pass the repository's formatter. A GPU host may lack ruff (it is a test
    # extra, always present in CI): there the check is left to CI and the rest of the test still runs.
    if importlib.util.find_spec("ruff") is not None:
        fmt = subprocess.run(
            [sys.executable, "-m", "ruff", "format", "--check", "--line-length", "110", str(src)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert fmt.returncode == 0, fmt.stdout + fmt.stderr
    # --no-inline: the same sweep, the inline reduction's timings ignored (down 8: w8a8 at 22 us)
    r = emit("--no-inline")
    assert "| down | 4096 x 12288 | 8 | 30.0 | 38.0 | 23.0 | 22.0 | - | - | split-K w8a8 (16," in r.stdout
    assert splitk_table(src, (4096, 12288)) == {
        8: (16, 64, 256, 2, 3, 4, True, "kernel", False),
        64: None,
    }
    start, end = (
        original.index("SPLITK_MEASURED:"),
        original.index("\n}\n", original.index("SPLITK_MEASURED:")),
    )
    new_start = new.index("SPLITK_MEASURED:")
    assert new[:new_start] == original[:start]
    assert new[new.index("\n}\n", new_start) :] == original[end:]


def test_emulation_follows_the_weight_only_decode_paths() -> None:
    """The CPU emulation quantizes activations exactly where the CUDA path does: per token for
    ``_scaled_mm`` and w8a8 split-K steps, not for w8a16 split-K or the Triton decode kernel."""
    from surge.layers.linear import ReplicatedLinear
    from surge.quant.config import Fp8Config
    from surge.quant.fp8_linear import Fp8LinearMethod

    gen = torch.Generator().manual_seed(9)
    layer = ReplicatedLinear(128, 64, dtype=torch.bfloat16)
    layer.weight.data.copy_(torch.randn(64, 128, generator=gen) * 0.05)
    method = Fp8LinearMethod(Fp8Config("channel", from_checkpoint=False), emulate=True)
    method.process_weights(layer)
    layer.quant_method = method
    x = torch.randn(4, 128, generator=gen).to(torch.bfloat16)
    w8a8 = fp8_linear_reference(x, layer.weight, layer.weight_scale)
    w8a16 = fp8_linear_reference(x, layer.weight, layer.weight_scale, quantize_input=False)
    assert not torch.equal(w8a8, w8a16)
    assert torch.equal(layer(x), w8a8)
    method.splitk_by_m = (None, None, None, None, Fp8SplitKConfig(16, 16, 32, 2, 2, 4, a8=False))
    assert torch.equal(layer(x), w8a16) and torch.equal(layer(x[:3]), w8a8[:3])
    method.splitk_by_m = (None,) * 4 + (Fp8SplitKConfig(16, 16, 32, 2, 2, 4, a8=True),)
    assert torch.equal(layer(x), w8a8)
    method.splitk_by_m = ()
    method.triton_for_decode = True
    assert torch.equal(layer(x), w8a16)


def test_block_layers_take_split_k_for_decode_where_measured_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block-scaled layer whose shape is in ``SPLITK_BLOCK_FASTER`` runs decode steps through
    the split-K GEMM with its block scales (w8a16, ``block_k`` inside a scale block), larger
    steps through the weight-only Triton kernel; a shape not in it keeps that kernel for all."""
    from surge.layers.linear import ReplicatedLinear
    from surge.quant import fp8_linear
    from surge.quant.config import Fp8Config

    gen = torch.Generator().manual_seed(5)
    block = (32, 32)
    calls = record_splitk_configs(monkeypatch, block)
    monkeypatch.setattr(fp8_linear, "BLOCK_SPLITK_A8_FROM", None)
    monkeypatch.setattr(fp8_linear, "BLOCK_PREFILL_TILES", None)
    # a measured channel config for this shape at bucket 1, with a w8a8 mode and a block_k
    # larger than the scale block: the block path keeps its tiles but w8a16 and block_k 32
    monkeypatch.setattr(fp8_linear, "SPLITK_MEASURED", {(64, 128): {1: (16, 32, 64, 2, 2, 4, True)}})
    for faster in (frozenset({(64, 128)}), frozenset()):
        monkeypatch.setattr(fp8_linear, "SPLITK_BLOCK_FASTER", faster)
        layer = ReplicatedLinear(128, 64, dtype=torch.bfloat16).to(DEVICE)
        layer.weight.data.copy_(torch.randn(64, 128, generator=gen) * 0.05)
        method = fp8_linear.Fp8LinearMethod(Fp8Config("block", False, block), emulate=False)
        method.process_weights(layer)
        layer.quant_method = method
        calls.clear()
        for m in (1, 3, fp8_linear.SPLITK_MAX_M + 1):
            x = torch.randn(m, 128, generator=gen).to(torch.bfloat16)
            want = fp8_linear_reference(
                x, layer.weight.cpu(), layer.weight_scale.cpu(), block_size=block, quantize_input=False
            )
            torch.testing.assert_close(layer(x.to(DEVICE)).cpu(), want, atol=2e-2, rtol=2e-2)
        if faster:
            assert calls == [
                Fp8SplitKConfig(16, 32, 32, 2, 2, 4, False),
                fp8_linear.block_splitk_config(3, 64, 128, block),
            ]
            assert all(not c.a8 and block[1] % c.block_k == 0 for c in method.block_splitk_by_m)
        else:
            assert calls == [] and method.block_splitk_by_m == ()


def test_block_layers_w8a8_decode_and_prefill(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``BLOCK_SPLITK_A8_FROM`` and ``BLOCK_PREFILL_TILES`` set, a block-scaled layer's
    decode steps from that size on run the split-K GEMM w8a8 (activations quantized per token,
    block scales per ``K`` step), steps above ``SPLITK_MAX_M`` the prefill config (w8a8, one
    ``K`` slice), smaller ones w8a16; each matches the reference that quantizes its input
    exactly when :meth:`weight_only` says, and the CPU emulation takes the same choices."""
    from surge.layers.linear import ReplicatedLinear
    from surge.quant import fp8_linear
    from surge.quant.config import Fp8Config

    gen = torch.Generator().manual_seed(6)
    block = (32, 32)
    calls = record_splitk_configs(monkeypatch)
    monkeypatch.setattr(fp8_linear, "SPLITK_MEASURED", {(64, 128): {1: (16, 32, 64, 2, 2, 4, False)}})
    monkeypatch.setattr(fp8_linear, "SPLITK_BLOCK_FASTER", frozenset({(64, 128)}))
    monkeypatch.setattr(fp8_linear, "BLOCK_SPLITK_A8_FROM", 3)
    monkeypatch.setattr(fp8_linear, "BLOCK_PREFILL_TILES", (32, 32, 64, 1, 2, 4, True, "kernel"))
    w = torch.randn(64, 128, generator=gen) * 0.05
    layers = {}
    for emulate in (False, True):
        layer = ReplicatedLinear(128, 64, dtype=torch.bfloat16).to("cpu" if emulate else DEVICE)
        layer.weight.data.copy_(w)
        method = fp8_linear.Fp8LinearMethod(Fp8Config("block", False, block), emulate=emulate)
        method.process_weights(layer)
        layer.quant_method = method
        layers[emulate] = layer
    cuda = layers[False].quant_method
    assert isinstance(cuda, fp8_linear.Fp8LinearMethod)
    assert cuda.block_prefill == Fp8SplitKConfig(32, 32, 32, 1, 2, 4, True)  # block_k inside the block
    for m, a8 in (
        (1, False),
        (2, False),
        (3, True),
        (fp8_linear.SPLITK_MAX_M, True),
        (fp8_linear.SPLITK_MAX_M + 1, True),
    ):
        assert cuda.weight_only(m) is not a8 and layers[True].quant_method.weight_only(m) is not a8
        calls.clear()
        x = torch.randn(m, 128, generator=gen).to(torch.bfloat16)
        got = layers[False](x.to(DEVICE)).cpu()
        assert len(calls) == 1 and calls[0].a8 is a8
        if m > fp8_linear.SPLITK_MAX_M:
            assert calls[0] == cuda.block_prefill
        q = layers[False].weight.cpu(), layers[False].weight_scale.cpu()
        if a8:  # on the kernel's own quantized activations (see the w8a8 test above)
            xq, xs = per_token_quant_fp8(x.to(DEVICE))
            want = (dequantize(xq.cpu(), xs.cpu()) @ dequantize(*q, block).t()).to(torch.bfloat16)
        else:
            want = fp8_linear_reference(x, *q, block_size=block, quantize_input=False)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
        emulated = layers[True](x)
        ref = fp8_linear_reference(x, *q, block_size=block, quantize_input=a8)
        assert torch.equal(emulated, ref)
        # a w8a8 decode step also takes activations its producer quantized (same bits)
        decode_a8 = a8 and m <= fp8_linear.SPLITK_MAX_M
        assert cuda.wants_fp8_input(m, torch.bfloat16) is decode_a8
        assert layers[True].quant_method.wants_fp8_input(m, torch.bfloat16) is decode_a8
        if decode_a8:
            act = Fp8Activations(*per_token_quant_fp8(x.to(DEVICE)), torch.bfloat16)
            assert torch.equal(layers[False](act).cpu(), got)
            act_cpu = Fp8Activations(act.data.cpu(), act.scale.cpu(), torch.bfloat16)
            assert torch.equal(layers[True](act_cpu), fp8_linear_reference(act_cpu, *q, block_size=block))
    assert layers[True].quant_method.splitk_workspace_need(64) == (0, 0)


def _ulp_units(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest ``|y - ref|`` in units of ``|ref| * 2**-8 + 1e-3 * max |ref|`` (the sweep's check:
    rounding the exact result to bf16 alone gives up to 1)."""
    r = ref.double()
    return ((y.double() - r).abs() / (r.abs() * 2.0**-8 + 1e-3 * r.abs().max())).max().item()


@pytest.mark.parametrize("split,reduce", [(1, "kernel"), (2, "kernel"), (2, "inline")])
def test_w8a8_long_k_slices_match_reference(split: int, reduce: str) -> None:
    """Issue 13's trigger shape (down_proj at M = 64: K = 12288, one or two K slices of 12288 or
    6144, ``block_m`` 64), N shrunk to 32: masks, offsets and the K loop are right (this runs the
    interpreter's exact fp32 sums; the GPU's FP8 accumulation is pinned by the next test)."""
    m, n, k = 64, 32, 12288
    x, w, s, _ = _problem(m, n, k, torch.bfloat16, seed=13)
    cfg = Fp8SplitKConfig(64, 32, 128, split, 4, 4, True, reduce)  # type: ignore[arg-type]
    out = fp8_linear_splitk(x.to(DEVICE), w.to(DEVICE), s.to(DEVICE), config=cfg).cpu()
    xq, xs = per_token_quant_fp8(x.to(DEVICE))
    ref = dequantize(xq.cpu(), xs.cpu()).double() @ dequantize(w, s).double().t()
    assert _ulp_units(out, ref) <= 1.01


_COMPILE_SM90 = """
import re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from surge.kernels.fp8_gemm_splitk import FP8_PROMOTE_K, _fp8_splitk_kernel as kern

for block_scales in (False, True):
    const = dict(A8=True, PARTIALS=False, INLINE=False, BLOCK_SCALES=block_scales, SCALE_BN=128,
                 SCALE_BK=128, HAS_BIAS=False, EVEN_K=True, DOT_IEEE=False,
                 PROMOTE_K=min(128, FP8_PROMOTE_K), BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, TMA=False, GATED=False)
    const = {a: v for a, v in const.items() if a in kern.arg_names}
    ptr = {"y_ptr": "*bf16", "p_ptr": "*fp32", "cnt_ptr": "*i32", "x_ptr": "*fp8e4nv",
           "w_ptr": "*fp8e4nv", "w_desc": "*fp8e4nv"}
    sig = {a: "constexpr" if a in const else ptr.get(a, "*fp32" if a.endswith("_ptr") else "i32")
           for a in kern.arg_names}
    k = triton.compile(ASTSource(kern, sig, constexprs=const), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4, "num_stages": 4})
    dots = [ln for ln in k.asm["ttgir"].splitlines() if "ttng.warp_group_dot " in ln]
    print(block_scales, [int(v) for d in dots for v in re.findall(r"maxNumImpreciseAcc = (\\d+)", d)])
"""


def test_fp8_dots_promote_to_fp32_every_128_on_hopper() -> None:
    """The cause of issue 13: on sm90 (``block_m`` 64, so ``wgmma``) Triton's default lets an
    FP8 x FP8 ``tl.dot`` chain accumulate the whole ``K`` slice in the tensor cores'
    reduced-precision accumulator (``maxNumImpreciseAcc`` 2**30). Compiled here for sm90 (no GPU
    needed, outside the interpreter): every ``warp_group_dot`` of the w8a8 kernel, per-channel
    and block scales, promotes to fp32 at most every 128 elements of ``K``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE_SM90], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.split("\n")[:2]
    assert lines[0].startswith("False [") and lines[1].startswith("True [")
    for line in lines:
        limits = [int(v) for v in line.split("[")[1].rstrip("]").split(",")]
        assert limits and all(v <= 128 for v in limits), line
