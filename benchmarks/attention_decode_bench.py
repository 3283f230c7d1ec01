"""Decode attention over a paged KV cache: bf16 against FP8 caches, per tile config.

Times :func:`surge.kernels.paged_attention.paged_attention` on pure decode steps (one query
token per sequence, Qwen3-8B heads: 32 query and 8 KV heads of 128) inside CUDA graphs, with
the engine's split count (:func:`surge.kernels.paged_attention.choose_num_splits`), for every
``--configs`` tile (``block_n:num_warps:num_stages``), and checks that each result matches the
default config's. Prints microseconds per call and the KV bytes read per second. Run on a GPU
from the repository root::

    python3 benchmarks/attention_decode_bench.py --batch 16 64 --context 1024 4096
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemm_bench import time_graph  # noqa: E402

from surge.kernels.paged_attention import AttentionTileConfig, choose_num_splits, paged_attention  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--context", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--configs", nargs="+", default=["default", "64:4:2", "128:4:2", "64:4:3", "128:8:2"])
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--json", type=Path, help="append the results here")
    args = ap.parse_args()
    torch.manual_seed(0)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    for b in args.batch:
        for ctx in args.context:
            blocks_per_seq = ctx // BLOCK_SIZE
            num_blocks = b * blocks_per_seq
            q = torch.randn(b, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            kv = torch.randn(
                2, num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16
            )
            table = torch.randperm(num_blocks, device="cuda", dtype=torch.int32).view(b, blocks_per_seq)
            qsl = torch.arange(b + 1, device="cuda", dtype=torch.int32)
            seq_lens = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
            splits = choose_num_splits(b, KV_HEADS, 1, ctx, num_sms)
            for dtype in ("bf16", "fp8"):
                k, v = (
                    (kv[0], kv[1])
                    if dtype == "bf16"
                    else (kv[0].to(torch.float8_e4m3fn), kv[1].to(torch.float8_e4m3fn))
                )
                kv_bytes = 2 * b * ctx * KV_HEADS * HEAD_DIM * k.element_size()
                want = None
                for name in args.configs:
                    cfg = None
                    if name != "default":
                        bn, nw, ns = (int(x) for x in name.split(":"))
                        cfg = AttentionTileConfig(16, bn, nw, ns)

                    run = functools.partial(
                        paged_attention,
                        q,
                        k,
                        v,
                        qsl,
                        seq_lens,
                        table,
                        HEAD_DIM**-0.5,
                        num_splits=splits,
                        max_query_len=1,
                        config=cfg,
                    )
                    out = run().float()
                    if want is None:
                        want = out
                    err = (out - want).abs().max().item()
                    t = time_graph(run, args.reps)
                    row = {
                        "batch": b,
                        "context": ctx,
                        "kv": dtype,
                        "config": name,
                        "splits": splits,
                        "us": t * 1e6,
                        "tb_s": kv_bytes / t / 1e12,
                        "max_abs_diff": err,
                    }
                    print(
                        f"B={b:3d} ctx={ctx:5d} {dtype} splits={splits:2d} {name:>8s} {row['us']:8.1f} us "
                        f"{row['tb_s']:5.2f} TB/s  diff {err:.2e}"
                    )
                    if args.json is not None:
                        with args.json.open("a") as f:
                            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
