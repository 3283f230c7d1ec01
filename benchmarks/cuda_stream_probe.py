"""Probe: can a persistent kernel whose weight stream runs on across grid barriers read a
decode step's FP8 weights faster than one launch per GEMM?

Session 20's probe (:mod:`megakernel_probe`) replaced each kernel boundary of the 144 M = 1 FP8
GEMMs by a grid barrier inside one persistent Triton kernel and lost 7.6 %: a program could not
load the next GEMM's weights before the barrier, so HBM idled at every barrier as it idles at
every launch. The kernels of ``benchmarks/cuda/stream_gemv.cu`` keep the stream going, since
weights do not depend on activations:

* ``stream_gemv`` (NCW x DEPTH): one lane per CTA issues 4 KiB bulk copies (``cp.async.bulk``)
  of the CTA's weight rows into per-warp shared-memory rings, gated only by free slots;
* ``ldg_gemv`` (NW warps): each warp loads its next 4 KiB segment into registers
  (``ld.global.nc``) before computing the current one, across phase boundaries;
* ``async_gemv`` (NW x DEPTH): the same with ``cp.async`` into per-warp rings, DEPTH - 1
  segments ahead.

The same 36 Qwen3-8B-shaped layers x (qkv, o, gate_up, down) at M = 1 (6.95 GB of distinct e4m3
weights) run as the Triton chain of session 20 (:func:`megakernel_probe.chain`, one launch per
GEMM with PDL) and as each CUDA variant: one launch for all phases, one launch per layer, or one
per layer followed by a small copy standing in for attention. Timing-only ``mode`` bits (wrong
results by design) leave out the barrier waits (2), the dot products (4) or the input builds
(8). Each phase computes ``y = rsqrt(mean(x^2) + 1e-6) * (w @ x)`` over the first ``K`` floats
of the previous phase's output; after 2 layers the output is checked against the same chain in
float32 torch (cosine similarity and max relative error).

    python3 benchmarks/cuda_stream_probe.py --build        # CPU host, needs nvcc (sm_90a cubins)
    python3 benchmarks/cuda_stream_probe.py --json out.jsonl  # sm90 GPU host, needs cupy
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE / "cuda" / "stream_gemv.cu"
CUBINS = HERE / "cuda" / "build"
# (consumer warps, slots of 4 KiB per warp): shared memory NCW * DEPTH * 4 KiB + 24 KiB <= 227 KiB
VARIANTS: list[tuple[int, int]] = []
LDG_WARPS = [16]
ASYNC = [(8, 6), (16, 3), (12, 4), (16, 2)]
SEG, XMAX = 4096, 12288


def cubin_path(ncw: int, depth: int) -> Path:
    """Where ``--build`` puts the cubin of one variant."""
    return CUBINS / f"stream_gemv_w{ncw}_d{depth}.cubin"


def ldg_cubin_path(nw: int) -> Path:
    """Where ``--build`` puts the cubin of one ``ldg_gemv`` variant."""
    return CUBINS / f"ldg_gemv_w{nw}.cubin"


def async_cubin_path(nw: int, depth: int) -> Path:
    """Where ``--build`` puts the cubin of one ``async_gemv`` variant."""
    return CUBINS / f"async_gemv_w{nw}_d{depth}.cubin"


def smem_bytes(ncw: int, depth: int) -> int:
    """Dynamic shared memory of one CTA: rings, fp16 x, two mbarriers per slot, per-warp sums."""
    return ncw * depth * SEG + 2 * XMAX + 2 * 8 * ncw * depth + 4 * ncw


def build() -> None:
    """Compile every variant to an sm90a cubin with nvcc (prints ptxas's register report)."""
    CUBINS.mkdir(parents=True, exist_ok=True)
    for ncw, depth in VARIANTS:
        out = cubin_path(ncw, depth)
        cmd = ["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-O3", "-Xptxas", "-v"]
        cmd += [f"-DNCW={ncw}", f"-DDEPTH={depth}", "-o", str(out), str(SRC)]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        regs = [ln.strip() for ln in r.stderr.splitlines() if "registers" in ln or "spill" in ln]
        print(out.name, "|", " | ".join(regs))
    for nw, depth in ASYNC:
        out = async_cubin_path(nw, depth)
        cmd = ["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-O3", "-Xptxas", "-v"]
        cmd += [f"-DNW={nw}", f"-DADEPTH={depth}", "-o", str(out), str(SRC)]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        print(out.name, "|", r.stderr.split("'async_gemv'")[-1].replace("\n", " ")[:200])
    for nw in LDG_WARPS:
        out = ldg_cubin_path(nw)
        cmd = ["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-O3", "-Xptxas", "-v"]
        cmd += [f"-DNW={nw}", "-o", str(out), str(SRC)]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        print(out.name, "|", r.stderr.split("'ldg_gemv'")[-1].replace("\n", " ")[:200])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true", help="compile the cubins (CPU host, nvcc)")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.build:
        build()
        return
    run_probe(args.layers, args.reps, args.json)


def run_probe(layers: int, reps: int, out: Path | None) -> None:
    """Time the Triton chain and every built CUDA variant on the GPU; print and append JSON."""
    import cupy
    import numpy as np
    import torch

    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent))
    from gemm_bench import time_graph
    from megakernel_probe import BUF, HIDDEN, PHASES, build_weights, chain

    torch.manual_seed(0)
    w = build_weights(layers)
    gb = sum(t.numel() for t in w.values()) / 1e9
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(
        f"{torch.cuda.get_device_name()} torch {torch.__version__} cupy {cupy.__version__}; "
        f"{layers} layers, {gb:.3f} GB of e4m3 weights, {sms} SMs",
        flush=True,
    )

    def record(r: dict) -> None:
        print(json.dumps(r), flush=True)
        if out is not None:
            with out.open("a") as f:
                f.write(json.dumps(r) + "\n")

    # Triton baseline, session 20's best chain
    tbuf = torch.zeros(2 * BUF, device="cuda", dtype=torch.bfloat16)
    tbuf[:HIDDEN] = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    t = time_graph(chain(w, tbuf, layers, 0, True), reps)
    record({"variant": "triton chain+pdl", "us_per_layer": t / layers * 1e6, "tb_s": gb / t / 1e3})

    order = list(PHASES)
    desc = torch.zeros(layers * len(order), 2, dtype=torch.int64)
    for layer in range(layers):
        for i, name in enumerate(order):
            n, k, _ = PHASES[name]
            desc[layer * len(order) + i, 0] = w[name][layer].data_ptr()
            desc[layer * len(order) + i, 1] = n | (k << 32)
    desc = desc.cuda()
    nmax = max(n for n, _, _ in PHASES.values())
    bufs = torch.zeros(2, nmax, device="cuda", dtype=torch.float32)
    x0 = torch.randn(HIDDEN, device="cuda")
    counter = torch.zeros(1, device="cuda", dtype=torch.int32)

    # float32 reference of 2 layers
    ref = x0.clone()
    for p in range(2 * len(order)):
        name = order[p % len(order)]
        n, k, _ = PHASES[name]
        xin = ref[:k]
        inv = torch.rsqrt(xin.pow(2).mean() + 1e-6)
        ref = (w[name][p // len(order)].float() @ xin.half().float()) * inv

    gap_a = torch.randn(256 * 1024, device="cuda", dtype=torch.bfloat16)
    gap_b = torch.empty_like(gap_a)

    def make(
        fn: object, threads: int, shm: int, mode: int, split: str
    ) -> Callable[[int], Callable[[], None]]:
        """A runner of ``n`` layers: ``split`` "one" (one launch of every phase), "layer" (one
        launch per layer) or "layer+gap" (one per layer, each followed by a 512 KiB bf16 copy
        standing in for the attention launch between them)."""

        def launch(phase0: int, phases: int) -> None:
            with cupy.cuda.Stream.from_external(torch.cuda.current_stream()):
                fn(
                    (sms,),
                    (threads,),
                    (
                        np.uint64(desc[phase0].data_ptr()),
                        np.int32(phases),
                        np.uint64(bufs[0].data_ptr()),
                        np.uint64(bufs[1].data_ptr()),
                        np.uint64(counter.data_ptr()),
                        np.int32(mode),
                        np.int32(phase0),
                    ),
                    shared_mem=shm,
                )

        def runner(n: int) -> Callable[[], None]:
            def run() -> None:
                counter.zero_()
                if split == "one":
                    launch(0, n * len(order))
                    return
                for layer in range(n):
                    launch(layer * len(order), len(order))
                    if split == "layer+gap":
                        gap_b.copy_(gap_a)

            return run

        return runner

    def check_and_time(name: str, runner: Callable[[int], Callable[[], None]], extra: dict) -> None:
        bufs.zero_()
        bufs[0, :HIDDEN] = x0
        runner(2)()
        torch.cuda.synchronize()
        hung = bool(int(counter.item()) & (1 << 30))
        got = bufs[0, : ref.numel()]
        cos = float(torch.nn.functional.cosine_similarity(got, ref, dim=0))
        rel = float((got - ref).abs().max() / ref.abs().max())
        t = time_graph(runner(layers), reps)
        hung = hung or bool(int(counter.item()) & (1 << 30))
        record(
            {
                "variant": name,
                **extra,
                "us_per_layer": t / layers * 1e6,
                "tb_s": gb / t / 1e3,
                "cos_2_layers": cos,
                "max_rel_err_2_layers": rel,
                "hung": hung,
            }
        )

    gap = time_graph(lambda: [gap_b.copy_(gap_a) for _ in range(layers)], reps)
    record({"variant": "gap alone (512 KiB bf16 copy)", "us_per_layer": gap / layers * 1e6})

    kernels = [("async", nw, d, async_cubin_path(nw, d)) for nw, d in ASYNC]
    kernels += [("ldg", nw, 0, ldg_cubin_path(nw)) for nw in LDG_WARPS]
    for kind, nw, depth, path in kernels:
        if not path.exists():
            continue
        fn = cupy.RawModule(path=str(path)).get_function(f"{kind}_gemv")
        shm = nw * depth * SEG + 2 * XMAX + 4 * nw if kind == "async" else 0
        if shm:
            fn.max_dynamic_shared_size_bytes = shm
        for mode, split in ((0, "one"), (0, "layer"), (0, "layer+gap"), (2, "one"), (14, "one")):
            check_and_time(
                f"cuda {kind} {nw}x{depth} mode {mode} {split}",
                make(fn, nw * 32, shm, mode, split),
                {"kind": kind, "nw": nw, "depth": depth, "mode": mode, "split": split},
            )


if __name__ == "__main__":
    main()
