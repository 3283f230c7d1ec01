"""The batch-1 stream-decode kernel (:mod:`surge.kernels.stream_decode`) on Qwen3-8B shapes.

Builds ``--layers`` layers of FP8 weights (qkv, o, gate_up, down; random, per-row scales, or
128 x 128 block scales with ``--block``) and
runs them with the engine's own launch plan (:func:`surge.layers.stream_decode.plan_launches`):
one launch for the first qkv, then per layer one launch of o, gate_up, down and the next layer's
qkv, with a stand-in for attention between launches (a bf16 copy of q, passed as the launch's
``x0``). Checks 2 layers against :func:`surge.kernels.stream_decode.stream_reference` and times
all layers in one CUDA graph.

    python3 benchmarks/stream_decode_bench.py --layers 36 --json out.jsonl   # sm89+ GPU

``--trace`` also replays one step of the kernel's diagnostic build (global-timer stamps per
phase and block) and prints, per phase role (qkv, o, gate_up, down), the mean over layers of
:func:`surge.kernels.stream_decode.phase_timeline`: how long blocks take to build an input and
to stream their rows, how far the last block trails, and the barrier's latency.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemm_bench import time_graph  # noqa: E402

from surge.kernels.stream_decode import (  # noqa: E402
    StreamDecodeKernel,
    StreamPhase,
    pack_phases,
    phase_timeline,
    stream_reference,
)
from surge.layers.stream_decode import StreamBuffers, StreamLayer, plan_launches  # noqa: E402
from surge.quant.fp8 import quantize_block, quantize_per_channel  # noqa: E402

HIDDEN, Q, KV, INTER = 4096, 4096, 1024, 12288


def fp8_weight(
    n: int, k: int, dev: torch.device, block: tuple[int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``[n, k]`` weights quantized per row, or with ``block`` scales (an FP8
    checkpoint's ``weight_block_size``): (e4m3 weight, float32 scales)."""
    w = torch.randn(n, k, device=dev) * k**-0.5
    return quantize_per_channel(w) if block is None else quantize_block(w, block)


def build(
    layers: int, dev: torch.device, block: tuple[int, int] | None = None
) -> tuple[list[list[StreamPhase]], StreamBuffers]:
    """The per-launch phase lists of a step and the step's buffers (``block``: block-scaled
    weights)."""

    def norm() -> tuple[torch.Tensor, float]:
        return (1 + 0.1 * torch.randn(HIDDEN, device=dev)).to(torch.bfloat16), 1e-6

    stack = [
        StreamLayer(
            fp8_weight(Q + 2 * KV, HIDDEN, dev, block),
            fp8_weight(HIDDEN, Q, dev, block),
            fp8_weight(2 * INTER, HIDDEN, dev, block),
            fp8_weight(HIDDEN, INTER, dev, block),
            norm(),
            norm(),
        )
        for _ in range(layers)
    ]
    buf = StreamBuffers.create(HIDDEN, Q + 2 * KV, INTER, dev)
    return plan_launches(stack, buf), buf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--no-pdl", action="store_true", help="ordinary launches, not programmatic dependent ones"
    )
    ap.add_argument(
        "--block",
        action="store_true",
        help="128 x 128 block-scaled weights (the layout of Qwen's FP8 checkpoints), not one scale per row",
    )
    ap.add_argument(
        "--trace",
        action="store_true",
        help="also run the kernel's diagnostic build once and print each phase role's timeline",
    )
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    kern = StreamDecodeKernel.compile(dev, block_scaled=args.block)
    if args.no_pdl:
        kern.pdl = False
    launches, buf = build(args.layers, dev, (128, 128) if args.block else None)
    tables = [pack_phases(g) for g in launches]
    gb = sum(p.weight.numel() for g in launches for p in g) / 1e9
    embed = torch.randn(HIDDEN, device=dev, dtype=torch.bfloat16)
    attn = torch.zeros(Q, device=dev, dtype=torch.bfloat16)

    def attention_stand_in() -> None:
        attn.copy_(buf.qkv[:Q])

    def run_kernel(n_launches: int) -> None:
        kern.reset()
        base = 0
        for i in range(n_launches):
            if i:
                attention_stand_in()
            kern.launch(tables[i], base, attn if i else embed)
            base += len(launches[i])

    def run_reference(n_launches: int) -> None:
        for i in range(n_launches):
            if i:
                attention_stand_in()
            stream_reference(launches[i], attn if i else embed)

    # 2 layers (3 launches) against the reference
    names = ("qkv", "act", "res_a", "res_b")
    check = {}
    for name, fn in (("ref", run_reference), ("kernel", run_kernel)):
        for k in names:
            getattr(buf, k).fill_(float("nan"))
        fn(3)
        torch.cuda.synchronize()
        check[name] = {k: getattr(buf, k).float().clone() for k in names}
    res = {}
    for k, ref in check["ref"].items():
        got = check["kernel"][k]
        cos = float(torch.nn.functional.cosine_similarity(got, ref, dim=0))
        rel = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
        res[k] = {"cos": cos, "max_rel": rel}
    print("2 layers vs reference:", json.dumps(res), "hung", kern.hung(), flush=True)

    t = time_graph(lambda: run_kernel(len(launches)), args.reps)
    t_gap = time_graph(lambda: [attention_stand_in() for _ in range(len(launches) - 1)], args.reps)
    r = {
        "layers": args.layers,
        "block": [128, 128] if args.block else None,
        "pdl": kern.pdl,
        "gb": gb,
        "us_per_layer": t / args.layers * 1e6,
        "us_per_layer_without_stand_in": (t - t_gap) / args.layers * 1e6,
        "tb_s_without_stand_in": gb / (t - t_gap) / 1e3,
        "check_2_layers": res,
        "hung": kern.hung(),
    }
    if args.trace:
        r["timeline"] = trace(launches, tables, embed, attn, attention_stand_in, dev)
    print(json.dumps(r), flush=True)
    if args.json:
        with args.json.open("a") as f:
            f.write(json.dumps(r) + "\n")


