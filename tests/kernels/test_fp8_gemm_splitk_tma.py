"""TMA weight loads of the split-K FP8 GEMM (``Fp8SplitKConfig.tma``) without a GPU: under
Triton's CPU interpreter (which emulates tensor descriptors) the TMA mode gives the pointer
mode's bits across operand modes, split-K reductions, ragged tiles, block scales, bias and
pre-quantized input; the launcher refuses what TMA cannot load; the measured table takes old
8-field and new 9-field entries; and compiled for sm90 (outside the interpreter) the TMA mode
really loads its weight tiles with TMA, after the PDL wait."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from surge.kernels import fp8_gemm_splitk
from surge.kernels.fp8_gemm_splitk import (
    Fp8SplitKConfig,
    SplitKWorkspace,
    check_tma_weight,
    fp8_linear_splitk,
    splitk_workspace_size,
    tma_supported,
)
from surge.kernels.fp8_quant import per_token_quant_fp8
from surge.quant.fp8 import dequantize, fp8_linear_reference, quantize_block, quantize_per_channel
from tests.kernels.emit_utils import run_emit, splitk_table
from tests.kernels.splitk_spy import record_splitk_configs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not tma_supported("cuda"), reason="TMA needs sm90+ (or the CPU interpreter)"
)


def _problem(
    m: int, n: int, k: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w, s = quantize_per_channel(torch.randn(n, k, generator=gen) * 0.05)
    bias = (torch.randn(n, generator=gen) * 0.1).to(dtype)
    return x.to(DEVICE), w.to(DEVICE), s.to(DEVICE), bias.to(DEVICE)


def _both(
    x: torch.Tensor,
    w: torch.Tensor,
    s: torch.Tensor,
    b: torch.Tensor | None,
    cfg: Fp8SplitKConfig,
    **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pointer-load and TMA results of ``cfg`` (the inline reduction on a fresh workspace
    each, sized for the call)."""
    outs = []
    for tma in (False, True):
        c = replace(cfg, tma=tma)
        ws = SplitKWorkspace.allocate(*splitk_workspace_size(x.shape[0], w.shape[0], c), x.device)
        outs.append(fp8_linear_splitk(x, w, s, b, config=c, workspace=ws, **kwargs))  # type: ignore[arg-type]
    return outs[0], outs[1]


SPLITS = [(1, "kernel"), (2, "kernel"), (2, "inline"), (4, "kernel"), (4, "inline")]


