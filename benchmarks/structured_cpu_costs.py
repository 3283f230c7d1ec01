"""Host costs of structured outputs that the engine's step benchmark does not time (CPU only).

1. Detokenization of a constrained stream in the API process: a short JSON answer, then EOS
   tokens to ``--output-len`` (what a finished grammar gives under ``ignore_eos``); time per
   ``IncrementalDetokenizer.update`` over the first 40 and the last 100 tokens, and in all.
2. Grammar compilation against a latency-critical thread: a thread that sleeps 0.5 ms in a loop
   (a stand-in for the engine loop) records the gaps between its wake-ups, idle and while fresh
   JSON schemas compile, for each ``(concurrent compilations, xgrammar threads each)`` setting.
   A compilation that held the GIL would show gaps as long as itself; a compilation that takes
   the CPUs shows long P99 gaps.

Usage (repository root)::

    python benchmarks/structured_cpu_costs.py --model ../shared/assets/models/qwen3-8b \\
        --result-file OUT/cpu_costs.json
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def detok_cost(tokenizer: Any, output_len: int) -> dict[str, float]:
    """Microseconds per ``update`` of one 1-token step of a JSON-then-EOS stream."""
    from surge.tokenizer import IncrementalDetokenizer

    eos = tokenizer.eos_token_id
    ids = tokenizer.encode('{"name": "abc", "age": 12, "tags": ["x", "y"]}', add_special_tokens=False)
    ids = ids + [eos] * (output_len - len(ids))
    d = IncrementalDetokenizer(tokenizer, list(range(100, 356)))
    per: list[float] = []
    t0 = time.perf_counter()
    for t in ids:
        s = time.perf_counter()
        d.update([t])
        per.append(time.perf_counter() - s)
    total = time.perf_counter() - t0
    return {
        "output_len": output_len,
        "total_ms": total * 1e3,
        "first_40_us_per_token": sum(per[:40]) / 40 * 1e6,
        "last_100_us_per_token": sum(per[-100:]) / 100 * 1e6,
    }


def _schema(i: int) -> str:
    props = {f"k{i}_{j}": {"type": ["string", "integer", "boolean"][j % 3]} for j in range(8)}
    props["tags"] = {"type": "array", "items": {"type": "string"}, "maxItems": 5}
    return json.dumps({"type": "object", "properties": props, "required": list(props)})


def _gaps_while(work: Any, settle_s: float = 0.2) -> list[float]:
    stop = threading.Event()
    gaps: list[float] = []

    def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.0005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    th = threading.Thread(target=ticker)
    th.start()
    time.sleep(settle_s)
    gaps.clear()
    work()
    stop.set()
    th.join()
    return gaps


def _summary(gaps: list[float]) -> dict[str, float]:
    g = sorted(gaps)
    return {
        "wakeups": len(g),
        "p50_gap_ms": g[len(g) // 2] * 1e3,
        "p99_gap_ms": g[int(len(g) * 0.99)] * 1e3,
        "max_gap_ms": g[-1] * 1e3,
    }


def compile_stall(info: Any, settings: list[tuple[int, int]], compiles: int) -> list[dict[str, Any]]:
    """Ticker gaps idle and while ``compiles`` fresh schemas compile, per setting."""
    import xgrammar as xgr

    rows: list[dict[str, Any]] = [{"setting": "idle", **_summary(_gaps_while(lambda: time.sleep(1.0)))}]
    base = 0
    for workers, threads in settings:
        compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
        compiler.compile_json_schema(_schema(10_000 + workers * 100 + threads))  # warm
        times: list[float] = []

        def one(i: int, compiler: Any = compiler, times: list[float] = times) -> None:
            s = time.perf_counter()
            compiler.compile_json_schema(_schema(i))
            times.append(time.perf_counter() - s)

        def work(workers: int = workers, one: Any = one, start: int = base) -> None:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(one, range(start, start + compiles)))

        t0 = time.perf_counter()
        gaps = _gaps_while(work)
        wall = time.perf_counter() - t0
        base += compiles
        rows.append(
            {
                "setting": f"{workers} concurrent x {threads} threads",
                "mean_compile_ms": sum(times) / len(times) * 1e3,
                "wall_s": wall,
                **_summary(gaps),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model folder (its tokenizer)")
    p.add_argument("--output-len", type=int, default=1024)
    p.add_argument("--compiles", type=int, default=8, help="fresh schemas compiled per setting")
    p.add_argument(
        "--settings",
        nargs="+",
        default=["1x1", "2x1", "1x8", "4x8"],
        help="CONCURRENTxTHREADS: concurrent compilations x xgrammar threads each",
    )
    p.add_argument("--result-file", required=True)
    args = p.parse_args(argv)

    import xgrammar as xgr

    from surge.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    detok = detok_cost(tokenizer, args.output_len)
    print(
        f"detokenizer, JSON then EOS to {args.output_len} tokens: {detok['total_ms']:.2f} ms per request; "
        f"{detok['first_40_us_per_token']:.1f} us/token (first 40), {detok['last_100_us_per_token']:.1f} (last 100)"
    )
    config = json.loads((Path(args.model) / "config.json").read_text())
    info = xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=int(config["vocab_size"]), stop_token_ids=[tokenizer.eos_token_id]
    )
    settings = [tuple(int(x) for x in s.split("x")) for s in args.settings]
    stall = compile_stall(info, settings, args.compiles)  # type: ignore[arg-type]
    for row in stall:
        extra = f" mean compile {row['mean_compile_ms']:.1f} ms," if "mean_compile_ms" in row else ""
        print(
            f"{row['setting']}:{extra} 0.5 ms ticker gaps p50 {row['p50_gap_ms']:.2f} "
            f"p99 {row['p99_gap_ms']:.2f} max {row['max_gap_ms']:.2f} ms"
        )
    Path(args.result_file).write_text(
        json.dumps({"detokenizer": detok, "compile_stall": stall}, indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
