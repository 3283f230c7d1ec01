"""The split-K FP8 GEMM against the torch reference of :mod:`surge.quant.fp8`: w8a16 and w8a8,
one launch and split-K with the reduce kernel, even and ragged ``K`` slices, bias, tails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from surge.kernels.fp8_gemm_splitk import Fp8SplitKConfig, default_splitk_config, fp8_linear_splitk
from surge.kernels.fp8_quant import per_token_quant_fp8
from surge.quant.fp8 import dequantize, fp8_linear_reference, quantize_block, quantize_per_channel

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
    where it beat quant + ``_scaled_mm`` by >= 3 %, None where it did not; the new table is
    valid Python that :func:`splitk_configs` reads, and the rest of the file is unchanged."""
    import ast
    import json
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]

    def row(bf16: float, scaled: float, a16: float, a8: float) -> dict[str, object]:
        cfg16, cfg8 = [16, 32, 128, 4, 4, 4, False], [16, 64, 256, 2, 3, 4, True]
        best = {"w8a16": [a16 * 1e-6, cfg16], "w8a8": [a8 * 1e-6, cfg8]}
        return {"bf16": bf16 * 1e-6, "scaled_mm": scaled * 1e-6, "best": best}

    sweep = {
        "qkv": {"1": row(16, 20, 13, 14), "32": row(18, 19, 19, 18.6)},  # 32: 2 % faster, not enough
        "down": {"8": row(30, 38, 23, 22), "64": row(35, 30, 31, 32)},
    }
    data, src = tmp_path / "sweep.json", tmp_path / "fp8_linear.py"
    data.write_text(json.dumps(sweep))
    original = (repo / "surge" / "quant" / "fp8_linear.py").read_text()
    src.write_text(original)
    r = subprocess.run(
        [sys.executable, "benchmarks/fp8_gemm_bench.py", "--emit", str(data), "--write-source", str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert r.returncode == 0, r.stderr
    assert "| qkv | 6144 x 4096 | 1 | 16.0 | 20.0 | 13.0 | 14.0 | split-K w8a16" in r.stdout
    new = src.read_text()
    tree = ast.parse(new)
    node = next(
        n
        for n in tree.body
        if isinstance(n, ast.AnnAssign)
        and isinstance(n.target, ast.Name)
        and n.target.id == "SPLITK_MEASURED"
    )
    table = ast.literal_eval(node.value)
    assert table == {
        (6144, 4096): {1: (16, 32, 128, 4, 4, 4, False), 32: None},
        (4096, 12288): {8: (16, 64, 256, 2, 3, 4, True), 64: None},
    }
    assert "1: (16, 32, 128, 4, 4, 4, False),  # 16.0 / 20.0 / 13.0" in new
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
    from surge.kernels import fp8_gemm_splitk
    from surge.layers.linear import ReplicatedLinear
    from surge.quant import fp8_linear
    from surge.quant.config import Fp8Config

    gen = torch.Generator().manual_seed(5)
    block = (32, 32)
    calls: list[Fp8SplitKConfig] = []
    real = fp8_gemm_splitk.fp8_linear_splitk

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(kwargs["config"])  # type: ignore[arg-type]
        assert kwargs["block_size"] == block
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fp8_gemm_splitk, "fp8_linear_splitk", spy)
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