@pytest.mark.parametrize(
    "m,n,k",
    [
        (1, 64, 256),  # even tiles
        (3, 40, 160),  # N not a multiple of BLOCK_N, ragged K slices (a step past K)
        (20, 72, 96),  # two M tiles, ragged N
    ],
)
@pytest.mark.parametrize("split,reduce", SPLITS)
@pytest.mark.parametrize("a8", [False, True])
def test_tma_equals_pointer_loads_bitwise(m: int, n: int, k: int, split: int, reduce: str, a8: bool) -> None:
    """The same tiles, dots and summation order: TMA weight loads give the pointer loads' bits,
    both within the reference's tolerance (so neither is wrong in the same way)."""
    x, w, s, bias = _problem(m, n, k, torch.bfloat16, seed=m + n + k + split)
    cfg = Fp8SplitKConfig(16, 32, 32, split, 2, 4, a8, reduce)  # type: ignore[arg-type]
    for b in (None, bias):
        ptr, tma = _both(x, w, s, b, cfg)
        assert tma.shape == (m, n) and tma.dtype == torch.bfloat16
        assert torch.equal(tma, ptr), (cfg, b is None)
        want = fp8_linear_reference(
            x.cpu(), w.cpu(), s.cpu(), None if b is None else b.cpu(), quantize_input=a8
        )
        torch.testing.assert_close(tma.cpu(), want, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("split,reduce", [(1, "kernel"), (3, "kernel"), (3, "inline")])
def test_tma_equals_pointer_loads_fp32_activations(split: int, reduce: str) -> None:
    """w8a16 with fp32 activations (the IEEE dot) and a 16-row weight tile."""
    x, w, s, bias = _problem(5, 48, 192, torch.float32, seed=11)
    cfg = Fp8SplitKConfig(16, 16, 32, split, 2, 4, False, reduce)  # type: ignore[arg-type]
    ptr, tma = _both(x, w, s, bias, cfg)
    assert torch.equal(tma, ptr)
    want = fp8_linear_reference(x.cpu(), w.cpu(), s.cpu(), bias.cpu(), quantize_input=False)
    torch.testing.assert_close(tma.cpu(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "m,n,k,block,block_k,split,reduce",
    [
        (1, 64, 256, (32, 64), 32, 4, "kernel"),  # two steps per scale block
        (3, 40, 160, (32, 32), 32, 3, "inline"),  # partial last N block, ragged K slices
        (17, 96, 128, (32, 128), 32, 2, "inline"),  # two M tiles
        (2, 48, 192, (8, 64), 64, 1, "kernel"),  # one launch, several N blocks per tile
    ],
)
@pytest.mark.parametrize("a8", [False, True])
def test_tma_equals_pointer_loads_with_block_scales(
    m: int, n: int, k: int, block: tuple[int, int], block_k: int, split: int, reduce: str, a8: bool
) -> None:
    gen = torch.Generator().manual_seed(m + n + k)
    w, s = quantize_block(torch.randn(n, k, generator=gen) * 0.05, block)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    bias = (torch.randn(n, generator=gen) * 0.1).to(torch.bfloat16)
    x, w, s, bias = x.to(DEVICE), w.to(DEVICE), s.to(DEVICE), bias.to(DEVICE)
    cfg = Fp8SplitKConfig(16, 32, block_k, split, 2, 4, a8, reduce)  # type: ignore[arg-type]
    ptr, tma = _both(x, w, s, bias, cfg, block_size=block)
    assert torch.equal(tma, ptr)
    xr = dequantize(*per_token_quant_fp8(x)) if a8 else x.float()
    ref = xr.cpu() @ dequantize(w.cpu(), s.cpu(), block).t() + bias.cpu().float()
    torch.testing.assert_close(tma.cpu().float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("split,reduce", [(1, "kernel"), (2, "kernel"), (4, "inline")])
def test_tma_with_pre_quantized_input(split: int, reduce: str) -> None:
    """``x_scale`` input (a fused producer's FP8 activations): TMA equals pointer loads, and
    both equal the call that quantizes ``x`` itself."""
    x, w, s, bias = _problem(6, 56, 128, torch.bfloat16, seed=5)
    xq, xs = per_token_quant_fp8(x)
    cfg = Fp8SplitKConfig(16, 32, 32, split, 2, 4, True, reduce)  # type: ignore[arg-type]
    ptr, tma = _both(xq, w, s, bias, cfg, x_scale=xs, out_dtype=torch.bfloat16)
    assert torch.equal(tma, ptr)
    own = fp8_linear_splitk(x, w, s, bias, config=replace(cfg, tma=True))
    assert torch.equal(tma, own)


def test_tma_inline_reduction_over_repeated_calls_on_one_workspace() -> None:
    """Four calls in a row on one workspace with stale partials: the same bits every time, the
    counters zero after each."""
    x, w, s, bias = _problem(3, 64, 256, torch.bfloat16, seed=2)
    cfg = Fp8SplitKConfig(16, 32, 32, 4, 2, 4, False, "inline", tma=True)
    ws = SplitKWorkspace.allocate(*splitk_workspace_size(3, 64, cfg), DEVICE)
    ws.partials.fill_(float("nan"))
    want = fp8_linear_splitk(x, w, s, bias, config=replace(cfg, tma=False, reduce="kernel"))
    for _ in range(4):
        assert torch.equal(fp8_linear_splitk(x, w, s, bias, config=cfg, workspace=ws), want)
        assert int(ws.counters.abs().sum()) == 0


def test_tma_with_zero_sized_operands() -> None:
    """``M = 0`` and ``N = 0`` return empty outputs; ``K = 0`` (nothing to load) gives the bias."""
    cfg = Fp8SplitKConfig(16, 16, 32, 2, 2, 4, tma=True)
    x, w, s, bias = _problem(2, 32, 64, torch.bfloat16, seed=1)
    assert fp8_linear_splitk(x[:0], w, s, config=cfg).shape == (0, 32)
    empty_w = torch.empty(0, 64, dtype=w.dtype, device=DEVICE)
    assert fp8_linear_splitk(x, empty_w, s[:0], config=cfg).shape == (2, 0)
    x0 = torch.empty(2, 0, dtype=x.dtype, device=DEVICE)
    w0 = torch.empty(32, 0, dtype=w.dtype, device=DEVICE)
    out = fp8_linear_splitk(x0, w0, s, bias, config=replace(cfg, split_k=1))
    assert torch.equal(out, bias.expand(2, 32))


def test_launcher_refuses_what_tma_cannot_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row stride or base address not 16-byte aligned is a ValueError (the pointer loads
    take both); outside the interpreter, a device without sm90 is one too."""
    cfg = Fp8SplitKConfig(16, 16, 16, 1, 2, 4, tma=True)
    x, w, s, _ = _problem(2, 32, 40, torch.bfloat16, seed=3)  # rows of 40 bytes
    with pytest.raises(ValueError, match="16-byte aligned"):
        fp8_linear_splitk(x, w, s, config=cfg)
    want = fp8_linear_reference(x.cpu(), w.cpu(), s.cpu(), quantize_input=False)
    torch.testing.assert_close(
        fp8_linear_splitk(x, w, s, config=replace(cfg, tma=False)).cpu(), want, atol=2e-2, rtol=2e-2
    )
    x, w, s, _ = _problem(2, 32, 64, torch.bfloat16, seed=3)
    buf = torch.empty(32 * 64 + 1, dtype=w.dtype, device=DEVICE)
    shifted = buf[1:].view(32, 64)  # base one byte past an aligned address, rows of 64 bytes
    shifted.copy_(w)
    with pytest.raises(ValueError, match="16-byte aligned"):
        fp8_linear_splitk(x, shifted, s, config=cfg)
    want = fp8_linear_reference(x.cpu(), w.cpu(), s.cpu(), quantize_input=False)
    for got in (
        fp8_linear_splitk(x, shifted, s, config=replace(cfg, tma=False)),
        fp8_linear_splitk(x, w, s, config=cfg),
    ):
        torch.testing.assert_close(got.cpu(), want, atol=2e-2, rtol=2e-2)
    # the device check: a CPU weight outside the interpreter (and the launcher's use of it)
    with pytest.raises(ValueError, match="capability >= 9.0"):
        check_tma_weight(torch.empty(16, 16, dtype=w.dtype), interpreting=False)
    check_tma_weight(torch.empty(16, 16, dtype=w.dtype), interpreting=True)
    assert not tma_supported("cpu")
    if DEVICE == "cpu":

        class NotTheInterpreter:
            pass

        monkeypatch.setattr(fp8_gemm_splitk, "InterpretedFunction", NotTheInterpreter)
        with pytest.raises(ValueError, match="capability >= 9.0"):
            fp8_linear_splitk(x, w, s, config=cfg)


def test_measured_table_takes_old_and_new_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SPLITK_MEASURED`` entries of 8 fields (written before ``tma`` existed: pointer loads)
    and of 9 fields (``tma`` explicit) both build their configs."""
    from surge.quant import fp8_linear

    old = (16, 32, 128, 4, 4, 4, False, "inline")
    new = (16, 64, 128, 2, 4, 4, True, "kernel", True)
    plain = (16, 64, 128, 2, 4, 4, True, "kernel", False)
    monkeypatch.setattr(fp8_linear, "SPLITK_MEASURED", {(64, 128): {1: old, 16: new, 64: plain}})
    by_m = fp8_linear.splitk_configs(64, 128)
    assert by_m[1] == Fp8SplitKConfig(16, 32, 128, 4, 4, 4, False, "inline") and not by_m[1].tma
    assert all(by_m[m] == Fp8SplitKConfig(16, 64, 128, 2, 4, 4, True, "kernel", True) for m in range(2, 17))
    assert all(by_m[m] is not None and not by_m[m].tma for m in range(17, 65))  # type: ignore[union-attr]


def test_engine_layer_runs_a_tma_entry_and_drops_it_where_tma_cannot_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A layer whose table entry selects TMA runs it where the weight allows TMA (the interpreter
    here: the launcher is asked for ``tma``); where :func:`check_tma_weight` refuses (a CPU
    weight outside the interpreter, a pre-Hopper GPU) the layer takes the pointer-load twin, the
    same bits; a table without TMA entries is left as is."""
    from surge.layers.linear import ReplicatedLinear
    from surge.quant import fp8_linear
    from surge.quant.config import Fp8Config

    monkeypatch.setattr(
        fp8_linear,
        "SPLITK_MEASURED",
        {
            (64, 128): {
                1: (16, 32, 32, 2, 2, 4, False, "kernel", True),
                16: (16, 32, 32, 4, 2, 4, True, "inline"),
            }
        },
    )
    calls = record_splitk_configs(monkeypatch)
    x = torch.randn(1, 128, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16).to(DEVICE)
    results = {}
    for refuse in (False, True):
        if refuse:

            def no_tma(weight: torch.Tensor, interpreting: bool | None = None) -> None:
                raise ValueError("no TMA here")

            monkeypatch.setattr(fp8_gemm_splitk, "check_tma_weight", no_tma)
        layer = ReplicatedLinear(128, 64, dtype=torch.bfloat16).to(DEVICE)
        layer.weight.data.copy_(torch.randn(64, 128, generator=torch.Generator().manual_seed(1)) * 0.05)
        method = fp8_linear.Fp8LinearMethod(Fp8Config("channel", from_checkpoint=False), emulate=False)
        method.process_weights(layer)
        layer.quant_method = method
        assert [c.tma for c in method.splitk_by_m[:2]] == [not refuse, not refuse]  # type: ignore[union-attr]
        assert all(c is not None and not c.tma for c in method.splitk_by_m[2:17])
        calls.clear()
        results[refuse] = layer(x)
        assert [c.tma for c in calls] == [not refuse]
        want = fp8_linear_reference(
            x.cpu(), layer.weight.cpu(), layer.weight_scale.cpu(), quantize_input=False
        )
        torch.testing.assert_close(results[refuse].cpu(), want, atol=2e-2, rtol=2e-2)
    assert torch.equal(results[False], results[True])


_COMPILE_SM90_TMA = """
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from surge.kernels.fp8_gemm_splitk import FP8_PROMOTE_K, _fp8_splitk_kernel as kern

out = []
# (a8, block_scales, partials, inline, block_m, block_n, block_k, even_k)
cases = [(True, False, False, False, 64, 64, 128, True), (False, False, True, True, 16, 64, 128, False),
         (True, False, True, False, 16, 32, 512, True), (False, True, True, True, 16, 64, 128, True)]
for a8, block_scales, partials, inline, bm, bn, bk, even in cases:
    for tma in (False, True):
        const = dict(A8=a8, PARTIALS=partials, INLINE=inline, BLOCK_SCALES=block_scales,
                     SCALE_BN=128 if block_scales else 1, SCALE_BK=128 if block_scales else 1,
                     HAS_BIAS=True, EVEN_K=even, DOT_IEEE=False, PROMOTE_K=min(bk, FP8_PROMOTE_K),
                     BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, TMA=tma, GATED=False, PDL=True)
        ptr = {"y_ptr": "*bf16", "p_ptr": "*fp32", "cnt_ptr": "*i32", "b_ptr": "*bf16",
               "x_ptr": "*fp8e4nv" if a8 else "*bf16", "w_ptr": "*fp8e4nv",
               "w_desc": f"tensordesc<fp8e4nv[{bn}, {bk}]>" if tma else "*fp8e4nv"}
        sig = {a: "constexpr" if a in const else ptr.get(a, "*fp32" if a.endswith("_ptr") else "i32")
               for a in kern.arg_names}
        # what the launch specializes: 16-byte aligned pointers, N, K and row strides multiples of 16
        div = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(kern.arg_names)
               if a.endswith("_ptr") or a in ("N", "K", "stride_xm", "stride_wn", "stride_ym")}
        k = triton.compile(ASTSource(kern, sig, constexprs=const, attrs=div),
                           target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 4, "num_stages": 4, "launch_pdl": True})
        ttgir, ptx = k.asm["ttgir"], k.asm["ptx"]
        first_tma = ptx.find("cp.async.bulk.tensor")
        out.append(dict(tma=tma, bk=bk,
                        tma_copies=ttgir.count("ttng.async_tma_copy_global_to_local"),
                        cp_async=ttgir.count("ttg.async_copy_global_to_local"),
                        wait_first=0 <= ptx.find("griddepcontrol.wait") < (first_tma if first_tma >= 0 else len(ptx))))
print(json.dumps(out))
"""


def test_tma_mode_compiles_to_tma_loads_on_sm90() -> None:
    """Compiled for sm90 as the launcher specializes it (no GPU needed, outside the interpreter):
    the TMA mode's weight tiles are TMA copies (``cp.async.bulk.tensor``), pipelined, with the
    activations still ``cp.async``; the pointer mode has no TMA copy; both wait for the
    predecessor grid (PDL) before their first copy. Covers w8a8 with ``wgmma`` (``block_m`` 64),
    w8a16, ragged ``K``, a ``block_k`` of 512 (wider than one TMA box row of 128 bytes), block
    scales and both split-K reductions."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE_SM90_TMA], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 8
    for r in results:
        assert r["wait_first"], r
        if r["tma"]:
            assert r["tma_copies"] >= 2 and r["cp_async"] >= 1, r  # pipelined weights, x by cp.async
        else:
            assert r["tma_copies"] == 0 and r["cp_async"] >= 2, r


def _bench_module() -> object:
    """``benchmarks/fp8_gemm_bench.py`` as a module (not a package; its kernels are this
    process's, i.e. the interpreter's)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "fp8_gemm_bench.py"
    spec = importlib.util.spec_from_file_location("fp8_gemm_bench_for_tests", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sweep_tries_a_tma_twin_of_every_config_and_keys_it_apart() -> None:
    bench = _bench_module()
    plain = bench.sweep_configs(1, 4096, False)  # type: ignore[attr-defined]
    both = bench.sweep_configs(1, 4096, False, True)  # type: ignore[attr-defined]
    assert plain and not any(c.tma for c in plain)
    assert [c for c in both if not c.tma] == plain
    assert [replace(c, tma=False) for c in both if c.tma] == plain
    assert both[1] == replace(both[0], tma=True)  # each twin right after its pointer config
    assert bench.sweep_tma(True)  # type: ignore[attr-defined]  # --check: the interpreter emulates TMA
    assert bench.sweep_tma(False) == tma_supported("cuda")  # type: ignore[attr-defined]
    mode_of = bench.mode_of  # type: ignore[attr-defined]
    cfg = Fp8SplitKConfig(16, 32, 128, 4, 4, 4, True, "inline")
    assert mode_of(cfg) == "w8a8 inline" and mode_of(replace(cfg, tma=True)) == "w8a8 inline tma"
    assert mode_of(replace(cfg, a8=False, split_k=1, tma=True)) == "w8a16 tma"
    assert len({mode_of(c) for c in both}) == 8


def test_wide_sweep_times_the_shipped_config_first_and_only_configs_the_default_sweep_leaves_out() -> None:
    """``--wide``: the engine's config for the bucket first (the same run's baseline), then w8a8
    configs with 8 warps, 5-6 stages or 256-column tiles, each with its TMA twin, all within the
    sweep's shared-memory budget and none that the default sweep already times."""
    from surge.quant.fp8_linear import splitk_configs

    bench = _bench_module()
    n, k = 4096, 12288  # down
    for m in (4, 16, 32, 64):
        wide = bench.wide_sweep_configs(m, n, k, False, True)  # type: ignore[attr-defined]
        shipped = splitk_configs(n, k)[m]
        assert shipped is not None and wide[0] == shipped
        default = set(bench.sweep_configs(m, k, False, True))  # type: ignore[attr-defined]
        rest = wide[1:]
        assert rest and len(set(rest)) == len(rest) and not default & set(rest)
        assert all(c.a8 and (c.num_warps == 8 or c.num_stages > 4 or c.block_n == 256) for c in rest)
        assert {c.block_m for c in rest} == {16 if m <= 16 else 32 if m <= 32 else 64}
        assert all(k % (c.split_k * c.block_k) == 0 for c in rest)
        budget = bench.SMEM_BUDGET  # type: ignore[attr-defined]
        assert all(c.num_stages * (c.block_n * c.block_k + c.block_m * c.block_k) <= budget for c in rest)
        assert {replace(c, tma=False) for c in rest if c.tma} == {c for c in rest if not c.tma}
    tiny = bench.wide_sweep_configs(16, 64, 64, True, True)  # type: ignore[attr-defined]
    assert tiny and all(c.block_n in (16, 32) and c.block_k in (16, 32) for c in tiny)  # --check


