"""Probe: does one persistent kernel with grid barriers stream a decode step's FP8 weights faster
than a chain of one launch per GEMM?

Issue 13's batch-1 targets need the decode step's 144 FP8 GEMMs to stream at about 4 TB/s on
average; one launch per GEMM pays a fixed ~7 us each (``docs/fp8.md``, "What the issue-13
targets would need"). A persistent ("megakernel") decode step would replace each kernel
boundary by a grid barrier and could prefetch the next GEMM's first weight tiles into L2 while
it waits for the slowest program of the current one. Before building one, this probe measures
that idea on the GEMMs alone, with the same tile code on both sides:

* ``chain``: 36 Qwen3-8B-shaped layers x 4 GEMV phases (qkv, o, gate_up, down at ``M = 1``),
  one launch of :func:`_phase_kernel` per phase (grid ``G``), captured in one CUDA graph, with
  or without PDL (:mod:`surge.kernels.pdl`);
* ``mega``: one launch of :func:`_mega_kernel` (grid ``G``, every program resident) that runs
  the same 144 phases, separated by a grid barrier (one GPU-scope counter: release-add, then
  acquire-poll), optionally prefetching into L2 (``cp.async.bulk.prefetch.L2``) the first
  ``--prefetch`` bytes of each of its weight rows in the next phase after it arrives and before
  it polls.

Each phase computes ``y[s, n] = sum over its K slice s of x[k] * w[n, k]`` with ``tl.dot`` on
16 x BK bf16 tiles (the activation padded to 16 rows, the weight converted from e4m3 in
registers, as the engine's w8a16 split-K kernel does) and stores bf16 partials; the next phase
reads slice 0 of them as its activation. The weights are distinct per layer (6.95 GB), so L2
holds none of them across a replay. Both variants must give the same bits (checked at 2
layers). A barrier that is not reached within 2**20 polls (programs not co-resident) sets bit 30 of
the counter (an atomic OR, so any number of programs may do it), which releases every later
barrier, and the probe reports the hang instead of hanging.

Run on an sm90 GPU from the repository root::

    python3 benchmarks/megakernel_probe.py --grid 0 132 264 --prefetch 0 256 512
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemm_bench import time_graph  # noqa: E402

from surge.kernels.pdl import pdl_wait  # noqa: E402

HIDDEN, QKV, INTER = 4096, 6144, 12288
# (N, K, SPLIT_K) per phase, in the order a layer runs them
PHASES = {
    "qkv": (QKV, HIDDEN, 4),
    "o": (HIDDEN, HIDDEN, 4),
    "gate_up": (2 * INTER, HIDDEN, 1),
    "down": (HIDDEN, INTER, 8),
}
BUF = 8 * 2 * INTER  # floats per half of the ping-pong activation buffer (>= SPLIT_K * N)
BM, BN, BK = 16, 64, 128
HANG = 1 << 30


@triton.jit
def _phase(
    w_ptr,
    x_ptr,
    y_ptr,
    pid,
    G: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    SPLIT: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    TILED: tl.constexpr = False,
):
    """Program ``pid``'s items (``item = pid, pid + G, ...``) of one phase: each item is one
    ``BN``-row tile of ``w [N, K]`` times one ``K / SPLIT`` slice of ``x``, stored into
    ``y [SPLIT, N]`` (bf16)."""
    N_TILES: tl.constexpr = N // BN
    ITEMS: tl.constexpr = N_TILES * SPLIT
    SLICE: tl.constexpr = K // SPLIT
    STEPS: tl.constexpr = SLICE // BK
    for j in range(0, (ITEMS + G - 1) // G):
        item = pid + j * G
        if item < ITEMS:
            _item(w_ptr, x_ptr, y_ptr, item, N_TILES, N, K, SLICE, STEPS, BM, BN, BK, TILED)


@triton.jit
def _item(
    w_ptr,
    x_ptr,
    y_ptr,
    item,
    N_TILES: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    SLICE: tl.constexpr,
    STEPS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    TILED: tl.constexpr,
):
    """One item of :func:`_phase`; ``TILED``: ``w`` is stored tile by tile (see
    :func:`tile_layout`)."""
    offs_m = tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    row0 = offs_m[:, None] < 1
    nt = item % N_TILES
    ks = item // N_TILES
    x_ptrs = x_ptr + ks * SLICE + offs_k[None, :] + offs_m[:, None] * 0
    if TILED:
        tile0 = (nt * (K // BK) + ks * STEPS).to(tl.int64) * (BN * BK)
        w_ptrs = w_ptr + tile0 + offs_n[:, None] * BK + offs_k[None, :]
        W_STEP: tl.constexpr = BN * BK
    else:
        w_ptrs = w_ptr + (nt * BN + offs_n)[:, None].to(tl.int64) * K + (ks * SLICE + offs_k)[None, :]
        W_STEP: tl.constexpr = BK
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(STEPS):
        a = tl.load(x_ptrs, mask=row0, other=0.0, cache_modifier=".cg")
        w = tl.load(w_ptrs)
        acc = tl.dot(a, tl.trans(w.to(a.dtype)), acc)
        x_ptrs += BK
        w_ptrs += W_STEP
    y_ptrs = y_ptr + ks * N + nt * BN + offs_n[None, :] + offs_m[:, None] * 0
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=row0)


@triton.jit
def _prefetch(
    w_ptr,
    pid,
    G: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    SPLIT: tl.constexpr,
    BN: tl.constexpr,
    BYTES: tl.constexpr,
    NUM_THREADS: tl.constexpr,
):
    """Prefetch into L2 the first ``BYTES`` of each weight row of program ``pid``'s first item
    of a phase (one row per thread, ``BN <= NUM_THREADS``)."""
    N_TILES: tl.constexpr = N // BN
    SLICE: tl.constexpr = K // SPLIT
    nt = pid % N_TILES
    ks = pid // N_TILES
    lane = tl.arange(0, NUM_THREADS)
    active = ((lane < BN) & (pid < N_TILES * SPLIT)).to(tl.int32)
    row = nt * BN + tl.where(lane < BN, lane, 0)
    addr = (w_ptr + row.to(tl.int64) * K + ks * SLICE).to(tl.int64)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r,r",
        [addr, tl.full([NUM_THREADS], BYTES, tl.int32), active],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _grid_sync(cnt_ptr):
    """Arrive at a grid barrier: once every thread's stores are issued, release-add 1 to the
    counter."""
    tl.debug_barrier()
    tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _poll(cnt_ptr, LD_ACQUIRE: tl.constexpr):
    """The barrier counter, read with acquire semantics: an ``ld.acquire.gpu`` by every thread
    (``LD_ACQUIRE``, GPU only), or one atomic add of 0 (the CPU interpreter runs this one)."""
    if LD_ACQUIRE:
        v = tl.inline_asm_elementwise(
            "ld.acquire.gpu.global.b32 $0, [$1];",
            "=r,l",
            [cnt_ptr + tl.zeros([1], tl.int32)],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
        return tl.max(v, axis=0)
    else:
        return tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")


@triton.jit
def _grid_wait(cnt_ptr, target, LD_ACQUIRE: tl.constexpr, MAX_POLLS: tl.constexpr):
    """Wait at a grid barrier: poll the counter (acquire) until it reaches ``target``, or for
    ``MAX_POLLS`` polls (then set bit 30: see the module docstring)."""
    cur = _poll(cnt_ptr, LD_ACQUIRE)
    polls = 0
    while (cur < target) & (polls < MAX_POLLS):
        cur = _poll(cnt_ptr, LD_ACQUIRE)
        polls += 1
    if cur < target:
        tl.atomic_or(cnt_ptr, 1073741824, sem="relaxed", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _phase_kernel(
    w_ptr,
    x_ptr,
    y_ptr,
    G: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    SPLIT: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PDL: tl.constexpr,
    TILED: tl.constexpr,
):
    """One phase of the ``chain`` variant (:func:`_phase` for ``G`` programs); with ``PDL`` it
    waits for the previous grid first (launched with ``launch_pdl``)."""
    pdl_wait(PDL)
    _phase(w_ptr, x_ptr, y_ptr, tl.program_id(0), G, N, K, SPLIT, BM, BN, BK, TILED)


@triton.jit
def _mega_kernel(
    wq,
    wo,
    wgu,
    wd,
    buf,
    cnt_ptr,
    L: tl.constexpr,
    G: tl.constexpr,
    BUF: tl.constexpr,
    QN: tl.constexpr,
    QK: tl.constexpr,
    QS: tl.constexpr,
    ON: tl.constexpr,
    OK: tl.constexpr,
    OS: tl.constexpr,
    UN: tl.constexpr,
    UK: tl.constexpr,
    US: tl.constexpr,
    DN: tl.constexpr,
    DK: tl.constexpr,
    DS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PREFETCH: tl.constexpr,
    NUM_THREADS: tl.constexpr,
    LD_ACQUIRE: tl.constexpr,
    MAX_POLLS: tl.constexpr,
):
    """The ``mega`` variant: ``L`` layers of the four phases (shapes ``(QN, QK, QS)`` .. ``(DN, DK,
    DS)`` as ``(N, K, SPLIT)``) in one launch of ``G`` resident programs, a grid barrier on
    ``cnt_ptr`` (zero at launch) after each phase, activations ping-ponging between the two
    ``BUF``-element halves of ``buf``; ``PREFETCH`` bytes of each next-phase weight row prefetched
    into L2 while waiting (0: none)."""
    pid = tl.program_id(0)
    b0 = buf
    b1 = buf + BUF
    for layer in range(0, L):
        li = tl.full((), layer, tl.int64)
        lq = wq + li * (QN * QK)
        lo = wo + li * (ON * OK)
        lu = wgu + li * (UN * UK)
        ld = wd + li * (DN * DK)
        base = layer * 4 * G
        _phase(lq, b0, b1, pid, G, QN, QK, QS, BM, BN, BK)
        _grid_sync(cnt_ptr)
        if PREFETCH > 0:
            _prefetch(lo, pid, G, ON, OK, OS, BN, PREFETCH, NUM_THREADS)
        _grid_wait(cnt_ptr, base + G, LD_ACQUIRE, MAX_POLLS)
        _phase(lo, b1, b0, pid, G, ON, OK, OS, BM, BN, BK)
        _grid_sync(cnt_ptr)
        if PREFETCH > 0:
            _prefetch(lu, pid, G, UN, UK, US, BN, PREFETCH, NUM_THREADS)
        _grid_wait(cnt_ptr, base + 2 * G, LD_ACQUIRE, MAX_POLLS)
        _phase(lu, b0, b1, pid, G, UN, UK, US, BM, BN, BK)
        _grid_sync(cnt_ptr)
        if PREFETCH > 0:
            _prefetch(ld, pid, G, DN, DK, DS, BN, PREFETCH, NUM_THREADS)
        _grid_wait(cnt_ptr, base + 3 * G, LD_ACQUIRE, MAX_POLLS)
        _phase(ld, b1, b0, pid, G, DN, DK, DS, BM, BN, BK)
        _grid_sync(cnt_ptr)
        if PREFETCH > 0:  # noqa: SIM102 (a constexpr and a runtime condition)
            if layer + 1 < L:
                _prefetch(lq + QN * QK, pid, G, QN, QK, QS, BN, PREFETCH, NUM_THREADS)
        _grid_wait(cnt_ptr, base + 4 * G, LD_ACQUIRE, MAX_POLLS)


def build_weights(layers: int) -> dict[str, torch.Tensor]:
    """Per phase, ``[layers, N, K]`` e4m3 weights of scale ~ 1 / sqrt(K / SPLIT_K)."""
    out = {}
    for name, (n, k, split) in PHASES.items():
        w = torch.empty(layers, n, k, device="cuda", dtype=torch.float8_e4m3fn)
        for i in range(layers):
            w[i] = (torch.randn(n, k, device="cuda") * (k / split) ** -0.5).to(torch.float8_e4m3fn)
        out[name] = w
    return out


def tile_layout(w: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    """``w [L, N, K]`` stored tile by tile, ``[L, N / bn, K / bk, bn, bk]`` contiguous: the
    ``bn x bk`` tiles of a row block follow each other along ``K``, so a program of
    :func:`_item` reads one contiguous run of ``STEPS * bn * bk`` bytes."""
    layers, n, k = w.shape
    return w.view(layers, n // bn, bn, k // bk, bk).permute(0, 1, 3, 2, 4).contiguous()


def chain(
    w: dict[str, torch.Tensor],
    buf: torch.Tensor,
    layers: int,
    g: int,
    pdl: bool,
    bn: int = BN,
    bk: int = BK,
    stages: int = 4,
    tiled: bool = False,
) -> Callable[[], None]:
    """The ``chain`` variant: one launch per phase, of ``g`` programs (0: one per item), with
    ``bn x bk`` weight tiles pipelined over ``stages``; ``tiled``: ``w`` holds
    :func:`tile_layout` weights."""
    halves = (buf[:BUF], buf[BUF:])

    def run() -> None:
        src = 0
        for layer in range(layers):
            for name, (n, k, split) in PHASES.items():
                grid = g or n // bn * split
                _phase_kernel[(grid,)](
                    w[name][layer],
                    halves[src],
                    halves[1 - src],
                    grid,
                    n,
                    k,
                    split,
                    BM,
                    bn,
                    bk,
                    pdl,
                    tiled,
                    num_warps=4,
                    num_stages=stages,
                    launch_pdl=pdl,
                )
                src = 1 - src

    return run


def layouts(
    w: dict[str, torch.Tensor],
    buf: torch.Tensor,
    x0: torch.Tensor,
    specs: list[str],
    layers: int,
    reps: int,
    gb: float,
    json_path: Path | None,
) -> None:
    """``--layouts``: the one-program-per-item chain with PDL, per ``layout:bn:bk:stages``
    spec (``rows`` or ``tiles``); checks each against the first spec's bits at 2 layers."""
    want = None
    for spec in specs:
        layout, bn, bk, stages = spec.split(":")
        bn, bk, stages = int(bn), int(bk), int(stages)
        tiled = layout == "tiles"
        ww = {name: tile_layout(t, bn, bk) for name, t in w.items()} if tiled else w
        buf.zero_()
        buf[:HIDDEN] = x0
        chain(ww, buf, 2, 0, True, bn, bk, stages, tiled)()
        torch.cuda.synchronize()
        out = buf.clone()
        same = want is None or bool(torch.equal(out, want))
        want = out if want is None else want
        t = time_graph(chain(ww, buf, layers, 0, True, bn, bk, stages, tiled), reps)
        us = t / layers * 1e6
        r = {
            "layout": layout,
            "bn": bn,
            "bk": bk,
            "stages": stages,
            "us_per_layer": us,
            "tb_s": gb / t / 1e3,
            "same_bits_2_layers": same,
        }
        print(
            f"chain+pdl {spec:<18s}: {us:7.2f} us/layer  {r['tb_s']:.3f} TB/s  {'same bits' if same else 'DIFFERENT'}",
            flush=True,
        )
        if json_path is not None:
            with json_path.open("a") as f:
                f.write(json.dumps(r) + "\n")
        del ww
        torch.cuda.empty_cache()


