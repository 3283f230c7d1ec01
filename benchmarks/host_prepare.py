"""Host-side cost of preparing one decode step's inputs (CPU only, no model).

Builds a fake decode ``SchedulerOutput`` of ``--num-seqs`` requests (contexts of a few
hundred tokens, shuffled block ids) and times :meth:`InputPreparer.prepare` over
``--steps`` steps, each appending one token per request (a new KV block every
``block_size`` steps), as a running decode batch does.

Run: ``PYTHONPATH=. python3 benchmarks/host_prepare.py --num-seqs 256``
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from surge.core.outputs import ScheduledRequest, SchedulerOutput
from surge.request import Request
from surge.sampling_params import SamplingParams
from surge.worker.cuda_graph import decode_buckets, pick_bucket
from surge.worker.input_batch import InputPreparer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=40960)
    ap.add_argument("--pad", action="store_true", help="pad to CUDA-graph buckets as on the GPU")
    args = ap.parse_args()
    bs = args.block_size
    rng = random.Random(0)
    free = list(range(200_000))
    rng.shuffle(free)
    params = SamplingParams(temperature=0.0, max_tokens=4096, ignore_eos=True)
    reqs = []
    for i in range(args.num_seqs):
        r = Request(f"req-{i}", [rng.randrange(1000) for _ in range(rng.randrange(32, 512))], params)
        r.output_token_ids = [rng.randrange(1000) for _ in range(rng.randrange(1, 64))]
        r.num_computed_tokens = r.num_tokens - 1
        reqs.append(r)
    prep = InputPreparer(torch.device("cpu"), 8192, args.num_seqs, bs, args.max_model_len)
    buckets = decode_buckets(args.num_seqs)
    pad = (lambda n: pick_bucket(buckets, n)) if args.pad else None
    times = []
    for _ in range(args.steps):
        for r in reqs:
            need = -(-(r.num_computed_tokens + 1) // bs)
            while len(r.block_ids) < need:
                r.block_ids.append(free.pop())
        so = SchedulerOutput([ScheduledRequest(r, 1, True) for r in reqs], len(reqs))
        t0 = time.perf_counter()
        prep.prepare(so, pad)
        times.append(time.perf_counter() - t0)
        for r in reqs:
            r.num_computed_tokens += 1
            r.output_token_ids.append(7)
    times = times[10:]
    print(
        f"prepare of a {args.num_seqs}-request decode step: median {statistics.median(times) * 1e6:.0f} us, "
        f"mean {statistics.fmean(times) * 1e6:.0f} us, p90 {sorted(times)[int(0.9 * len(times))] * 1e6:.0f} us"
    )


if __name__ == "__main__":
    main()
