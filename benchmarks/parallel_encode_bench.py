"""Whole against piecewise (parallel) tokenization of long chat prompts, on this host's CPU.

For each prompt length, builds chat prompts the way ``surge bench serve`` does for the random
dataset (random token ids of the model's vocabulary decoded to text, rendered with the chat
template), then times ``tokenizer.encode`` of the rendered text against
:func:`surge.parallel_encode.encode_text` (which splits it into pieces encoded on the
tokenizer's thread pool), alternated, and checks that both give the same ids. The BPE model's
word cache is cleared before every encode, so neither way reuses the other's words (a fresh
prompt's words are mostly not cached either). Prints one JSON
line per length: medians in milliseconds, the number of pieces and the host's CPU count.

Run::

    python3 benchmarks/parallel_encode_bench.py --tokenizer ../shared/assets/models/qwen3-8b \
        --input-lens 1024 4096 16384 --prompts 10 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

from surge.parallel_encode import encode_text, split_points
from surge.tokenizer import load_tokenizer


def main() -> None:
    """Parse the flags, time one ``encode`` against :func:`encode_text`'s pieces per prompt length
    (milliseconds, medians over prompts and rounds) and print one JSON line per length; exits 2
    on a bad flag (argparse)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True, help="a model folder with tokenizer files")
    ap.add_argument(
        "--input-lens", type=int, nargs="+", default=[1024, 4096, 16384], help="token ids per prompt"
    )
    ap.add_argument("--prompts", type=int, default=10, help="distinct prompts per length")
    ap.add_argument("--rounds", type=int, default=3, help="times each prompt is encoded each way")
    args = ap.parse_args()
    tok = load_tokenizer(args.tokenizer)
    vocab = len(tok)
    model = tok.backend_tokenizer.model
    for n in args.input_lens:
        texts = []
        for seed in range(args.prompts):
            rng = random.Random(seed)
            body = tok.decode([rng.randrange(1000, vocab - 1000) for _ in range(n)])
            texts.append(
                tok.apply_chat_template(
                    [{"role": "user", "content": body}], tokenize=False, add_generation_prompt=True
                )
            )
        whole: list[float] = []
        pieces: list[float] = []
        same = True
        for _ in range(args.rounds):
            for text in texts:
                model._clear_cache()
                t0 = time.perf_counter()
                a = tok.encode(text, add_special_tokens=False)
                t1 = time.perf_counter()
                model._clear_cache()
                t2 = time.perf_counter()
                b = encode_text(tok, text, False)
                t3 = time.perf_counter()
                whole.append(t1 - t0)
                pieces.append(t3 - t2)
                same = same and list(a) == b
        row = {
            "input_len": n,
            "chars": round(statistics.mean(len(t) for t in texts)),
            "tokens": len(tok.encode(texts[0], add_special_tokens=False)),
            "pieces": len(split_points(texts[0])),
            "whole_ms": round(1e3 * statistics.median(whole), 3),
            "pieces_ms": round(1e3 * statistics.median(pieces), 3),
            "same_ids": same,
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg()[0],
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
