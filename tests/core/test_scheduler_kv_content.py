"""The scheduler and KV cache manager against a fake model whose K/V is the context it saw.

The property tests of ``test_scheduler_property.py`` and ``test_scheduler_async.py`` feed
tokens that depend only on the output index, so a block table that points at the wrong K/V (a
prefix-cache hit on a block whose content is not the request's, a block reused while another
request still reads it) goes unseen; ``tests/engine/test_exactness_fuzz.py`` sees it but runs a
real model, a few workloads only. Here the fake executor writes into each slot ``(block,
offset)`` of a simulated KV pool a hash of the slot before it (read through the block table,
as attention reads the K/V of earlier positions) and the slot's token, and samples from the
last slot's value: a request's tokens are what it gets alone only if every block it reads
holds its own context.

The seeded workloads mix what breaks block sharing: prompts that share prefixes, equal
another prompt or a prefix of one, are whole blocks long; ``n`` > 1 choices of one prompt;
aborts at arrival, mid-prefill and between ``schedule`` and ``update``; a pool just large
enough for the longest request (preemption by recompute, eviction of cached blocks), a
budget of 1 to 64 tokens (chunked prefill), ``max_num_seqs`` 1 to 64; ``max_tokens`` 0 and
up to ``max_model_len``; ``min_tokens`` with EOS and stop ids, ``ignore_eos``; both policies
(priority preemption); prefix caching on and off, prefix-cache resets; synchronous and
asynchronous scheduling (a decode computes the token still in flight).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from hashlib import blake2b

from surge.config import CacheConfig, SchedulerConfig
from surge.core.kv_cache_manager import cdiv
from surge.core.outputs import ModelOutput, SchedulerOutput
from surge.core.scheduler import Scheduler
from surge.request import Request
from surge.sampling_params import SamplingParams

_VOCAB = 48
_EOS = 0
_ROOT = b"root"  # the context before a request's first token


def _kv(previous: bytes, token: int) -> bytes:
    """The fake K/V of a position: a hash of the position before it and its token."""
    return blake2b(previous + token.to_bytes(4, "little"), digest_size=8).digest()


def _sample(kv: bytes, num_output: int, params: SamplingParams) -> int:
    """The fake greedy token after the position whose K/V is ``kv``; under ``min_tokens`` EOS
    (unless ``ignore_eos``) and the stop ids are banned, as the sampler bans them."""
    token = int.from_bytes(kv[:4], "little") % _VOCAB
    banned = set(params.stop_token_ids) | (set() if params.ignore_eos else {_EOS})
    while num_output < params.min_tokens and token in banned:
        token = (token + 1) % _VOCAB
    return token


def _alone(prompt: list[int], params: SamplingParams, max_len: int) -> tuple[list[int], str]:
    """What the request gets alone: its tokens and finish reason (the scheduler's stop rules)."""
    kv = _ROOT
    for t in prompt:
        kv = _kv(kv, t)
    out: list[int] = []
    while params.max_tokens > 0:
        token = _sample(kv, len(out), params)
        out.append(token)
        stops = (token == _EOS and not params.ignore_eos) or token in params.stop_token_ids
        if stops and len(out) >= params.min_tokens:
            return out, "stop"
        if len(out) >= params.max_tokens or len(prompt) + len(out) >= max_len:
            break
        kv = _kv(kv, token)
    return out, "length"


@dataclass
class _Spec:
    prompt: list[int]
    params: SamplingParams
    n: int
    arrival: int
    abort: int | None  # steps after its arrival
    abort_mid_step: bool  # once the step is computed: before update(), or (async) once it is launched
    priority: int

    def ids(self, i: int) -> list[str]:
        return [f"r{i}"] if self.n == 1 else [f"r{i}-{j}" for j in range(self.n)]


def _specs(rng: random.Random, bs: int, policy: str) -> tuple[list[_Spec], int]:
    """A seeded mix of requests and the ``max_model_len`` they run under."""
    bases = [
        [rng.randrange(1, _VOCAB) for _ in range(rng.choice([bs, 2 * bs, 2 * bs + 1, 20]))] for _ in range(3)
    ]
    prompts: list[list[int]] = []
    for _ in range(rng.randint(2, 14)):
        u = rng.random()
        if prompts and u < 0.15:
            prompt = list(rng.choice(prompts))  # another's prompt
        elif prompts and u < 0.35:
            other = rng.choice(prompts)  # a prefix of another's prompt (whole blocks, all but one token, any)
            prompt = other[
                : max(1, rng.choice([len(other) // bs * bs, len(other) - 1, rng.randint(1, len(other))]))
            ]
        else:
            tail = [rng.randrange(1, _VOCAB) for _ in range(rng.choice([0, 1, bs, rng.randint(0, 12)]))]
            prompt = (rng.choice(bases)[: rng.randint(0, 30)] + tail) or [1]
        prompts.append(prompt)
    lengths = [rng.choice([0, 1, 2, 5, 12, 25]) for _ in prompts]
    max_len = max(len(p) + m for p, m in zip(prompts, lengths, strict=True)) + rng.choice([0, 0, 3])
    specs = []
    for prompt, max_tokens in zip(prompts, lengths, strict=True):
        if rng.random() < 0.2:
            max_tokens = max_len - len(prompt)  # prompt + max_tokens == max_model_len
        params = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=rng.choice([0, 0, rng.randint(0, max_tokens)]),
            ignore_eos=rng.random() < 0.3,
            stop_token_ids=rng.sample(range(1, _VOCAB), rng.choice([0, 0, 1, 2])),
        )
        specs.append(
            _Spec(
                prompt,
                params,
                n=rng.choice([1, 1, 1, 2, 3]),
                arrival=rng.choice([0, rng.randint(0, 25)]),
                abort=rng.choice([None] * 6 + [0, 1, 2, rng.randint(0, 30)]),
                abort_mid_step=rng.random() < 0.5,
                priority=rng.randint(0, 3) if policy == "priority" else 0,
            )
        )
    return specs, max_len


def _run(seed: int, covered: Counter[str]) -> list[str]:
    """Workload ``seed``; returns how each request's result differs from it alone."""
    rng = random.Random(seed)
    bs = rng.choice([8, 8, 16])
    policy = rng.choice(["fcfs", "priority"])
    asynchronous = rng.random() < 0.5
    specs, max_len = _specs(rng, bs, policy)
    budget = rng.choice([1, 2, 3, 5, 8, 16, 64])
    num_blocks = max(cdiv(len(s.prompt) + s.params.max_tokens, bs) for s in specs) + rng.choice(
        [0, 0, 1, 2, 4, 10]
    )
    sched = Scheduler(
        SchedulerConfig(
            max_num_seqs=min(rng.choice([1, 2, 3, 4, 64]), budget),
            max_num_batched_tokens=budget,
            max_model_len=max_len,
            watermark=rng.choice([0.0, 0.01, 0.1]),
            scheduling_policy=policy,  # type: ignore[arg-type]
        ),
        CacheConfig(block_size=bs, enable_prefix_caching=rng.random() < 0.85),
        num_blocks,
    )
    pool: dict[tuple[int, int], bytes] = {}  # (block, offset) -> K/V
    requests: dict[str, tuple[Request, _Spec]] = {}
    got: dict[str, list[int]] = {}
    reasons: dict[str, str] = {}
    aborted: set[str] = set()
    in_flight: tuple[SchedulerOutput, ModelOutput] | None = None

    def execute(so: SchedulerOutput) -> ModelOutput:
        out = ModelOutput()
        pending = in_flight[1].sampled_token_ids if in_flight is not None else {}
        for x in so.scheduled:
            r = x.request
            start = r.num_computed_tokens
            kv = _ROOT if start == 0 else pool[r.block_ids[(start - 1) // bs], (start - 1) % bs]
            for p in range(start, start + x.num_new_tokens):
                kv = _kv(kv, r.token_id_at(p) if p < r.num_tokens else pending[r.request_id])
                pool[r.block_ids[p // bs], p % bs] = kv
            if x.sample:
                num_output = r.num_output_tokens + r.num_pending_outputs
                out.sampled_token_ids[r.request_id] = _sample(kv, num_output, r.sampling_params)
        return out

    def apply(so: SchedulerOutput, mo: ModelOutput) -> None:
        for o in sched.update(so, mo):
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finish_reason is not None:
                reasons[o.request_id] = o.finish_reason

    def abort(ids: list[str]) -> None:
        aborted.update(rid for rid in ids if rid in sched.requests)
        sched.abort_requests(ids)

    def mid_step_abort(s: _Spec) -> bool:
        return s.abort is not None and s.arrival + s.abort == step and s.abort_mid_step

    step = 0
    while step <= 30 or in_flight is not None or sched.has_unfinished_requests():
        assert step < 20_000, f"seed {seed}: no progress"
        for i, s in enumerate(specs):
            if s.arrival == step:
                for rid in s.ids(i):
                    requests[rid] = (
                        Request(rid, s.prompt, s.params, frozenset({_EOS}), priority=s.priority),
                        s,
                    )
                    sched.add_request(requests[rid][0])
            if s.abort is not None and s.arrival + s.abort == step and not s.abort_mid_step:
                abort(s.ids(i))
        if rng.random() < 0.03:
            sched.kv.reset_prefix_cache()
        so = sched.schedule()
        mo = execute(so)
        if asynchronous:  # as LLMEngine: launch step k (advance), then apply step k - 1
            launched = None
            if not so.is_empty:
                sched.advance(so)
                launched = (so, mo)
            abort([rid for i, s in enumerate(specs) if mid_step_abort(s) for rid in s.ids(i)])
            if in_flight is not None:
                apply(*in_flight)
            in_flight = launched
        else:
            abort([rid for i, s in enumerate(specs) if mid_step_abort(s) for rid in s.ids(i)])
            apply(so, mo)
        kv_pool = sched.kv.pool
        held = Counter(b for r in sched.running for b in r.block_ids)
        for b in range(kv_pool.num_blocks):
            assert kv_pool.ref_counts[b] == held[b], f"seed {seed} step {step}: block {b}"
        step += 1
    assert sched.kv.num_free_blocks == sched.kv.num_total_blocks and not any(sched.kv.pool.ref_counts), seed
    assert not sched.requests, seed
    covered.update(preemptions=sched.num_preemptions_total, hit_tokens=sched.kv.prefix_cache_hit_tokens)
    problems = []
    for rid, (r, s) in requests.items():
        want, reason = _alone(s.prompt, s.params, max_len)
        tokens = got.get(rid, [])
        if rid in aborted:
            covered["aborted"] += 1
            if tokens != want[: len(tokens)]:
                problems.append(f"seed {seed} {rid} (aborted): {tokens} is not a prefix of {want}")
        elif (tokens, r.output_token_ids, reasons.get(rid)) != (want, want, reason):
            problems.append(f"seed {seed} {rid}: {tokens} {reasons.get(rid)}, alone {want} {reason}")
        else:
            covered[reason] += 1
    return problems


def test_every_request_reads_its_own_context() -> None:
    """300 seeded workloads (about 3 s): each request's tokens and finish reason are what it
    gets alone, an aborted one's a prefix of them; no block leaks."""
    covered: Counter[str] = Counter()
    problems = [p for seed in range(300) for p in _run(seed, covered)]
    assert not problems, "\n".join(problems[:10])
    for what in ("preemptions", "hit_tokens", "aborted", "stop", "length"):
        assert covered[what] > 100, f"the seeds no longer cover {what}: {dict(covered)}"
