"""Programmatic dependent launch (PDL) on a decode-shaped chain of Surge's FP8 kernels.

Builds ``--layers`` Qwen3-8B-shaped FP8 decoder layers with distinct random weights (so L2 never
holds a weight across replays) and times, inside one CUDA graph, the chain of Surge kernels a
decode step runs per layer at ``M`` tokens::

    add_rmsnorm(_fp8) -> qkv split-K -> silu_and_mul (a small kernel standing in for attention)
    -> o split-K -> add_rmsnorm(_fp8) -> gate_up split-K -> silu_and_mul(_fp8) -> down split-K

then one final ``add_rmsnorm``, with the tiles the engine takes
(:func:`surge.quant.fp8_linear.splitk_configs`), once with every kernel launched the ordinary
way, once with PDL (:mod:`surge.kernels.pdl`), and once with PDL and the split-K reductions of
o and down fused into the next add + RMSNorm (where their config reduces with a second launch:
:func:`surge.kernels.fp8_gemm_splitk.fp8_linear_splitk_partials` then
:func:`surge.kernels.add_rmsnorm.add_rmsnorm_partials`, as the engine runs them), and checks
that all give the same bits. Writes one JSON line per (M, variant).

``--sweep`` instead searches the GEMM tiles *in the chain* (the engine's variant: PDL and fused
reductions): per ``M``, starting from the table's configs, one pass of coordinate descent over
gate_up, down, qkv and o, each trying its ``split_k`` halved, doubled and 1, its ``block_n``
halved and doubled, and the other reduction, and keeping a change that makes the chain at
least 1 % faster (the table was measured one GEMM at a time, without its neighbours).

Run on an sm90 GPU from the repository root::

    python3 benchmarks/pdl_bench.py --m 1 16 64
    python3 benchmarks/pdl_bench.py --m 1 16 64 --sweep --json OUT.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import astuple, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemm_bench import time_graph  # noqa: E402

from surge.kernels.add_rmsnorm import (  # noqa: E402
    add_rmsnorm,
    add_rmsnorm_fp8,
    add_rmsnorm_partials,
    add_rmsnorm_partials_fp8,
)
from surge.kernels.fp8_gemm_splitk import (  # noqa: E402
    Fp8SplitKConfig,
    SplitKWorkspace,
    fp8_linear_splitk,
    fp8_linear_splitk_partials,
    splitk_workspace_size,
)
from surge.kernels.silu_and_mul import silu_and_mul, silu_and_mul_fp8  # noqa: E402
from surge.quant.fp8 import SplitKPartials, quantize_per_channel  # noqa: E402
from surge.quant.fp8_linear import splitk_configs  # noqa: E402

HIDDEN, QKV, INTER = 4096, 6144, 12288
SHAPES = {
    "qkv": (QKV, HIDDEN),
    "o": (HIDDEN, HIDDEN),
    "gate_up": (2 * INTER, HIDDEN),
    "down": (HIDDEN, INTER),
}


def build_layers(n: int, device: str) -> list[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """``n`` layers of random FP8 weights (per-channel scales) and bf16 norm weights."""
    layers = []
    for _ in range(n):
        layer = {}
        for name, (rows, cols) in SHAPES.items():
            w = torch.randn(rows, cols, device=device, dtype=torch.bfloat16) * cols**-0.5
            layer[name] = quantize_per_channel(w)
        layer["norm"] = (torch.ones(HIDDEN, device=device, dtype=torch.bfloat16), torch.empty(0))
        layers.append(layer)
    return layers


def make_chain(
    layers: list[dict[str, tuple[torch.Tensor, torch.Tensor]]],
    x0: torch.Tensor,
    pdl: bool,
    ws: SplitKWorkspace,
    fuse_reduce: bool = False,
    overrides: dict[str, Fp8SplitKConfig] | None = None,
) -> Callable[[], torch.Tensor]:
    """The per-layer kernel chain at ``x0``'s ``M``, launched with or without PDL; with
    ``fuse_reduce`` the o and down GEMMs whose config reduces with a second launch hand their
    partials to the next add + RMSNorm instead. ``overrides`` replaces the table's config of
    the GEMMs it names."""
    m = x0.shape[0]
    cfg = {name: splitk_configs(n, k)[m] for name, (n, k) in SHAPES.items()}
    cfg.update(overrides or {})
    for name, c in cfg.items():
        if c is None:
            raise SystemExit(f"no split-K config for {name} at M={m}")

    def gemm(
        name: str, layer: dict, x: torch.Tensor, xs: torch.Tensor | None
    ) -> torch.Tensor | SplitKPartials:
        w, s = layer[name]
        c = cfg[name]
        if xs is not None and not c.a8:
            raise SystemExit(f"{name}: FP8 input to a w8a16 config")
        if fuse_reduce and name in ("o", "down") and c.split_k > 1 and c.reduce == "kernel":
            return fp8_linear_splitk_partials(
                x,
                w,
                s,
                config=c,
                x_scale=xs,
                out_dtype=torch.bfloat16 if xs is not None else None,
                pdl=pdl,
            )
        return fp8_linear_splitk(
            x,
            w,
            s,
            config=c,
            workspace=ws,
            x_scale=xs,
            out_dtype=torch.bfloat16 if xs is not None else None,
            pdl=pdl,
        )

    def norm(x: torch.Tensor | SplitKPartials, res: torch.Tensor, weight: torch.Tensor, a8: bool):
        if isinstance(x, SplitKPartials):
            if a8:
                return add_rmsnorm_partials_fp8(x, weight, 1e-6, res, pdl=pdl)
            y, r = add_rmsnorm_partials(x, weight, 1e-6, res, pdl=pdl)
            return y, None, r
        if a8:
            q, s, r = add_rmsnorm_fp8(x, weight, 1e-6, res, pdl=pdl)
            return q, s, r
        y, r = add_rmsnorm(x, weight, 1e-6, res, pdl=pdl)
        return y, None, r

    def run() -> torch.Tensor:
        x, res = x0, torch.zeros_like(x0)
        for layer in layers:
            nw = layer["norm"][0]
            h, hs, res = norm(x, res, nw, cfg["qkv"].a8)
            qkv = gemm("qkv", layer, h, hs)
            assert isinstance(qkv, torch.Tensor)
            a, _ = add_rmsnorm(qkv[:, :HIDDEN], nw, 1e-6, None, pdl=pdl)
            o = gemm("o", layer, a, None)
            h, hs, res = norm(o, res, nw, cfg["gate_up"].a8)
            gu = gemm("gate_up", layer, h, hs)
            assert isinstance(gu, torch.Tensor)
            if cfg["down"].a8:
                act, acts = silu_and_mul_fp8(gu, pdl=pdl)
            else:
                act, acts = silu_and_mul(gu, pdl=pdl), None
            x = gemm("down", layer, act, acts)
        y, _, _ = norm(x, res, layers[-1]["norm"][0], False)
        return y

    return run


def candidates(c: Fp8SplitKConfig, k: int) -> list[Fp8SplitKConfig]:
    """The neighbours of ``c`` that ``--sweep`` tries for a GEMM of depth ``k``: ``split_k``
    halved, doubled and 1 (each slice at least one ``block_k`` step), ``block_n`` halved and
    doubled (16..128), and the other reduction when it splits."""
    out = []
    for split in {max(1, c.split_k // 2), c.split_k * 2, 1} - {c.split_k}:
        if k >= split * c.block_k:
            out.append(replace(c, split_k=split))
    for bn in {c.block_n // 2, c.block_n * 2} & {16, 32, 64, 128}:
        out.append(replace(c, block_n=bn))
    if c.split_k > 1:
        out.append(replace(c, reduce="kernel" if c.reduce == "inline" else "inline"))
    return out


def sweep(
    layers: list[dict[str, tuple[torch.Tensor, torch.Tensor]]],
    m: int,
    ws: SplitKWorkspace,
    reps: int,
    json_path: Path | None,
) -> None:
    """``--sweep`` at one ``M`` (see the module docstring); prints every trial and the result."""
    x0 = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)

    def timed(over: dict[str, Fp8SplitKConfig]) -> float:
        fn = make_chain(layers, x0, True, ws, fuse_reduce=True, overrides=over)
        return min(time_graph(fn, reps) for _ in range(2)) / len(layers) * 1e6

    best: dict[str, Fp8SplitKConfig] = {}
    base = best_t = timed(best)
    print(f"M={m:3d} table configs: {base:7.2f} us/layer", flush=True)
    for name in ("gate_up", "down", "qkv", "o"):
        n, k = SHAPES[name]
        current = best.get(name) or splitk_configs(n, k)[m]
        assert current is not None
        for cand in candidates(current, k):
            t = timed({**best, name: cand})
            print(f"M={m:3d} {name:<8s} {astuple(cand)}: {t:7.2f} us/layer", flush=True)
            if json_path is not None:
                with json_path.open("a") as f:
                    f.write(
                        json.dumps({"m": m, "gemm": name, "config": astuple(cand), "us_per_layer": t}) + "\n"
                    )
            if t < best_t * 0.99:
                best, best_t = {**best, name: cand}, t
    print(f"M={m:3d} best: {best_t:7.2f} us/layer against {base:.2f} (x{base / best_t:.3f})")
    for name, c in best.items():
        print(f"M={m:3d}   {name}: {astuple(c)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--sweep", action="store_true", help="search the GEMM tiles in the chain instead")
    ap.add_argument("--json", type=Path, help="append the results here")
    args = ap.parse_args()
    torch.manual_seed(0)
    layers = build_layers(args.layers, "cuda")
    floats = tiles = 0
    for m in args.m:
        for n, k in SHAPES.values():
            c = splitk_configs(n, k)[m]
            if c is None:
                continue
            for cand in [c, *candidates(c, k)] if args.sweep else [c]:
                f, t = splitk_workspace_size(m, n, replace(cand, reduce="inline"))
                floats, tiles = max(floats, f), max(tiles, t)
    ws = SplitKWorkspace.allocate(
        4 * floats if args.sweep else floats, 4 * tiles if args.sweep else tiles, "cuda"
    )
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; {args.layers} layers")
    if args.sweep:
        for m in args.m:
            sweep(layers, m, ws, args.reps, args.json)
        return
    for m in args.m:
        x0 = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
        base = make_chain(layers, x0, False, ws)
        want = base().clone()
        t_base = time_graph(base, args.reps)
        rows = [{"m": m, "variant": "no PDL", "us_per_layer": t_base / args.layers * 1e6, "same": True}]
        fn = make_chain(layers, x0, True, ws)
        same = bool(torch.equal(fn(), want))
        t = time_graph(fn, args.reps)
        rows.append({"m": m, "variant": "PDL", "us_per_layer": t / args.layers * 1e6, "same": same})
        fn = make_chain(layers, x0, True, ws, fuse_reduce=True)
        same = bool(torch.equal(fn(), want))
        t = time_graph(fn, args.reps)
        rows.append(
            {"m": m, "variant": "PDL + fused reduce", "us_per_layer": t / args.layers * 1e6, "same": same}
        )
        for r in rows:
            r["vs_no_pdl"] = rows[0]["us_per_layer"] / r["us_per_layer"]
            print(
                f"M={m:3d} {r['variant']:<20s} {r['us_per_layer']:7.2f} us/layer  x{r['vs_no_pdl']:.3f}"
                f"  {'same bits' if r['same'] else 'DIFFERENT OUTPUT'}"
            )
            if args.json is not None:
                with args.json.open("a") as f:
                    f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
