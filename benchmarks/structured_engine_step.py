"""The engine's decode step with and without a grammar on every request, no server: where a
constrained step's time goes on the host.

Builds one ``LLMEngine`` (random weights, the device's defaults: CUDA graphs and asynchronous
scheduling on CUDA), then for each ``--batch`` runs ``--batch`` requests of ``--input-len``
random tokens and ``--output-len`` tokens (ignore_eos) twice: plain, then with the JSON schema
of benchmarks/h200_features.sh. For the decode steps (all requests running) it reports the mean
wall time of ``engine.step()`` and, for the constrained run, the host seconds per step spent
waiting for the previous step's ids inside the mask (``StepHandle.sampled_token_ids``) and
filling the mask (``StructuredOutputManager.fill`` minus that wait).

Usage (repository root)::

    python3 benchmarks/structured_engine_step.py --model .assets/qwen3-8b --batch 16 64 \\
        [--result-file OUT/engine_step.json]
    # CPU smoke: --model surge/assets/stories260K --device cpu --batch 4 --output-len 32
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "tags"],
}


class _Timers:
    def __init__(self) -> None:
        self.wait = 0.0
        self.fill = 0.0


def _install_timers(timers: _Timers) -> None:
    """Wrap the mask fill and the wait for the previous step's ids with host timers."""
    from surge.structured.manager import StructuredOutputManager
    from surge.worker.model_runner import StepHandle

    fill, wait = StructuredOutputManager.fill, StepHandle.sampled_token_ids

    def timed_fill(self: Any, *a: Any, **k: Any) -> int:
        t0 = time.perf_counter()
        try:
            return fill(self, *a, **k)
        finally:
            timers.fill += time.perf_counter() - t0

    def timed_wait(self: Any) -> dict[str, int]:
        t0 = time.perf_counter()
        try:
            return wait(self)
        finally:
            timers.wait += time.perf_counter() - t0

    StructuredOutputManager.fill = timed_fill  # type: ignore[method-assign]
    StepHandle.sampled_token_ids = timed_wait  # type: ignore[method-assign]


def _run(engine: Any, batch: int, input_len: int, output_len: int, grammar: bool, tag: str) -> dict[str, Any]:
    from surge.sampling_params import SamplingParams, StructuredOutputsParams

    so = StructuredOutputsParams(json=json.dumps(SCHEMA)) if grammar else None
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, structured_outputs=so)
    rng = np.random.default_rng(batch)
    vocab = min(engine.config.model.vocab_size, 10_000)
    for i in range(batch):
        engine.add_request(f"{tag}-{i}", rng.integers(10, vocab, input_len).tolist(), params)
    while engine.get_stats().num_waiting and engine.has_unfinished_requests():
        engine.step()  # admission, prefill, the grammar's compilation
    times: list[float] = []
    timers = _TIMERS
    timers.wait = timers.fill = 0.0
    produced = 0
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        outs = engine.step()
        times.append(time.perf_counter() - t0)
        produced += sum(len(o.new_token_ids) for o in outs)
    steady = times[2:-2] if len(times) > 8 else times
    n = max(1, len(times))
    return {
        "batch": batch,
        "grammar": grammar,
        "steps": len(times),
        "mean_step_ms": 1e3 * float(np.mean(steady)),
        "median_step_ms": 1e3 * float(np.median(steady)),
        "tokens_per_s": produced / max(1e-9, sum(times)),
        "mask_wait_ms_per_step": 1e3 * timers.wait / n,
        "mask_fill_ms_per_step": 1e3 * (timers.fill - timers.wait) / n,
    }


_TIMERS = _Timers()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", required=True, help="model folder (config.json + tokenizer; weights are random)"
    )
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--result-file", default=None)
    args = ap.parse_args(argv)
    if not Path(args.model, "config.json").is_file():
        print(f"structured_engine_step: no config.json in {args.model!r}", file=sys.stderr)
        return 2
    from surge.engine.llm_engine import LLMEngine, build_engine_config

    config = build_engine_config(
        args.model,
        dtype="bfloat16" if args.device != "cpu" else "auto",
        load_format="dummy",
        device=args.device,
        max_num_seqs=max(256, max(args.batch)),
        max_num_batched_tokens=8192,
        max_model_len=args.input_len + args.output_len + 16,
    )
    engine = LLMEngine(config)
    _install_timers(_TIMERS)
    _run(engine, 2, args.input_len, 8, grammar=True, tag="warm")  # compiles the schema once
    results = []
    for b in args.batch:
        for grammar in (False, True):
            r = _run(engine, b, args.input_len, args.output_len, grammar, f"b{b}-{grammar}")
            results.append(r)
            print(
                f"batch {b:3d} {'json_schema' if grammar else 'plain      '}: step {r['mean_step_ms']:.2f} ms "
                f"(median {r['median_step_ms']:.2f}), {r['tokens_per_s']:.0f} tok/s; mask: wait "
                f"{r['mask_wait_ms_per_step']:.2f} ms + fill {r['mask_fill_ms_per_step']:.2f} ms per step"
            )
    engine.close()
    if args.result_file:
        meta = {"model": args.model, "device": config.device, "async_scheduling": config.async_scheduling}
        Path(args.result_file).write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
