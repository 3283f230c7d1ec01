"""Per-step timing of a burst arriving behind one running request (engine only, no HTTP).

Mimics what a server sees in a burst: one request is admitted and runs a step alone, then the
other ``C - 1`` arrive. Prints each of the first steps' wall time (synchronised), so a slow
step (a JIT compile, a host stall) shows up. Usage: probe_burst.py --model DIR [--c 64 --i 41].
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from surge.engine.llm_engine import LLMEngine, build_engine_config
from surge.sampling_params import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--c", type=int, default=64)
    ap.add_argument("--i", type=int, default=41)
    ap.add_argument("--temperature", type=float, default=1.0)
    args = ap.parse_args()
    engine = LLMEngine(build_engine_config(args.model, dtype="bfloat16", load_format="dummy"))
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=args.temperature, max_tokens=64, ignore_eos=True)
    for rnd in range(3):
        engine.add_request(f"r{rnd}-0", rng.integers(1000, 100000, args.i).tolist(), params)
        times = []
        for step in range(12):
            if step == 1:
                for j in range(1, args.c):
                    engine.add_request(f"r{rnd}-{j}", rng.integers(1000, 100000, args.i).tolist(), params)
            t0 = time.perf_counter()
            engine.step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1000)
        while engine.has_unfinished_requests():
            engine.step()
        print(f"round {rnd}: first steps ms", [round(t, 1) for t in times], flush=True)


if __name__ == "__main__":
    main()
