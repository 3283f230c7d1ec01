"""CPU A/B of three ways to fill the token bitmask rows of ``ROWS`` xgrammar matchers (Qwen3
tokenizer, every matcher inside a JSON string, where a row's fill costs the most): one thread,
xgrammar's ``BatchGrammarMatcher(THREADS)``, and a persistent ``ThreadPoolExecutor(THREADS)``
of per-row ``fill_next_token_bitmask`` calls. The three masks must be equal.

Usage (repository root; no GPU needed)::

    python3 benchmarks/structured_fill_ab.py --model .assets/qwen3-8b --rows 64 --threads 4

Prints the median and P90 milliseconds of 50 fills per way.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from structured_host_step import SCHEMA  # the same schema as the serving benchmark


def main() -> None:
    """Run the A/B and print one line per way."""
    import torch
    import xgrammar as xgr
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Qwen3 folder (tokenizer)")
    parser.add_argument("--vocab-size", type=int, default=151936)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    tok = AutoTokenizer.from_pretrained(args.model)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=args.vocab_size)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    rows, threads = args.rows, args.threads
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
    for m in matchers:
        for t in tok.encode('{"name": "abc'):
            if not m.accept_token(t):
                raise SystemExit(f"token {t} rejected")
    mask = xgr.allocate_token_bitmask(rows, args.vocab_size)
    batch = xgr.BatchGrammarMatcher(threads)
    pool = ThreadPoolExecutor(threads)

    def chunk(lo: int, hi: int) -> None:
        for j in range(lo, hi):
            matchers[j].fill_next_token_bitmask(mask, j)

    def via_pool() -> None:
        step = (rows + threads - 1) // threads
        for f in [pool.submit(chunk, i, min(rows, i + step)) for i in range(0, rows, step)]:
            f.result()

    ways = [
        ("one thread", lambda: chunk(0, rows)),
        ("BatchGrammarMatcher", lambda: batch.batch_fill_next_token_bitmask(matchers, mask)),
        ("persistent pool", via_pool),
    ]
    reference = None
    for name, fill in ways:
        fill()
        if reference is None:
            reference = mask.clone()
        if not torch.equal(reference, mask):
            raise SystemExit(f"{name}: the mask differs")
        times = []
        for _ in range(50):
            t0 = time.perf_counter()
            fill()
            times.append(time.perf_counter() - t0)
        print(
            f"{name}: rows {rows} threads {threads} median {np.median(times) * 1e3:.3f} ms"
            f" p90 {np.percentile(times, 90) * 1e3:.3f} ms"
        )
    pool.shutdown()


if __name__ == "__main__":
    main()
