"""How fast the GPU streams a decode GEMM's weight bytes, by access pattern, with no GEMM around it.

A decode step's FP8 GEMMs should be bound by reading their weights once. This bench times
kernels that only read an ``[N, K]`` byte matrix (Qwen3-8B's FP8 weight shapes) and sum it,
inside one CUDA graph over ``--copies`` distinct matrices (so L2 never holds one):

* ``tiles``: the split-K GEMM's pattern (:mod:`surge.kernels.fp8_gemm_splitk`): grid
  ``(N / BLOCK_N, SPLIT_K)``, each program walking its ``K`` slice in ``[BLOCK_N, BLOCK_K]`` tiles
  (``BLOCK_N`` rows, ``BLOCK_K`` contiguous bytes each, rows ``K`` bytes apart);
* ``chunks``: the same number of programs, each reading one contiguous range of the matrix
  (what a weight stored tile by tile would give);
* ``torch.sum`` of the bytes, as a library reference.

It prints microseconds per matrix and the bytes per second, so that the split-K GEMM's time
(``benchmarks/fp8_gemm_bench.py``) can be put against the memory system's own cost for the same
bytes in the same pattern.

Run on the GPU host::

    python3 benchmarks/weight_stream_bench.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemm_bench import per_call  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}


@triton.jit
def _tiles_kernel(w_ptr, out_ptr, K, K_SLICE, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = pid_s * K_SLICE + tl.arange(0, BLOCK_K)
    ptrs = w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.int32)
    for _kb in range(0, K_SLICE // BLOCK_K):
        acc += tl.load(ptrs).to(tl.int32)
        ptrs += BLOCK_K
    tl.store(out_ptr + pid_n * tl.num_programs(1) + pid_s, tl.sum(acc))


@triton.jit
def _chunks_kernel(w_ptr, out_ptr, CHUNK, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * CHUNK + tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for _kb in range(0, CHUNK // BLOCK):
        acc += tl.load(w_ptr + offs).to(tl.int32)
        offs += BLOCK
    tl.store(out_ptr + pid, tl.sum(acc))


def tiles(w: torch.Tensor, out: torch.Tensor, bn: int, bk: int, split: int, stages: int) -> None:
    """Read ``w [N, K]`` (uint8) tile by tile as the split-K GEMM does."""
    n, k = w.shape
    _tiles_kernel[(n // bn, split)](
        w, out, k, k // split, BLOCK_N=bn, BLOCK_K=bk, num_stages=stages, num_warps=4
    )


def chunks(w: torch.Tensor, out: torch.Tensor, programs: int, block: int, stages: int) -> None:
    """Read ``w`` as ``programs`` contiguous ranges of ``block``-byte loads."""
    chunk = w.numel() // programs
    _chunks_kernel[(programs,)](w, out, chunk, BLOCK=block, num_stages=stages, num_warps=4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=8, help="distinct matrices per graph (defeats L2)")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    out = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    for name, (n, k) in SHAPES.items():
        ws = [torch.randint(0, 255, (n, k), dtype=torch.uint8, device="cuda") for _ in range(args.copies)]
        nbytes = n * k
        rows = [("torch.sum", lambda w: w.sum(dtype=torch.int32))]
        for bn, bk, split in (
            (64, 128, 8),
            (64, 128, 4),
            (32, 256, 4),
            (64, 256, 2),
            (128, 128, 8),
            (16, 512, 4),
        ):
            if n % bn or k % (bk * split):
                continue
            for stages in (3, 4):
                rows.append(
                    (
                        f"tiles bn{bn} bk{bk} split{split} st{stages} ({n // bn * split} prog)",
                        lambda w, c=(bn, bk, split, stages): tiles(w, out, *c),
                    )
                )
        for programs in (256, 384, 512, 768, 1024):
            for block in (1024, 4096):
                if nbytes % (programs * block):
                    continue
                rows.append(
                    (
                        f"chunks {programs} prog block {block}",
                        lambda w, p=programs, b=block: chunks(w, out, p, b, 4),
                    )
                )
        print(f"{name} N={n} K={k} ({nbytes / 1e6:.1f} MB)")
        want = int(ws[0].sum(dtype=torch.int64))
        out.zero_()
        tiles(ws[0], out, 64, 128, 4, 3)
        got_tiles = int(out.sum(dtype=torch.int64))
        out.zero_()
        chunks(ws[0], out, 256, 1024, 3)
        if not want == got_tiles == int(out.sum(dtype=torch.int64)):
            raise SystemExit(f"{name}: a read kernel missed bytes ({want}, {got_tiles})")
        for label, fn in rows:
            t = per_call(fn, ws, args.reps)
            print(f"  {label:44s} {t * 1e6:7.2f} us  {nbytes / t / 1e12:5.2f} TB/s", flush=True)
        del ws


if __name__ == "__main__":
    main()
