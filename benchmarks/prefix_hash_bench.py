"""Host cost of the prefix cache's block hashes: ``KVCacheManager._block_hashes`` over a prompt.

Times the chained hashes of every full block of one prompt (``--prompt-len`` tokens, block size
16), in a fresh manager each time (nothing cached per request), and prints microseconds per
prompt and per block. Pure Python, no torch. A/B against another commit: run this file with
``PYTHONPATH`` set to a checkout of it (the ``surge`` field says which tree ran).

Usage:
    python benchmarks/prefix_hash_bench.py --prompt-len 4096 32768 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from pathlib import Path

import surge
from surge.core.kv_cache_manager import KVCacheManager
from surge.request import Request
from surge.sampling_params import SamplingParams


def measure(prompt_len: int, block_size: int = 16, repeat: int = 7) -> dict[str, float | int | str]:
    """Best-of-``repeat`` microseconds to hash every full block of a ``prompt_len``-token prompt."""
    req = Request("r", [1000 + i % 50000 for i in range(prompt_len)], SamplingParams(max_tokens=1))
    blocks = prompt_len // block_size

    def once() -> None:
        KVCacheManager(blocks + 1, block_size, enable_prefix_caching=True)._block_hashes(req, blocks)

    number = max(1, 20000 // blocks)
    best = min(timeit.repeat(once, number=number, repeat=repeat)) / number
    return {
        "surge": str(Path(surge.__file__).parent.parent),
        "prompt_len": prompt_len,
        "blocks": blocks,
        "us_per_prompt": round(best * 1e6, 1),
        "us_per_block": round(best * 1e6 / blocks, 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt-len", type=int, nargs="+", default=[4096, 32768])
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    args = p.parse_args(argv)
    for n in args.prompt_len:
        row = measure(n)
        print(
            json.dumps(row)
            if args.json
            else f"{n:6d} tokens: {row['us_per_prompt']:9.1f} us ({row['us_per_block']} us per block)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
