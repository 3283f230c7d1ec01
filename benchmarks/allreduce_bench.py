"""Latency of the tensor-parallel all-reduce on this host's GPUs: NCCL against torch symmetric memory.

A decode step of Qwen3-8B at TP=2 runs 73 all-reduces of a ``[T, 4096]`` bf16 tensor (two per
layer and one after the embedding), inside a CUDA graph. This times that pattern: 73 back-to-back
all-reduces captured in one graph, replayed, for each method and row count ``T``, and checks each
result against the exact sum. Methods:

- ``nccl``: ``torch.distributed.all_reduce`` (what Surge uses today);
- ``symm_one_shot``: ``torch.ops.symm_mem.one_shot_all_reduce_out`` (each rank reads every peer's
  buffer over NVLink and sums; no multicast);
- ``symm_two_shot``: ``torch.ops.symm_mem.two_shot_all_reduce_`` (reduce-scatter then all-gather
  through peer memory, in place).

Usage, on a host with at least two GPUs (one process per GPU is spawned)::

    python3 benchmarks/allreduce_bench.py --world-size 2 [--rows 1,8,64,256,2048]

Prints one JSON line per (method, rows): microseconds per all-reduce inside the graph and eagerly,
or the error that method raised.
"""

from __future__ import annotations

import argparse
import json
import os
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HIDDEN = 4096
PER_STEP = 73


def _time_graph(fn, reps: int = 30) -> float:
    """Microseconds per call of ``fn`` captured ``PER_STEP`` times in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(PER_STEP):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * PER_STEP)


def _time_eager(fn, reps: int = 200) -> float:
    """Microseconds per eager call of ``fn``."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def _worker(rank: int, world: int, rows_list: list[int], port: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    group_name = dist.group.WORLD.group_name
    max_rows = max(rows_list)
    symm = None
    try:
        import torch.distributed._symmetric_memory as symm_mem

        symm = symm_mem.empty(max_rows * HIDDEN, dtype=torch.bfloat16, device=dev)
        symm_mem.rendezvous(symm, group_name)
    except Exception as e:  # noqa: BLE001 - reported, the NCCL rows still run
        if rank == 0:
            print(json.dumps({"method": "symm_mem", "error": f"{type(e).__name__}: {e}"}), flush=True)
        symm = None
    for rows in rows_list:
        n = rows * HIDDEN
        fill = float(rank + 1)
        expected = float(sum(range(1, world + 1)))
        x = torch.full((rows, HIDDEN), fill, dtype=torch.bfloat16, device=dev)
        out = torch.empty_like(x)
        methods = {"nccl": lambda x=x: dist.all_reduce(x)}
        if symm is not None:
            sv = symm[:n].view(rows, HIDDEN)
            methods["symm_one_shot"] = lambda sv=sv, out=out: torch.ops.symm_mem.one_shot_all_reduce_out(
                sv, "sum", group_name, out
            )
            methods["symm_two_shot"] = lambda sv=sv: torch.ops.symm_mem.two_shot_all_reduce_(
                sv, "sum", group_name
            )
        for name, fn in methods.items():
            row: dict[str, object] = {"method": name, "rows": rows, "bytes": n * 2}
            try:
                # correctness, once, from a known input
                if name == "nccl":
                    x.fill_(fill)
                    fn()
                    got = x
                elif name == "symm_one_shot":
                    symm[:n].fill_(fill)
                    fn()
                    got = out
                else:
                    symm[:n].fill_(fill)
                    fn()
                    got = symm[:n]
                torch.cuda.synchronize()
                row["correct"] = bool(torch.all(got == expected).item())
                row["eager_us"] = round(_time_eager(fn), 2)
                row["graph_us"] = round(_time_graph(fn), 2)
            except Exception as e:  # noqa: BLE001 - one method failing must not hide the others
                row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                if rank == 0:
                    traceback.print_exc()
            if rank == 0:
                print(json.dumps(row), flush=True)
            dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--rows", default="1,8,64,256,2048")
    p.add_argument("--port", type=int, default=29533)
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    mp.spawn(_worker, args=(args.world_size, rows, args.port), nprocs=args.world_size)


if __name__ == "__main__":
    main()
