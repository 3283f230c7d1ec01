"""GPU smoke benchmark: offline decode throughput and a per-step host/device profile.

Builds an :class:`~surge.engine.llm_engine.LLMEngine` on CUDA from a model folder's config
with random weights (``load_format="dummy"``, bf16), then for each batch size runs
``batch`` requests of ``--input-len`` random prompt tokens and exactly ``--output-len``
output tokens (greedy, ``ignore_eos``), stepping the engine loop itself
(``schedule()`` -> ``execute()`` -> ``update()``) to time each part:

- host: ``schedule`` + ``prepare`` (inputs to the device) + ``launch`` (graph replay or
  eager kernels, logits and sampler) + ``update``, in ``time.perf_counter`` seconds;
- sync: host time blocked on the copy of the sampled ids (the step's only host sync);
- device: CUDA-event span from after the input copy to the sampled ids' copy.

A decode step is host-bound when ``launch`` approaches ``device``. The roofline column
is the decode lower bound of ``shared/design.md`` §6: ``(W + sum(L) * kv_bytes_per_token)
/ HBM bandwidth`` per step, W the weight bytes read per step.

Run on the GPU host (from the repository root)::

    PYTHONPATH=. python3 benchmarks/gpu_smoke.py --model ../shared/assets/models/qwen3-8b
    PYTHONPATH=. python3 benchmarks/gpu_smoke.py --enforce-eager   # the same without CUDA graphs
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from surge.engine.llm_engine import LLMEngine, build_engine_config
from surge.sampling_params import SamplingParams

_REPO = Path(__file__).resolve().parents[1]
# ../shared next to the checkout, or shared/ inside it (as the GPU machine's copy has it).
DEFAULT_MODEL = (
    next(
        (p for p in (_REPO.parent / "shared", _REPO / "shared") if (p / "assets/models/qwen3-8b").is_dir()),
        _REPO.parent / "shared",
    )
    / "assets"
    / "models"
    / "qwen3-8b"
)
HBM_BYTES_PER_S = 4.24e12  # H200, measured read bandwidth (issue 5)


def weight_bytes_per_step(engine: LLMEngine) -> int:
    """Bytes of weights a decode step reads: every parameter but the input embedding table
    (only a few rows of it are read), the LM head included."""
    model = engine.runner.model
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.model.embed_tokens.weight
    tied = model.lm_head.weight is embed
    return total if tied else total - embed.numel() * embed.element_size()


def add_random_requests(
    engine: LLMEngine, prefix: str, batch: int, input_len: int, output_len: int, seed: int
) -> list[str]:
    """Queue ``batch`` greedy requests of ``input_len`` random prompt tokens and exactly
    ``output_len`` output tokens (``ignore_eos``); returns their ids."""
    rng = np.random.default_rng(seed)
    vocab = engine.config.model.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    ids = [f"{prefix}{batch}-s{seed}-{i}" for i in range(batch)]
    for rid in ids:
        engine.add_request(rid, rng.integers(0, vocab, input_len).tolist(), params)
    return ids


def run_batch(engine: LLMEngine, batch: int, input_len: int, output_len: int, seed: int) -> dict[str, Any]:
    """Generate ``batch`` requests to completion; return throughput and the mean per-step
    profile of the pure-decode steps.

    Raises:
        RuntimeError: a request did not get exactly ``output_len`` tokens.
    """
    ids = add_random_requests(engine, "b", batch, input_len, output_len, seed)
    runner, scheduler = engine.runner, engine.scheduler
    kv_bytes = engine.config.model.kv_bytes_per_token // engine.config.parallel.tensor_parallel_size
    weights = weight_bytes_per_step(engine)
    counts: Counter[str] = Counter()
    rows: list[dict[str, float]] = []
    roofline_s = 0.0
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        so = scheduler.schedule()
        t1 = time.perf_counter()
        if so.is_empty:
            continue
        out = runner.execute(so)
        t2 = time.perf_counter()
        for o in scheduler.update(so, out):
            counts[o.request_id] += len(o.new_token_ids)
        t3 = time.perf_counter()
        timing = runner.last_timing
        decode = so.num_scheduled_tokens == len(so.scheduled)
        context = sum(s.request.num_computed_tokens + s.num_new_tokens for s in so.scheduled)
        if decode:
            roofline_s += (weights + context * kv_bytes) / HBM_BYTES_PER_S
        if decode and timing is not None:
            rows.append(
                {
                    "schedule": t1 - t0,
                    "prepare": timing.prepare_s,
                    "launch": timing.launch_s,
                    "sync": timing.sync_s,
                    "update": t3 - t2,
                    "device": timing.device_s,
                    "step": t3 - t0,
                    "graph": float(timing.graph_bucket is not None),
                }
            )
    elapsed = time.perf_counter() - start
    bad = {rid: counts[rid] for rid in ids if counts[rid] != output_len}
    if bad:
        raise RuntimeError(f"requests without exactly {output_len} tokens: {bad}")
    mean = {k: statistics.fmean(r[k] for r in rows) for k in rows[0]} if rows else {}
    return {
        "batch": batch,
        "input_len": input_len,
        "output_len": output_len,
        "elapsed_s": elapsed,
        "output_tok_s": batch * output_len / elapsed,
        "decode_steps": len(rows),
        "decode_step_ms": {k: v * 1e3 for k, v in mean.items() if k != "graph"},
        "graph_fraction": mean.get("graph", 0.0),
        "decode_roofline_tok_s": batch * len(rows) / roofline_s if roofline_s else None,
        "decode_tok_s": batch / mean["step"] if mean else None,
    }


def run_engine_loop(
    engine: LLMEngine, batch: int, input_len: int, output_len: int, seed: int
) -> dict[str, Any]:
    """Generate ``batch`` requests through ``engine.step()`` (asynchronous scheduling when
    the engine has it on): end-to-end throughput and the mean time per output token once
    every request has its first token.

    Raises:
        RuntimeError: a request did not get exactly ``output_len`` tokens.
    """
    ids = add_random_requests(engine, "e", batch, input_len, output_len, seed)
    counts: Counter[str] = Counter()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    all_started: float | None = None
    tokens_at_start = 0
    while engine.has_unfinished_requests():
        for o in engine.step():
            counts[o.request_id] += len(o.new_token_ids)
        if all_started is None and len(counts) == batch:
            all_started = time.perf_counter()
            tokens_at_start = sum(counts.values())
    end = time.perf_counter()
    bad = {rid: counts[rid] for rid in ids if counts[rid] != output_len}
    if bad:
        raise RuntimeError(f"requests without exactly {output_len} tokens: {bad}")
    steady = (batch * output_len - tokens_at_start) / batch
    return {
        "batch": batch,
        "async_scheduling": engine.async_scheduling,
        "output_tok_s": batch * output_len / (end - start),
        "decode_ms_per_token": 1e3 * (end - all_started) / steady if all_started and steady else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Surge GPU smoke benchmark (offline decode throughput).")
    ap.add_argument("--model", default=str(DEFAULT_MODEL), help="HF model folder (config.json is enough)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    ap.add_argument(
        "--no-async-scheduling", action="store_true", help="engine.step() without asynchronous scheduling"
    )
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu, to check the script itself")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_smoke: no CUDA device", file=sys.stderr)
        return 2
    config = build_engine_config(
        args.model,
        dtype=args.dtype,
        load_format="dummy",
        device=args.device,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        async_scheduling=False if args.no_async_scheduling else None,
    )
    t0 = time.perf_counter()
    engine = LLMEngine(config)
    init_s = time.perf_counter() - t0
    runner = engine.runner
    graphs = runner.graph_runner
    print(
        f"device {torch.cuda.get_device_name() if runner.device.type == 'cuda' else 'cpu'} | torch {torch.__version__} | backend {runner.attn_backend.name} | "
        f"init {init_s:.1f} s | KV blocks {engine.num_kv_blocks} "
        f"({engine.num_kv_blocks * config.cache.block_size} tokens) | "
        f"graphs {graphs.captured if graphs is not None else 'off'} | "
        f"weights/step {weight_bytes_per_step(engine) / 1e9:.2f} GB"
    )
    runner.set_timing(True)
    results = []
    for batch in args.batches:
        run_batch(engine, batch, args.input_len, 16, seed=1)  # warm-up (compiles prefill shapes)
        res = run_batch(engine, batch, args.input_len, args.output_len, seed=0)
        results.append(res)
        ms = res["decode_step_ms"]
        if not ms:
            print(f"batch {batch:4d}: {res['output_tok_s']:9.1f} out tok/s end to end (no decode steps)")
            continue
        host = ms["schedule"] + ms["prepare"] + ms["launch"] + ms["update"]
        roof = res["decode_roofline_tok_s"]
        print(
            f"batch {batch:4d}: {res['output_tok_s']:9.1f} out tok/s end to end, "
            f"decode {res['decode_tok_s']:9.1f} tok/s (roofline {roof:9.1f}, {100 * res['decode_tok_s'] / roof:5.1f} %) "
            f"| decode step {ms['step']:.3f} ms: host {host:.3f} (schedule {ms['schedule']:.3f} "
            f"prepare {ms['prepare']:.3f} launch {ms['launch']:.3f} update {ms['update']:.3f}) "
            f"sync {ms['sync']:.3f} device {ms['device']:.3f} | graphs {100 * res['graph_fraction']:.0f} %"
        )
    runner.set_timing(False)
    engine_results = []
    for batch in args.batches:
        run_engine_loop(engine, batch, args.input_len, 16, seed=3)  # warm-up
        res = run_engine_loop(engine, batch, args.input_len, args.output_len, seed=2)
        engine_results.append(res)
        print(
            f"batch {batch:4d} via engine.step() (async_scheduling={res['async_scheduling']}): "
            f"{res['output_tok_s']:9.1f} out tok/s end to end, "
            f"{res['decode_ms_per_token']:.3f} ms per decode step"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, "results": results, "engine": engine_results},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
