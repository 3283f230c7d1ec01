"""Wall time of one prefill step on the engine's model runner: piecewise CUDA graphs against eager.

Each step prefills ``--batch`` fresh prompts of ``T / batch`` tokens (``T`` from ``--tokens``)
and samples one token for each, like the first step of a burst of short prompts (batch 64 x 8
tokens) or one long prompt (batch 1). The runner's ``execute`` returns once the sampled ids
are on the host, so the wall time is the step's time as the engine sees it: the host's input
preparation and launches, or the GPU work when that is longer. Per ``T`` it runs ``--reps``
steps with the piecewise graphs (where ``T`` has a bucket) and as many with them switched off
(the eager forward the engine used before), after one unrecorded step of each, and reports
the medians in ms. Benchmark only.

GPU host (Qwen3-8B config, dummy weights, about a minute)::

    python3 benchmarks/prefill_step_timing.py .assets/qwen3-8b --quantization fp8 --json OUT.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from surge.core.outputs import ScheduledRequest, SchedulerOutput
from surge.engine.llm_engine import build_engine_config
from surge.request import Request
from surge.sampling_params import SamplingParams
from surge.worker.model_runner import ModelRunner


def _step(runner: ModelRunner, tag: str, tokens: int, batch: int, free: list[int]) -> float:
    """One prefill step of ``batch`` prompts, ``tokens`` in all: wall seconds of ``execute``."""
    per = tokens // batch
    sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    reqs = []
    for i in range(batch):
        n = per + (1 if i < tokens - per * batch else 0)
        r = Request(f"{tag}-{i}", [(13 * j + 7 * i + 3) % 30000 for j in range(n)], sp)
        r.block_ids = [free.pop() for _ in range(-(-n // runner.block_size))]
        reqs.append(r)
    so = SchedulerOutput([ScheduledRequest(r, r.num_tokens, True) for r in reqs], tokens)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    runner.execute(so)
    wall = time.perf_counter() - t0
    runner.execute(SchedulerOutput(finished_request_ids=[r.request_id for r in reqs]))
    for r in reqs:
        free.extend(r.block_ids)
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, nargs="+", default=[192, 256, 512, 1024, 1536, 2048])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64], help="prompts per step")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--quantization", choices=("fp8",), default=None)
    ap.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    ap.add_argument("--json", default=None, help="append one JSON line per (batch, tokens, mode)")
    args = ap.parse_args()
    config = build_engine_config(
        args.model,
        dtype=args.dtype,
        load_format="dummy",
        device="cuda",
        max_model_len=8192,
        max_num_seqs=256,
        num_kv_blocks=4096,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    runner = ModelRunner(config)
    t0 = time.perf_counter()
    runner.init_kv_cache(4096)
    print(f"init_kv_cache (warm-up and captures) {time.perf_counter() - t0:.1f} s", flush=True)
    pw = runner.piecewise
    assert pw is not None, "no piecewise graphs (CUDA graphs off?)"
    free = list(range(4095, 0, -1))
    records: list[dict[str, object]] = []
    label = (
        f"{args.dtype}{' fp8' if args.quantization else ''}{' kv8' if args.kv_cache_dtype == 'fp8' else ''}"
    )
    for batch in args.batch:
        for tokens in args.tokens:
            if tokens < batch:
                continue
            rec: dict[str, object] = {"batch": batch, "tokens": tokens, "bucket": pw.bucket_for(tokens)}
            for mode in ("piecewise", "eager"):
                runner.piecewise = pw if mode == "piecewise" else None
                _step(runner, f"w{mode}{batch}-{tokens}", tokens, batch, free)
                walls = [
                    _step(runner, f"{mode}{batch}-{tokens}-{k}", tokens, batch, free)
                    for k in range(args.reps)
                ]
                rec[f"{mode}_ms"] = round(1e3 * statistics.median(walls), 3)
            runner.piecewise = pw
            print(
                f"{label} batch {batch:3d} x {tokens // batch:5d} = {tokens:5d} tokens (bucket {rec['bucket']}): "
                f"piecewise {rec['piecewise_ms']:8.2f} ms, eager {rec['eager_ms']:8.2f} ms",
                flush=True,
            )
            records.append({"config": label, **rec})
    if args.json:
        with open(args.json, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


if __name__ == "__main__":
    main()
