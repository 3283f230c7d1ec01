"""The engine's steps while a burst of requests arrives, without HTTP (engine only).

Builds one engine as ``surge serve`` would (``load_format="dummy"``, CUDA graphs, asynchronous
scheduling on CUDA) and feeds it ``--c`` requests of ``--input-len`` random token ids, the
``k``-th at ``k * --spacing-ms`` after the first (what an API process that takes in one request
every ``spacing`` milliseconds hands the engine; 0 is all at once), each asking for
``--output-len`` tokens with ``ignore_eos``. Between steps it adds every request whose time has
come, as the engine process's loop does. Prints each of the first ``--show`` steps (start time,
wall duration, requests and tokens scheduled, of which prefill), then each request's time from
its arrival to its first token and the time until the last request had its first token.
``--tail`` also prints the burst's last steps (where its requests finish). Each step also records
the host milliseconds the runner took to prepare its inputs (``prepare_ms``) and to launch it
(``launch_ms``, up to the wait for the sampled ids): a launch as long as the step's device time
means the host waited for the GPU inside it. On CUDA each burst records the caching allocator's
``num_alloc_retries``, ``num_sync_all_streams``, ``num_device_alloc`` and ``num_device_free``
during it (``allocator``), and ``--sync-debug`` counts every PyTorch call that synchronised with
the GPU (``torch.cuda.set_sync_debug_mode("warn")``) by its Python file and line. ``--json`` appends one record per run.
Before the bursts it times one full garbage collection and then freezes the collector
(``gc.freeze()``), as the engine process does before serving: without that, a collection
scanning the whole engine (90 ms for Qwen3-8B FP8 on an H100) could start inside a step and
pass for the engine's own time.

Run on the GPU host (from the repository root)::

    python3 benchmarks/burst_steps.py --model .assets/qwen3-8b --quantization fp8 \\
        --c 64 --input-len 32 --spacing-ms 1.4 0.4 0
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from surge.engine.llm_engine import LLMEngine, build_engine_config  # noqa: E402
from surge.sampling_params import SamplingParams  # noqa: E402

ALLOCATOR_STATS = ("num_alloc_retries", "num_sync_all_streams", "num_device_alloc", "num_device_free")


def run_burst(
    engine: LLMEngine, c: int, input_len: int, output_len: int, spacing_s: float, seed: int, vocab: int
) -> dict[str, object]:
    """One burst (see the module docstring). Returns ``steps`` (per ``step()`` call: start and
    wall milliseconds, requests, tokens, prefill tokens, new requests, and the runner's
    ``prepare_ms`` / ``launch_ms``), ``ttft_ms`` per request (engine-side: the call that returned
    its first token), their mean, the last first token's time, ``end_ms`` (when the call that
    returned the burst's last token ended) and ``allocator`` (the caching allocator's counter
    deltas over the burst; empty off CUDA)."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(min(1000, vocab // 2), vocab, input_len).tolist() for _ in range(c)]
    params = SamplingParams(temperature=0.6, top_p=0.95, top_k=20, max_tokens=output_len, ignore_eos=True)
    steps: list[dict[str, float | int]] = []
    first: dict[int, float] = {}
    original = engine._schedule

    def traced():  # type: ignore[no-untyped-def]
        out = original()
        new = sum(1 for s in out.scheduled if s.request.num_computed_tokens == 0)
        prefill = sum(s.num_new_tokens for s in out.scheduled if s.num_new_tokens > 1)
        steps[-1].update(reqs=len(out.scheduled), tokens=out.num_scheduled_tokens, prefill=prefill, new=new)
        return out

    engine._schedule = traced  # type: ignore[method-assign]
    runner = engine.runner
    launch = getattr(runner, "execute_async", None)

    def timed_launch(scheduler_output):  # type: ignore[no-untyped-def]
        handle = launch(scheduler_output)
        started, prepared, launched = handle.launch_times
        steps[-1].update(prepare_ms=(prepared - started) * 1e3, launch_ms=(launched - prepared) * 1e3)
        return handle

    if launch is not None:
        runner.execute_async = timed_launch
    cuda = torch.cuda.is_available() and engine.runner.device.type == "cuda"
    before = torch.cuda.memory_stats() if cuda else {}
    t0 = time.perf_counter()
    added = 0
    try:
        while added < c or engine.has_unfinished_requests():
            now = time.perf_counter() - t0
            while added < c and added * spacing_s <= now:
                engine.add_request(f"b{seed}-{added}", prompts[added], params)
                added += 1
            if not engine.has_unfinished_requests():
                time.sleep(max(0.0, added * spacing_s - now))
                continue
            steps.append({"start_ms": now * 1e3})
            outs = engine.step()
            end = time.perf_counter() - t0
            steps[-1]["ms"] = (end - now) * 1e3
            for o in outs:
                k = int(o.request_id.rsplit("-", 1)[1])
                if k not in first and o.new_token_ids:
                    first[k] = end
        end_ms = (time.perf_counter() - t0) * 1e3
    finally:
        engine._schedule = original  # type: ignore[method-assign]
        if launch is not None:
            del runner.execute_async  # the class's method again
    ttft = [(first[k] - k * spacing_s) * 1e3 for k in range(c)]
    after = torch.cuda.memory_stats() if cuda else {}
    return {
        "allocator": {k: after[k] - before.get(k, 0) for k in ALLOCATOR_STATS if k in after},
        "spacing_ms": spacing_s * 1e3,
        "steps": steps,
        "ttft_ms": ttft,
        "mean_ttft_ms": statistics.mean(ttft),
        "last_first_token_ms": max(first.values()) * 1e3,
        "end_ms": end_ms,
    }


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` (default ``sys.argv[1:]``), build the engine and run the bursts; prints
    each measured burst's steps (milliseconds) and, with ``--json``, appends one record per
    burst. Bad flags exit 2 with argparse's line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--c", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--spacing-ms", type=float, nargs="+", default=[1.4, 0.4, 0.0])
    ap.add_argument("--rounds", type=int, default=2, help="bursts per spacing; the first warms up")
    ap.add_argument("--show", type=int, default=16)
    ap.add_argument("--tail", type=int, default=0, help="also print the burst's last TAIL steps")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--sync-debug", action="store_true", help="count the PyTorch calls that synchronise (CUDA)"
    )
    args = ap.parse_args(argv)
    engine = LLMEngine(
        build_engine_config(args.model, dtype=args.dtype, load_format="dummy", quantization=args.quantization)
    )
    # As the engine process does before serving (surge/engine/core_proc.py): the engine's
    # long-lived objects leave the collector's generations, so that a collection starting
    # inside a step's launch scans only that step's garbage. Timed once, for the record.
    t = time.perf_counter()
    gc.collect()
    print(f"a full garbage collection over the engine took {(time.perf_counter() - t) * 1e3:.1f} ms; frozen")
    gc.freeze()
    vocab = engine.config.model.vocab_size
    syncs: collections.Counter[str] = collections.Counter()
    for spacing in args.spacing_ms:
        for rnd in range(args.rounds):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if args.sync_debug and torch.cuda.is_available():
                    torch.cuda.set_sync_debug_mode("warn")
                try:
                    r = run_burst(engine, args.c, args.input_len, args.output_len, spacing / 1e3, rnd, vocab)
                finally:
                    if args.sync_debug and torch.cuda.is_available():
                        torch.cuda.set_sync_debug_mode(0)
            for w in caught:
                if "synchroniz" in str(w.message):
                    syncs[f"{w.filename}:{w.lineno}: {str(w.message).splitlines()[0]}"] += 1
            steps = r["steps"]
            assert isinstance(steps, list)
            print(
                f"spacing {spacing} ms round {rnd}: mean TTFT {r['mean_ttft_ms']:.1f} ms, last first token at "
                f"{r['last_first_token_ms']:.1f} ms, last token at {r['end_ms']:.1f} ms, {len(steps)} steps",
                flush=True,
            )
            if rnd == args.rounds - 1:
                shown = steps[: args.show]
                tail = steps[max(args.show, len(steps) - args.tail) :] if args.tail > 0 else []
                if tail:
                    shown += [{"start_ms": -1.0, "ms": 0.0}, *tail]
                for s in shown:
                    if s["start_ms"] < 0:
                        print("  ...")
                        continue
                    print(
                        f"  step at {s['start_ms']:7.1f} ms: {s['ms']:6.2f} ms, {s.get('reqs', 0):3d} reqs "
                        f"({s.get('new', 0)} new), {s.get('tokens', 0):5d} tokens ({s.get('prefill', 0)} prefill), "
                        f"prepare {s.get('prepare_ms', 0.0):5.2f} ms, launch {s.get('launch_ms', 0.0):6.2f} ms"
                    )
                if r["allocator"]:
                    print(f"  allocator during the burst: {r['allocator']}")
                if args.json is not None:
                    with args.json.open("a") as f:
                        f.write(json.dumps({"c": args.c, "input_len": args.input_len, **r}) + "\n")
            engine.reset_prefix_cache()
    if args.sync_debug:
        print("synchronising PyTorch calls during the bursts (count, where):")
        for where, n in syncs.most_common():
            print(f"  {n:6d}  {where}")


if __name__ == "__main__":
    main()