def test_emit_chooses_among_tma_and_pointer_configs(tmp_path: object) -> None:
    """``--emit`` on a sweep with TMA results: TMA columns, a TMA config chosen where fastest
    and written with ``tma`` True; ``--no-tma`` (with or without ``--no-inline``) chooses among
    the pointer-load configs; the written table is what :func:`splitk_configs` reads."""
    import json
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    repo = Path(__file__).resolve().parents[2]
    c16 = [16, 32, 128, 4, 4, 4, False, "kernel", False]
    c16i = [16, 32, 128, 4, 4, 4, False, "inline", False]

    def row(scaled: float, best: dict[str, tuple[float, list[object]]]) -> dict[str, object]:
        return {
            "bf16": 30e-6,
            "scaled_mm": scaled * 1e-6,
            "best": {m: [t * 1e-6, c] for m, (t, c) in best.items()},
        }

    sweep = {
        "o": {
            "1": row(
                20,
                {
                    "w8a16": (13, c16),
                    "w8a16 tma": (11, [*c16[:8], True]),
                    "w8a16 inline": (12, c16i),
                    "w8a16 inline tma": (11.5, [*c16i[:8], True]),
                },
            ),
            "16": row(20, {"w8a16": (13, c16), "w8a16 tma": (14, [*c16[:8], True])}),
        }
    }
    data, src = tmp_path / "sweep.json", tmp_path / "fp8_linear.py"
    data.write_text(json.dumps(sweep))
    original = (repo / "surge" / "quant" / "fp8_linear.py").read_text()

    def emit(*extra: str) -> tuple[str, dict[int, tuple[object, ...] | None]]:
        return run_emit(repo, data, src, original, *extra).stdout, splitk_table(src, (4096, 4096))

    out, table = emit()
    assert "| w8a16 tma us | w8a8 tma us | w8a16 inline tma us | w8a8 inline tma us | chosen |" in out
    assert (
        "| o | 4096 x 4096 | 1 | 30.0 | 20.0 | 13.0 | - | 12.0 | - | 11.0 | - | 11.5 | - | split-K w8a16 tma"
        in out
    )
    assert table == {
        1: (16, 32, 128, 4, 4, 4, False, "kernel", True),
        16: (16, 32, 128, 4, 4, 4, False, "kernel", False),
    }
    assert '1: (16, 32, 128, 4, 4, 4, False, "kernel", True),  # 30.0 / 20.0 / 11.0' in src.read_text()
    out, table = emit("--no-tma")
    assert "tma us" not in out and table[1] == (16, 32, 128, 4, 4, 4, False, "inline", False)
    out, table = emit("--no-inline")
    assert table[1] == (16, 32, 128, 4, 4, 4, False, "kernel", True)
    out, table = emit("--no-tma", "--no-inline")
    assert table[1] == (16, 32, 128, 4, 4, 4, False, "kernel", False)


def test_tma_supported_only_on_nvidia_sm90_and_newer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device rule, with the CUDA queries stubbed: sm90 and sm100 yes, sm89 no, a ROCm
    device reporting capability 9.x no, a CPU device no."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    for cap, want in (((9, 0), True), ((10, 0), True), ((8, 9), False)):
        monkeypatch.setattr(fp8_gemm_splitk, "_capability", lambda index, cap=cap: cap)
        assert tma_supported("cuda:0") is want, cap
    assert not tma_supported("cpu")
    monkeypatch.setattr(torch.version, "hip", "6.4")
    assert not tma_supported("cuda:0")
