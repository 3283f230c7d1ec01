"""TTFT of a fresh long prompt and of the same prompt repeated (prefix cache), at concurrency 1.

Against a running ``surge serve``: each round sends a new prompt of ``--input-len`` random token
ids (``/v1/completions`` with the ids as ``prompt``, so tokenization is not in the time), streamed,
``max_tokens`` ``--output-len`` with ``ignore_eos``; then the same prompt again. TTFT is the time
from sending the request to the first SSE event that carries a choice. Around each repeat it reads
``surge:prefix_cache_hits_total`` from ``/metrics`` and checks that it rose by the prompt's full
blocks (``(input_len - 1) // block_size * block_size`` tokens: every block but the one holding the
last token, which is computed for its logits). Prints the per-round figures and the medians;
``--out FILE`` writes them as JSON. Exit status 1 when a hit count is off.

Run (a server on port 8000)::

    python3 benchmarks/ttft_check.py --base-url http://127.0.0.1:8000 --input-len 4096 --out ttft.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import urllib.request
from typing import Any


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read().decode()


def prefix_cache_hits(base_url: str) -> float:
    """Sum of ``surge:prefix_cache_hits_total`` over its label sets (tokens)."""
    total = 0.0
    for line in _get(f"{base_url}/metrics").splitlines():
        if line.startswith("surge:prefix_cache_hits_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def model_name(base_url: str) -> str:
    return str(json.loads(_get(f"{base_url}/v1/models"))["data"][0]["id"])


def timed_completion(
    base_url: str, model: str, prompt: list[int], output_len: int
) -> tuple[float, float, int]:
    """Stream one completion; return (TTFT seconds, end-to-end seconds, usage prompt tokens)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        f"{base_url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    ttft = None
    prompt_tokens = -1
    with urllib.request.urlopen(req, timeout=600) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:
                raise RuntimeError(f"server error: {chunk['error']}")
            if chunk.get("choices") and ttft is None:
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                prompt_tokens = int(chunk["usage"]["prompt_tokens"])
    if ttft is None:
        raise RuntimeError("the stream carried no choice")
    return ttft, time.perf_counter() - t0, prompt_tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--input-len", type=int, default=4096)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block-size", type=int, default=16, help="the server's --block-size")
    parser.add_argument("--vocab-low", type=int, default=1000, help="random ids are drawn from [low, high)")
    parser.add_argument("--vocab-high", type=int, default=100000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured fresh requests first")
    parser.add_argument("--out", default=None, help="write the results as JSON to this file")
    args = parser.parse_args()
    base = args.base_url.rstrip("/")
    model = model_name(base)
    rng = random.Random(args.seed)

    def prompt() -> list[int]:
        return [rng.randrange(args.vocab_low, args.vocab_high) for _ in range(args.input_len)]

    for _ in range(args.warmup):
        timed_completion(base, model, prompt(), args.output_len)
    expected_hits = (args.input_len - 1) // args.block_size * args.block_size
    rounds: list[dict[str, Any]] = []
    ok = True
    for r in range(args.rounds):
        p = prompt()
        fresh_ttft, fresh_e2e, n = timed_completion(base, model, p, args.output_len)
        before = prefix_cache_hits(base)
        cached_ttft, cached_e2e, _ = timed_completion(base, model, p, args.output_len)
        hits = prefix_cache_hits(base) - before
        ok &= hits == expected_hits
        rounds.append(
            {
                "prompt_tokens": n,
                "fresh_ttft_ms": round(fresh_ttft * 1e3, 2),
                "fresh_e2e_ms": round(fresh_e2e * 1e3, 2),
                "cached_ttft_ms": round(cached_ttft * 1e3, 2),
                "cached_e2e_ms": round(cached_e2e * 1e3, 2),
                "prefix_cache_hit_tokens": hits,
            }
        )
        print(
            f"round {r}: {n} prompt tokens, fresh TTFT {fresh_ttft * 1e3:7.2f} ms, "
            f"cached TTFT {cached_ttft * 1e3:7.2f} ms, prefix-cache hits +{hits:.0f} "
            f"(expected {expected_hits})",
            flush=True,
        )
    summary = {
        "input_len": args.input_len,
        "output_len": args.output_len,
        "median_fresh_ttft_ms": round(statistics.median(x["fresh_ttft_ms"] for x in rounds), 2),
        "median_cached_ttft_ms": round(statistics.median(x["cached_ttft_ms"] for x in rounds), 2),
        "expected_hit_tokens": expected_hits,
        "hits_ok": ok,
        "rounds": rounds,
    }
    print(
        f"median TTFT: fresh {summary['median_fresh_ttft_ms']} ms, cached {summary['median_cached_ttft_ms']} ms; "
        f"hit counts {'as expected' if ok else 'NOT as expected'}"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
