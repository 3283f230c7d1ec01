"""GPU microbenchmark of Surge's Triton kernels at Qwen3-8B shapes (needs a CUDA GPU).

Decode attention at batch 1, 16 and 64 with a 4096-token context (32 q heads, 8 KV heads,
head_dim 128, bf16, block_size 16, shuffled block tables), timed with
``triton.testing.do_bench``; reports the effective HBM bandwidth of the K/V read. Then decode
attention as a captured decode graph launches it (the split count fixed for
``--max-model-len``, 32 at batch 1): batch 1 and 64 at contexts 40 and 4096, in us per call
(attention + reduce) and TB/s. Also times a 4096-token prefill (TFLOP/s) and the fused
elementwise kernels against their torch equivalents. ``--sweep`` times every tile
configuration and split count for decode.

The graph-decode cases call only ``paged_attention(..., num_splits=, max_query_len=1)``, so
this file also runs against older kernels (copy it into a worktree of the older commit) for
an old-vs-new comparison.

Run: ``PYTHONPATH=. python3 benchmarks/kernels_bench.py [--sweep] [--compile] [--graph-decode-only]``
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.testing

from surge.kernels.add_rmsnorm import add_rmsnorm
from surge.kernels.kv_write import fused_qk_norm_rope_kv_write
from surge.kernels.paged_attention import AttentionTileConfig, choose_num_splits, paged_attention
from surge.kernels.silu_and_mul import silu_and_mul

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
MAX_MODEL_LEN = 40960  # Qwen3-8B's max_position_embeddings
GRAPH_DECODE_CASES = [(1, 40), (64, 40), (1, 4096), (64, 4096)]  # (batch, context tokens)
HIDDEN, INTERMEDIATE = 4096, 12288
DTYPE = torch.bfloat16


def _bench(fn: Callable[[], object], graph: bool = True) -> float:
    """Time of one ``fn`` call in microseconds.

    ``graph=True``: median over replays of a CUDA graph holding many calls (GPU time, no
    launch overhead, as decode runs in Surge). ``graph=False``: eager launches with an L2
    flush before each (includes the host launch cost when the kernel is short).
    """
    if graph:
        return float(triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")) * 1e3
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3


def _paged_inputs(batch: int, q_len: int, context: int) -> dict[str, Any]:
    """Random Qwen3-8B-shaped paged inputs.

    The cache holds enough disjoint copies of the batch's KV (>= 512 MiB, ten times the L2)
    for successive calls to cycle through, so graph replays never find it in a warm L2.
    """
    blocks_per_seq = triton.cdiv(context, BLOCK_SIZE)
    kv_bytes = 2 * batch * blocks_per_seq * BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM * 2
    copies = max(1, triton.cdiv(512 * 2**20, kv_bytes))
    num_blocks = copies * batch * blocks_per_seq + 1
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(num_blocks - 1, device="cuda").to(torch.int32) + 1
    tables = perm.view(copies, batch, blocks_per_seq)
    q = torch.randn(batch * q_len, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    qsl = torch.arange(0, batch * q_len + 1, q_len, device="cuda", dtype=torch.int32)
    seq_lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
    return {
        "q": q,
        "k_cache": k_cache,
        "v_cache": v_cache,
        "query_start_loc": qsl,
        "seq_lens": seq_lens,
        "block_tables": [tables[i].contiguous() for i in range(copies)],
    }


def _attention_call(
    inp: dict[str, Any], q_len: int, num_splits: int, config: AttentionTileConfig | None
) -> Callable[[], object]:
    out = torch.empty_like(inp["q"])
    tables = itertools.cycle(inp["block_tables"])
    return lambda: paged_attention(
        inp["q"],
        inp["k_cache"],
        inp["v_cache"],
        inp["query_start_loc"],
        inp["seq_lens"],
        next(tables),
        HEAD_DIM**-0.5,
        out,
        num_splits=num_splits,
        max_query_len=q_len,
        config=config,
    )


def bench_decode(batch_sizes: list[int], context: int, sweep: bool, num_sms: int) -> None:
    """Decode attention: time and effective K/V read bandwidth."""
    print(f"\n## decode attention, context {context}, Qwen3-8B heads, bf16")
    for batch in batch_sizes:
        inp = _paged_inputs(batch, 1, context)
        kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * 2
        splits = choose_num_splits(batch, NUM_KV_HEADS, 1, context, num_sms)
        t = _bench(_attention_call(inp, 1, splits, None))
        te = _bench(_attention_call(inp, 1, splits, None), graph=False)
        print(
            f"B={batch:3d} default splits={splits:2d}: graph {t:8.1f} us {kv_bytes / t / 1e3:6.0f} GB/s"
            f" | eager {te:8.1f} us",
            flush=True,
        )
        if not sweep or batch not in (1, 64):
            continue
        results = []
        for block_n, warps, stages in itertools.product([32, 64, 128], [4, 8], [2, 3]):
            cfg = AttentionTileConfig(block_m=16, block_n=block_n, num_warps=warps, num_stages=stages)
            t = _try_bench(_attention_call(inp, 1, splits, cfg))
            results.append((t, cfg))
        results.sort(key=lambda r: r[0])
        for t, cfg in results[:4]:
            print(f"  {cfg} splits={splits}: {t:8.1f} us {kv_bytes / t / 1e3:7.0f} GB/s")
        best = results[0][1]
        for split in [1, 2, 4, 8, 16, 32, 64] if batch == 1 else [1, 2]:
            t = _try_bench(_attention_call(inp, 1, split, best))
            print(f"  best tile, splits={split:2d}: {t:8.1f} us {kv_bytes / t / 1e3:7.0f} GB/s")
        if batch == 1:
            inp16 = _paged_inputs(16, 1, context)
            kv16 = 16 * kv_bytes
            for split in [1, 2, 4, 8]:
                t = _try_bench(_attention_call(inp16, 1, split, best))
                print(f"  B=16 best tile, splits={split:2d}: {t:8.1f} us {kv16 / t / 1e3:7.0f} GB/s")


def bench_graph_decode(num_sms: int, max_model_len: int) -> None:
    """Decode attention as a captured decode graph runs it: ``num_splits`` is chosen for
    ``max_model_len`` (what capture passes as ``max_seq_len``), not for the real context.

    Reproduces the torch.profiler measurements of a Qwen3-8B decode step (batch 1 and 64 at
    a 40-token context) and the long-context cases; the eager split choice for the real
    context is timed too when it differs. Times are per ``paged_attention`` call (attention
    plus, with splits, the reduce kernel), GPU time from CUDA-graph replays.
    """
    print(f"\n## decode attention as captured for max_model_len {max_model_len}, Qwen3-8B heads, bf16")
    for batch, context in GRAPH_DECODE_CASES:
        inp = _paged_inputs(batch, 1, context)
        kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * 2
        graph_splits = choose_num_splits(batch, NUM_KV_HEADS, 1, max_model_len, num_sms)
        eager_splits = choose_num_splits(batch, NUM_KV_HEADS, 1, context, num_sms)
        for label, splits in [("graph", graph_splits), ("eager", eager_splits)]:
            if label == "eager" and splits == graph_splits:
                continue
            t = _bench(_attention_call(inp, 1, splits, None))
            print(
                f"B={batch:3d} context={context:5d} {label} splits={splits:2d}: {t:7.2f} us/call"
                f" {kv_bytes / t / 1e6:6.3f} TB/s",
                flush=True,
            )


def _try_bench(fn: Callable[[], object], graph: bool = True) -> float:
    """Like :func:`_bench`, but infinite when the launch fails (e.g. out of shared memory)."""
    try:
        return _bench(fn, graph)
    except Exception as e:
        print(f"  launch failed: {type(e).__name__}: {str(e)[:120]}")
        return float("inf")


def bench_prefill(sweep: bool) -> None:
    """Causal prefill of 4096 tokens, and a 2048-token chunk over 2048 cached tokens."""
    print("\n## prefill attention, bf16")
    for q_len, context in [(4096, 4096), (2048, 4096), (512, 512)]:
        inp = _paged_inputs(1, q_len, context)
        # causal FLOPs: 4 * H * D per (query, visible key) pair
        pairs = q_len * (context - q_len) + q_len * (q_len + 1) / 2
        flops = 4 * NUM_HEADS * HEAD_DIM * pairs
        t = _bench(_attention_call(inp, q_len, 1, None), graph=False)
        print(f"q_len={q_len} context={context}: {t:8.1f} us  {flops / t / 1e6:6.1f} TFLOP/s")
        if not sweep or q_len != 4096:
            continue
        results = []
        for block_m, block_n, warps, stages in itertools.product([64, 128], [32, 64], [4, 8], [2, 3]):
            cfg = AttentionTileConfig(block_m=block_m, block_n=block_n, num_warps=warps, num_stages=stages)
            results.append((_try_bench(_attention_call(inp, q_len, 1, cfg), graph=False), cfg))
        results.sort(key=lambda r: r[0])
        for t, cfg in results[:4]:
            print(f"  {cfg}: {t:8.1f} us {flops / t / 1e6:6.1f} TFLOP/s")


def bench_elementwise(use_compile: bool) -> None:
    """Fused elementwise kernels vs torch eager (and torch.compile for SiLU-and-mul)."""
    print("\n## fused kernels (bytes = reads + writes)")
    for tokens in [64, 8192]:
        x = torch.randn(tokens, HIDDEN, device="cuda", dtype=DTYPE)
        res = torch.randn_like(x)
        w = torch.rand(HIDDEN, device="cuda", dtype=DTYPE) + 0.5

        def torch_add_rms(x: torch.Tensor = x, res: torch.Tensor = res, w: torch.Tensor = w) -> torch.Tensor:
            s = x + res
            sf = s.float()
            return w * (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(DTYPE)

        nbytes = 4 * tokens * HIDDEN * 2
        t = _bench(lambda x=x, res=res, w=w: add_rmsnorm(x, w, 1e-6, res))
        tt = _bench(torch_add_rms)
        print(
            f"add_rmsnorm T={tokens}: triton {t:7.1f} us ({nbytes / t / 1e3:5.0f} GB/s), torch {tt:7.1f} us"
        )

        g = torch.randn(tokens, 2 * INTERMEDIATE, device="cuda", dtype=DTYPE)
        nbytes = 3 * tokens * INTERMEDIATE * 2
        t = _bench(lambda g=g: silu_and_mul(g))
        tt = _bench(lambda g=g: torch.nn.functional.silu(g[:, :INTERMEDIATE]) * g[:, INTERMEDIATE:])
        line = (
            f"silu_and_mul T={tokens}: triton {t:7.1f} us ({nbytes / t / 1e3:5.0f} GB/s), torch {tt:7.1f} us"
        )
        if use_compile:
            try:
                fn = torch.compile(
                    lambda a: torch.nn.functional.silu(a[:, :INTERMEDIATE]) * a[:, INTERMEDIATE:]
                )
                tc = _bench(lambda g=g, fn=fn: fn(g))
                line += f", torch.compile {tc:7.1f} us"
            except Exception as e:
                line += f", torch.compile failed: {type(e).__name__}"
        print(line)

        q = torch.randn(tokens, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        k = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        v = torch.randn_like(k)
        num_blocks = triton.cdiv(tokens, BLOCK_SIZE) + 1
        k_cache = torch.zeros(num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        v_cache = torch.zeros_like(k_cache)
        slots = torch.randperm(num_blocks * BLOCK_SIZE, device="cuda")[:tokens]
        positions = torch.randint(0, 4096, (tokens,), device="cuda")
        cos = torch.rand(8192, HEAD_DIM // 2, device="cuda")
        sin = torch.rand_like(cos)
        nw = torch.ones(HEAD_DIM, device="cuda", dtype=DTYPE)
        nbytes = tokens * (2 * NUM_HEADS + 5 * NUM_KV_HEADS) * HEAD_DIM * 2
        args = (q, k, v, positions, cos, sin, k_cache, v_cache, slots, nw, nw)
        t = _bench(lambda args=args: fused_qk_norm_rope_kv_write(*args))
        print(f"qk_norm_rope_kv_write T={tokens}: {t:7.1f} us ({nbytes / t / 1e3:5.0f} GB/s)")


def main() -> None:
    """Parse flags and run the benchmarks."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="time every tile config / split count")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile SiLU-and-mul")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--skip-prefill", action="store_true")
    parser.add_argument("--skip-elementwise", action="store_true")
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=MAX_MODEL_LEN,
        help="fixes the split count of the graph-decode cases",
    )
    parser.add_argument(
        "--graph-decode-only", action="store_true", help="only the decode cases as a captured graph runs them"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("kernels_bench.py needs a CUDA GPU")
    props = torch.cuda.get_device_properties(0)
    print(
        f"# {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}"
    )
    if args.graph_decode_only:
        bench_graph_decode(props.multi_processor_count, args.max_model_len)
        return
    bench_decode(args.batch_sizes, args.context, args.sweep, props.multi_processor_count)
    bench_graph_decode(props.multi_processor_count, args.max_model_len)
    if not args.skip_prefill:
        bench_prefill(args.sweep)
    if not args.skip_elementwise:
        bench_elementwise(args.compile)


if __name__ == "__main__":
    main()
