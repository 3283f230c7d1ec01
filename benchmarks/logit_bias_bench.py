"""Cost of whole-vocabulary token rules shared by many choices, on CPU: ``n`` rows (default
128, the choices of one request) sharing a ``logit_bias`` on each of ``V`` tokens (default
151,936, Qwen3), or an ``allowed_token_ids`` of every other token, plus one plain row before
and after them. A benchmark, not part of the engine.

Cases (median of ``--reps`` runs after one warm-up, milliseconds):

- ``bias_build`` / ``allowed_build``: :meth:`surge.layers.sampler.SamplingMetadata.build` of
  the batch (what a step pays whenever the batch composition changes);
- ``bias_sample`` / ``allowed_sample``: one greedy :class:`surge.layers.sampler.Sampler` call on
  ``[n + 2, V]`` float32 logits with that metadata (the rules, then an argmax: what every step
  pays while the composition is unchanged);
- ``bias_step_rebuilt``: one :meth:`surge.worker.sampling_state.StepSampler.sample` of the
  greedy biased batch with ``min_tokens`` 1, which rebuilds the metadata every step (as
  seeds, penalties and ``min_tokens`` do in the engine);
- ``qwen3_build_sample`` / ``qwen3_bias_build_sample``: build and sample with Qwen3's
  generation defaults (temperature 0.6, top-k 20, top-p 0.95), without and with the bias.

Run from the repository root::

    .venv/bin/python benchmarks/logit_bias_bench.py [--n 128] [--vocab 151936] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from surge.engine.llm_engine import choice_params
from surge.layers.sampler import Sampler, SamplingMetadata
from surge.request import Request
from surge.sampling_params import SamplingParams
from surge.worker.sampling_state import StepSampler


def _median_ms(fn: Callable[[], object], reps: int) -> float:
    """Median wall time of ``fn`` over ``reps`` calls after one warm-up call, in ms."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    """Print one JSON line per case."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=128, help="choices sharing the rules")
    ap.add_argument("--vocab", type=int, default=151_936, help="vocabulary size V")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    vocab, n = args.vocab, args.n
    bias = {t: (t % 7) - 3.0 for t in range(vocab)}
    allowed = tuple(range(0, vocab, 2))
    logits = torch.randn(n + 2, vocab, generator=torch.Generator().manual_seed(0))
    sampler = Sampler(seed=0)
    rows = n + 2

    def batch(temperature: float, **rules: object) -> list[SamplingParams]:
        plain = SamplingParams(temperature=temperature)
        children = choice_params(SamplingParams(n=n, temperature=temperature, **rules))  # type: ignore[arg-type]
        return [plain, *children, plain]

    def build(params: list[SamplingParams]) -> SamplingMetadata:
        return SamplingMetadata.build(params, [[1]] * rows, [[]] * rows, [()] * rows, vocab, "cpu")

    for name, rules in (("bias", {"logit_bias": bias}), ("allowed", {"allowed_token_ids": allowed})):
        greedy = batch(0.0, **rules)
        md = build(greedy)
        ms = _median_ms(lambda g=greedy: build(g), args.reps)
        print(json.dumps({"case": f"{name}_build", "rows": rows, "vocab": vocab, "ms": round(ms, 1)}))
        ms = _median_ms(lambda m=md: sampler(logits, m), args.reps)
        print(json.dumps({"case": f"{name}_sample", "rows": rows, "vocab": vocab, "ms": round(ms, 1)}))
    rebuilt = batch(0.0, logit_bias=bias, min_tokens=1)
    step = StepSampler(sampler, vocab, torch.device("cpu"))
    requests = [Request(f"r{i}", [1], p) for i, p in enumerate(rebuilt)]
    ms = _median_ms(lambda: step.sample(logits, requests), args.reps)
    assert step.fresh
    print(json.dumps({"case": "bias_step_rebuilt", "rows": rows, "vocab": vocab, "ms": round(ms, 1)}))
    for name, rules in (("qwen3", {}), ("qwen3_bias", {"logit_bias": bias})):
        sampled = batch(0.6, top_k=20, top_p=0.95, **rules)
        ms = _median_ms(lambda s=sampled: sampler(logits, build(s)), args.reps)
        print(json.dumps({"case": f"{name}_build_sample", "rows": rows, "vocab": vocab, "ms": round(ms, 1)}))


if __name__ == "__main__":
    main()
