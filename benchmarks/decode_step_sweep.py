"""Decode step period at several batch sizes from one engine, optionally with split-K tiles overridden.

Builds one engine (``load_format="dummy"``, CUDA graphs) from a model folder's config, and for
each ``--batch`` B admits B requests of ``--input-len`` random tokens, runs ``--warmup`` steps
(prefill and warm decode), then times ``--steps`` decode steps by the wall clock (the step
period: what a client sees per token at that batch, host work included) and aborts them. One
JSON line per batch (``--json``), and a table on stdout.

``--tiles NAME=M:FIELDS`` (repeatable) replaces the split-K config of one Qwen3-8B weight
(``qkv``, ``o``, ``gate_up`` or ``down``) at token bucket ``M`` in
:data:`surge.quant.fp8_linear.SPLITK_MEASURED` before the engine is built, so that a tile
change can be judged in the whole step, with its neighbours, instead of one GEMM at a time
(``FIELDS`` are :data:`~surge.quant.fp8_linear.SplitKTiles`' comma-separated, e.g.
``o=1:16,64,128,4,4,4,False,kernel``; ``M=1-8`` sets buckets 1, 2, 4 and 8). This is a
benchmark's override, for A/B runs; the engine itself reads only the committed table.

Run on the GPU host (from the repository root)::

    python3 benchmarks/decode_step_sweep.py --model .assets/qwen3-8b --quantization fp8 --sample \\
        --batch 1 4 16 64 --json OUT.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from surge.engine.llm_engine import LLMEngine, build_engine_config  # noqa: E402
from surge.quant import fp8_linear  # noqa: E402
from surge.sampling_params import SamplingParams  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
"""Qwen3-8B's FP8 weight shapes ``(N, K)`` at TP=1, by name."""


def parse_tiles(spec: str) -> tuple[tuple[int, int], list[int], fp8_linear.SplitKTiles]:
    """``NAME=M:FIELDS`` -> ``((N, K), buckets, tiles)``.

    Raises:
        ValueError: an unknown name, bucket or field list.
    """
    name, _, rest = spec.partition("=")
    m_part, _, fields = rest.partition(":")
    if name not in SHAPES or not fields:
        raise ValueError(f"--tiles wants NAME=M:FIELDS with NAME in {sorted(SHAPES)}, got {spec!r}")
    lo, _, hi = m_part.partition("-")
    buckets = [b for b in fp8_linear.SPLITK_BUCKETS if int(lo) <= b <= int(hi or lo)]
    if not buckets:
        raise ValueError(f"no measured bucket in {m_part!r} (buckets: {fp8_linear.SPLITK_BUCKETS})")
    raw = fields.split(",")
    if len(raw) not in (8, 9):
        raise ValueError(f"FIELDS has 8 or 9 entries (see SplitKTiles), got {len(raw)}")
    ints = [int(v) for v in raw[:6]]
    tiles = (*ints, raw[6] == "True", raw[7], *((raw[8] == "True",) if len(raw) == 9 else ()))
    return SHAPES[name], buckets, tiles  # type: ignore[return-value]


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model folder (config.json; weights are random)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=12)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--quantization", choices=("fp8",), default=None)
    ap.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    ap.add_argument(
        "--sample", action="store_true", help="temperature 0.6, top-k 20, top-p 0.95 (else greedy)"
    )
    ap.add_argument("--tiles", action="append", default=[], help="NAME=M:FIELDS (see the module docstring)")
    ap.add_argument("--label", default="", help="a name for this run in the JSON lines")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--device", default="auto", help="cuda (the point of it) or cpu (a smoke run)")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    for spec in args.tiles:
        shape, buckets, tiles = parse_tiles(spec)
        for b in buckets:
            fp8_linear.SPLITK_MEASURED.setdefault(shape, {})[b] = tiles
    engine = LLMEngine(
        build_engine_config(
            args.model,
            dtype=args.dtype,
            load_format="dummy",
            device=args.device,
            quantization=args.quantization,
            kv_cache_dtype=args.kv_cache_dtype,
            max_num_seqs=max(max(args.batch), 1),
        )
    )
    vocab = engine.config.model.vocab_size
    rng = np.random.default_rng(0)
    temp = dict(temperature=0.6, top_k=20, top_p=0.95) if args.sample else dict(temperature=0.0)
    params = SamplingParams(max_tokens=args.warmup + args.steps + 8, ignore_eos=True, **temp)
    rows = []
    for batch in args.batch:
        ids = [f"b{batch}-{i}" for i in range(batch)]
        for rid in ids:
            engine.add_request(rid, rng.integers(3, vocab, args.input_len).tolist(), params)
        for _ in range(args.warmup):
            engine.step()
        _sync()
        periods = []
        t_prev = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
            now = time.perf_counter()
            periods.append((now - t_prev) * 1e3)
            t_prev = now
        _sync()
        engine.abort_requests(ids)
        while engine.has_unfinished_requests():
            engine.step()
        row = dict(
            label=args.label,
            batch=batch,
            tiles=args.tiles,
            median_ms=statistics.median(periods),
            mean_ms=statistics.fmean(periods),
            p90_ms=float(np.percentile(periods, 90)),
            tok_s=batch * 1e3 / statistics.median(periods),
        )
        rows.append(row)
        print(
            f"{args.label or 'run'} batch {batch:3d}: step {row['median_ms']:.3f} ms median, "
            f"{row['mean_ms']:.3f} mean, {row['p90_ms']:.3f} p90 -> {row['tok_s']:.1f} tok/s",
            flush=True,
        )
    if args.json is not None:
        with args.json.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    engine.close()


if __name__ == "__main__":
    main()
