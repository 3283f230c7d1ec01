"""Host cost of one scheduler step (``schedule()`` + ``update()``, pure Python) at a steady batch.

Drives :class:`surge.core.scheduler.Scheduler` with hand-built model outputs: ``--running``
requests decode together (prompt 32 tokens, long outputs, one sampled token each per step), and
a finished request is replaced at once, so every timed step has the same batch. Reports the
median and 10th/90th percentiles of the microseconds per step over ``--steps`` steps, per
scheduling policy. Nothing here touches torch.

A/B against another commit: run this file with ``PYTHONPATH`` set to a checkout of that commit
(``--policies fcfs`` there, since older commits have no priority policy), alternating runs.

Usage:
    python benchmarks/scheduler_step_bench.py --running 64 256 --steps 3000 --json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import surge
from surge.config import CacheConfig, SchedulerConfig
from surge.core.outputs import ModelOutput
from surge.core.scheduler import Scheduler
from surge.request import Request
from surge.sampling_params import SamplingParams


def _scheduler(running: int, policy: str) -> Scheduler:
    fields = {f.name for f in dataclasses.fields(SchedulerConfig)}
    extra = {"scheduling_policy": policy} if "scheduling_policy" in fields else {}
    if policy != "fcfs" and not extra:
        raise SystemExit(f"this checkout has no {policy!r} scheduling policy")
    config = SchedulerConfig(max_num_seqs=running, max_num_batched_tokens=8192, max_model_len=4096, **extra)
    # room for every request's whole context: no preemption in the timed steps
    return Scheduler(config, CacheConfig(block_size=16), running * 300)


def measure(running: int, policy: str, steps: int, warmup: int = 200) -> dict[str, float | int | str]:
    """Microseconds per ``schedule()`` + ``update()`` at ``running`` decoding requests."""
    sched = _scheduler(running, policy)
    ids = itertools.count()
    params = SamplingParams(max_tokens=1000, ignore_eos=True, temperature=0.0)

    def add() -> None:
        i = next(ids)
        sched.add_request(Request(f"r{i}", list(range(10, 42)), params, eos_token_ids=frozenset({2})))

    for _ in range(running):
        add()
    times: list[float] = []
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        so = sched.schedule()
        outs = sched.update(so, ModelOutput({s.request.request_id: 7 for s in so.scheduled if s.sample}))
        t1 = time.perf_counter()
        if step >= warmup:
            times.append((t1 - t0) * 1e6)
        for out in outs:
            if out.finish_reason is not None:
                add()
    times.sort()
    return {
        "surge": str(Path(surge.__file__).parent.parent),
        "policy": policy,
        "running": running,
        "steps": steps,
        "us_median": round(statistics.median(times), 2),
        "us_p10": round(times[len(times) // 10], 2),
        "us_p90": round(times[9 * len(times) // 10], 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--running", type=int, nargs="+", default=[64, 256])
    p.add_argument("--policies", nargs="+", default=["fcfs", "priority"])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    args = p.parse_args(argv)
    for running in args.running:
        for policy in args.policies:
            row = measure(running, policy, args.steps)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(
                    f"{policy:8s} running {running:4d}: {row['us_median']:8.1f} us per step "
                    f"(p10 {row['us_p10']:.1f}, p90 {row['us_p90']:.1f})",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
