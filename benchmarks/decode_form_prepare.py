"""Host cost of preparing a small prefill / mixed step in decode form vs the ordinary layout
(CPU only, no model).

Times :meth:`InputPreparer.prepare` for three steps at Qwen3-8B's serving limits
(``max_model_len`` 40960, ``max_num_seqs`` 256, block size 16), each with decode form off
(the eager layout) and on (one decode row per token, padded to a decode-graph bucket):

* ``cached4096``: a 4096-token prompt found in the prefix cache: 16 new tokens at 4080..4095;
* ``short32``: a fresh 32-token prompt at concurrency 1;
* ``mixed``: 64 running decodes (contexts 300-1500) and a new 32-token prompt (96 tokens).

Run: ``PYTHONPATH=. python3 benchmarks/decode_form_prepare.py``
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
from surge.worker.decode_form import DecodeFormPolicy
from surge.worker.input_batch import InputPreparer

BLOCK = 16
QWEN3_8B_KV_BYTES_PER_TOKEN = 36 * 2 * 8 * 128 * 2


def _request(rid: str, rng: random.Random, free: list[int], prompt_len: int, computed: int) -> Request:
    r = Request(rid, [rng.randrange(1000) for _ in range(prompt_len)], SamplingParams(max_tokens=16))
    r.num_computed_tokens = computed
    r.block_ids = [free.pop() for _ in range(-(-prompt_len // BLOCK))]
    return r


def _steps(rng: random.Random) -> dict[str, SchedulerOutput]:
    free = list(range(200_000))
    rng.shuffle(free)
    cached = _request("cached", rng, free, 4096, 4080)
    short = _request("short", rng, free, 32, 0)
    decodes = []
    for i in range(64):
        n = rng.randrange(300, 1500)
        decodes.append(_request(f"d{i}", rng, free, n, n - 1))
    new = _request("new", rng, free, 32, 0)
    return {
        "cached4096": SchedulerOutput([ScheduledRequest(cached, 16, True)], 16),
        "short32": SchedulerOutput([ScheduledRequest(short, 32, True)], 32),
        "mixed": SchedulerOutput(
            [ScheduledRequest(r, 1, True) for r in decodes] + [ScheduledRequest(new, 32, True)], 96
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=500)
    args = ap.parse_args()
    prep = InputPreparer(torch.device("cpu"), 8192, 256, BLOCK, 40960)
    buckets = decode_buckets(256, 8192)
    policy = DecodeFormPolicy(QWEN3_8B_KV_BYTES_PER_TOKEN)
    for name, so in _steps(random.Random(0)).items():
        for label, form in (("ordinary", None), ("decode form", policy)):
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                inputs = prep.prepare(so, lambda n: pick_bucket(buckets, n), None, form)
                times.append(time.perf_counter() - t0)
            assert inputs.decode_form == (form is not None), name
            times = times[20:]
            print(
                f"{name:>10} {label:>11}: rows {inputs.num_seqs:3d} padded {inputs.padded_seqs:3d} "
                f"block table {tuple(inputs.block_table.shape)}: median {statistics.median(times) * 1e6:.0f} us, "
                f"p90 {sorted(times)[int(0.9 * len(times))] * 1e6:.0f} us"
            )


if __name__ == "__main__":
    main()