def mega(
    w: dict[str, torch.Tensor],
    buf: torch.Tensor,
    cnt: torch.Tensor,
    layers: int,
    g: int,
    prefetch: int,
    ld_acquire: bool,
    max_polls: int = 1 << 20,
) -> Callable[[], None]:
    """The ``mega`` variant: a function that zeroes the barrier counter ``cnt`` and launches
    :func:`_mega_kernel` over ``layers`` layers with ``g`` programs (all must be resident),
    ``prefetch`` bytes per row of L2 prefetch, ``ld_acquire`` or atomic barrier polls, and the
    hang guard after ``max_polls`` polls of one barrier."""
    args = [a for (n, k, s) in PHASES.values() for a in (n, k, s)]

    def run() -> None:
        cnt.zero_()
        _mega_kernel[(g,)](
            w["qkv"],
            w["o"],
            w["gate_up"],
            w["down"],
            buf,
            cnt,
            layers,
            g,
            BUF,
            *args,
            BM,
            BN,
            BK,
            prefetch,
            128,
            ld_acquire,
            max_polls,
            num_warps=4,
            num_stages=4,
        )

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument(
        "--grid", type=int, nargs="+", default=[132], help="programs; 0: one per item (chain only)"
    )
    ap.add_argument("--prefetch", type=int, nargs="+", default=[0, 256])
    ap.add_argument(
        "--poll", nargs="+", default=["ld", "atomic"], choices=["ld", "atomic"], help="barrier polls"
    )
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument(
        "--layouts",
        nargs="+",
        metavar="LAYOUT:BN:BK:STAGES",
        help="instead: the chain with PDL per weight layout (rows or tiles) and tile sizes",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.manual_seed(0)
    w = build_weights(args.layers)
    gb = sum(t.numel() for t in w.values()) / 1e9
    print(
        f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}; "
        f"{args.layers} layers, {gb:.3f} GB of e4m3 weights, SMs {torch.cuda.get_device_properties(0).multi_processor_count}"
    )
    buf = torch.zeros(2 * BUF, device="cuda", dtype=torch.bfloat16)
    cnt = torch.zeros(1, device="cuda", dtype=torch.int32)
    x0 = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    if args.layouts:
        layouts(w, buf, x0, args.layouts, args.layers, args.reps, gb, args.json)
        return
    for g in args.grid:
        # (name, flag, prefetch bytes): the flag is PDL for a chain, ld.acquire polls for mega
        variants = [("chain", False, 0), ("chain+pdl", True, 0)]
        if g:
            variants += [(f"mega-{poll}", poll == "ld", p) for poll in args.poll for p in args.prefetch]
        want = None
        for name, flag, pf in variants:

            def make(
                layers: int, name: str = name, flag: bool = flag, pf: int = pf, g: int = g
            ) -> Callable[[], None]:
                if name.startswith("chain"):
                    return chain(w, buf, layers, g, flag)
                return mega(w, buf, cnt, layers, g, pf, flag)

            buf.zero_()
            buf[:HIDDEN] = x0
            make(2)()
            torch.cuda.synchronize()
            out = buf.clone()
            same = want is None or bool(torch.equal(out, want))
            want = out if want is None else want
            hung = name.startswith("mega") and bool(int(cnt.item()) & HANG)
            t = float("nan") if hung else time_graph(make(args.layers), args.reps)
            hung = hung or (name.startswith("mega") and bool(int(cnt.item()) & HANG))
            us = t / args.layers * 1e6
            r = {
                "grid": g,
                "variant": name,
                "prefetch": pf,
                "us_per_layer": us,
                "tb_s": gb / t / 1e3 if t == t else None,
                "same_bits_2_layers": same,
                "hung": hung,
                "nonzero": int((out != 0).sum().item()),
            }
            print(
                f"G={g:4d} {name:<12s} prefetch {pf:5d} B: {us:7.2f} us/layer  {r['tb_s'] or 0:.3f} TB/s"
                f"  {'same bits' if same else 'DIFFERENT'}{'  HUNG' if hung else ''}",
                flush=True,
            )
            if args.json is not None:
                with args.json.open("a") as f:
                    f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