ROLES = ("o", "gate_up", "down", "qkv")
"""The roles of a layer launch's phases, in order (launch 0 holds the first layer's qkv alone)."""


def trace(
    launches: list[list[StreamPhase]],
    tables: list[torch.Tensor],
    embed: torch.Tensor,
    attn: torch.Tensor,
    stand_in: Callable[[], None],
    dev: torch.device,
) -> dict[str, dict[str, float]]:
    """A step of the kernel's diagnostic build, replayed from a CUDA graph; per phase role, the
    mean over layers of :func:`phase_timeline`'s figures (us), with the role's weight
    bytes over its mean span (TB/s)."""
    phases = [ph for g in launches for ph in g]
    kern = StreamDecodeKernel.compile(dev, trace=True, block_scaled=any(ph.block_n for ph in phases))
    stamps = torch.zeros(len(phases), kern.num_sms, 4, dtype=torch.int64, device=dev)
    starts, base = set(), 0
    for g in launches:
        starts.add(base)
        base += len(g)

    def step() -> None:
        kern.reset()
        base = 0
        for i, g in enumerate(launches):
            if i:
                stand_in()
            kern.launch(tables[i], base, attn if i else embed, trace=stamps)
            base += len(g)

    step()  # eager warm-up, then the step as the engine runs it: replayed from a CUDA graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    rows = phase_timeline(stamps.cpu(), starts)
    out: dict[str, dict[str, float]] = {}
    roles = ["qkv"] + [ROLES[j] for g in launches[1:] for j in range(len(g))]
    for ph, role, row in zip(phases, roles, rows, strict=True):
        acc = out.setdefault(role, {"phases": 0.0, "gb": 0.0} | {k: 0.0 for k in row})
        acc["phases"] += 1
        acc["gb"] += ph.weight.numel() / 1e9
        for k, v in row.items():
            acc[k] += v
    for acc in out.values():
        n = acc.pop("phases")
        acc["gb"] /= n
        for k in list(acc):
            if k != "gb":
                acc[k] /= n
        acc["tb_s_over_span"] = acc["gb"] / acc["span"] * 1e3 if acc["span"] > 0 else 0.0
    for role, acc in out.items():
        print(role, " ".join(f"{k}={v:.2f}" for k, v in acc.items()), flush=True)
    return out


if __name__ == "__main__":
    main()
