"""CPU micro-benchmark: the host work of one decode step for its grammar-constrained rows.

For ``--rows`` constrained requests with a JSON schema on the real Qwen3 tokenizer (151,936
logits), each step advances every request's xgrammar matcher over its previous token and
builds the step's token mask, as the engine does; a random allowed token is then drawn per
row from the mask (untimed), like a model with random weights (the H200 benchmark uses dummy
weights), and becomes the next step's pending token (asynchronous scheduling: the matcher
takes it from the step in flight before the scheduler appends it to the outputs).

Two ways are timed on the same token paths:

- ``sequential``: the first implementation, one row at a time: ``accept_token`` then
  ``fill_next_token_bitmask`` into a full ``[S, ceil(V / 32)]`` mask reset to all ones;
- ``engine``: :meth:`surge.structured.manager.StructuredOutputManager.fill`, the engine's
  path (batched fill on xgrammar's thread pool, packed mask of the constrained rows only).

Usage (repository root; no GPU needed)::

    python3 benchmarks/structured_host_step.py --model ../shared/assets/models/qwen3-8b \\
        --rows 16 64 --steps 200 [--result-file OUT.json]

Prints mean / median / P99 milliseconds per step of each way; with ``--result-file`` writes
them as JSON. The masks of both ways are compared at every step (a mismatch is an error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "tags"],
}
"""The schema of benchmarks/h200_features.sh."""


def _allowed(row: np.ndarray, vocab: int) -> np.ndarray:
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab]
    return np.flatnonzero(bits)


def run(
    model: str, rows: int, steps: int, seed: int, schema: dict[str, Any], fill_threads: int | None = None
) -> dict[str, Any]:
    """Time ``steps`` steps of ``rows`` constrained rows both ways; returns the figures (ms).
    ``fill_threads`` overrides the batch matcher's thread count (default: the engine's)."""
    import xgrammar as xgr

    from surge.config import ModelConfig
    from surge.request import Request
    from surge.sampling_params import SamplingParams, StructuredOutputsParams
    from surge.structured.manager import StructuredOutputManager

    mc = ModelConfig.from_pretrained(model, load_format="dummy")
    vocab = mc.vocab_size
    eos = tuple(mc.eos_token_ids)
    manager = StructuredOutputManager(model, vocab, eos, "cpu")
    if fill_threads is not None:
        manager._fill_threads = fill_threads
    params = SamplingParams(
        max_tokens=steps + 1,
        ignore_eos=True,
        structured_outputs=StructuredOutputsParams(json=json.dumps(schema)),
    )
    t0 = time.perf_counter()
    compiled = manager.cache.submit(params.structured_outputs).result()  # type: ignore[arg-type]
    compile_s = time.perf_counter() - t0
    requests = [Request(f"r{i}", [1, 2, 3], params, frozenset(eos)) for i in range(rows)]
    for r in requests:
        manager.add(r)
    ready, failed = manager.take_ready()
    assert len(ready) == rows and not failed
    seq_matchers = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
    seq_done = [False] * rows
    width = (vocab + 31) // 32
    full = torch.empty(rows, width, dtype=torch.int32)
    stop_row = np.zeros(width, dtype=np.uint32)
    for t in eos:
        stop_row[t >> 5] |= np.uint32(1 << (t & 31))
    rng = np.random.default_rng(seed)
    pending: list[int] | None = None
    t_seq: list[float] = []
    t_eng: list[float] = []
    for step in range(steps):
        # sequential: the first implementation, row by row
        t0 = time.perf_counter()
        full.fill_(-1)
        for i, m in enumerate(seq_matchers):
            if pending is not None and not seq_done[i]:
                assert m.accept_token(pending[i])
                seq_done[i] = m.is_terminated()
            if seq_done[i]:
                full[i] = torch.from_numpy(stop_row.view(np.int32))
            else:
                m.fill_next_token_bitmask(full, i)
        t_seq.append(time.perf_counter() - t0)
        # engine: the manager's fill, the pending token taken from the "step in flight"
        prev = (
            None if pending is None else {r.request_id: tok for r, tok in zip(requests, pending, strict=True)}
        )
        for r in requests:
            r.num_pending_outputs = 0 if prev is None else 1
        t0 = time.perf_counter()
        n = manager.fill(requests, manager.grammars, None if prev is None else (lambda p=prev: p))
        t_eng.append(time.perf_counter() - t0)
        mask, row_ids = manager.buffer.filled_views(n)
        packed = np.full((rows, width), -1, dtype=np.int32)
        packed[row_ids.numpy()] = mask.numpy()
        if not np.array_equal(packed, full.numpy()):
            raise SystemExit(f"step {step}: the engine's mask differs from the sequential one")
        # the scheduler's update lands the pending tokens; the model draws the next ones
        if pending is not None:
            for r, tok in zip(requests, pending, strict=True):
                r.output_token_ids.append(tok)
        pending = [int(rng.choice(_allowed(full[i].numpy(), vocab))) for i in range(rows)]

    def stats(xs: list[float]) -> dict[str, float]:
        a = 1e3 * np.asarray(xs[1:])  # the first step has no token to accept
        return {
            "mean_ms": float(a.mean()),
            "median_ms": float(np.median(a)),
            "p99_ms": float(np.percentile(a, 99)),
        }

    return {
        "rows": rows,
        "fill_threads": manager._fill_threads,
        "steps": steps,
        "compile_s": compile_s,
        "terminated_rows_at_end": int(sum(seq_done)),
        "sequential": stats(t_seq),
        "engine": stats(t_eng),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="../shared/assets/models/qwen3-8b", help="model folder (tokenizer + config)"
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64], help="constrained rows per step")
    parser.add_argument("--steps", type=int, default=200, help="decode steps timed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--fill-threads",
        type=int,
        nargs="+",
        default=[None],
        help="batch fill threads at most, one run each (default: the engine's)",
    )
    parser.add_argument("--result-file", default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    if not Path(args.model, "config.json").is_file():
        print(f"structured_host_step: no config.json in {args.model!r}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    results = []
    for threads in args.fill_threads:
        for rows in args.rows:
            r = run(args.model, rows, args.steps, args.seed, SCHEMA, threads)
            results.append(r)
            s, e = r["sequential"], r["engine"]
            print(
                f"rows {rows:3d}: sequential {s['mean_ms']:.2f} ms (median {s['median_ms']:.2f}, p99 {s['p99_ms']:.2f})"
                f" | engine (<= {r['fill_threads']} fill threads) {e['mean_ms']:.2f} ms (median {e['median_ms']:.2f},"
                f" p99 {e['p99_ms']:.2f}) | {r['terminated_rows_at_end']} rows finished their JSON"
            )
    if args.result_file:
        meta = {"cpus": os.cpu_count(), "xgrammar": _version("xgrammar"), "torch": torch.__version__}
        Path(args.result_file).write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    return 0


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    sys.exit(main())
