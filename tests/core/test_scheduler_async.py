"""Asynchronous scheduling in the scheduler (no torch): step k+1 is scheduled after
``advance(k)`` and before ``update(k)``, driven by hand-built model outputs."""

from __future__ import annotations

import random
from collections import Counter

from surge.config import CacheConfig, SchedulerConfig
from surge.core.logprobs import LogprobsLists
from surge.core.outputs import ModelOutput, SchedulerOutput
from surge.core.scheduler import Scheduler
from surge.request import Request, RequestStatus
from surge.sampling_params import SamplingParams
from tests.core.test_scheduler import EOS, _make, _req


def _tokens(so: SchedulerOutput, token: int = 7) -> ModelOutput:
    return ModelOutput({s.request.request_id: token for s in so.scheduled if s.sample})


def _run_async(
    sched: Scheduler, token_of: dict[int, int] | None = None, max_steps: int = 500
) -> Counter[str]:
    """Drive the loop as the engine does: schedule k, advance k, update k-1. ``token_of``
    maps a step number to the token every sampled request gets then (default 7)."""
    counts: Counter[str] = Counter()
    in_flight: SchedulerOutput | None = None
    for step in range(max_steps):
        so = sched.schedule()
        for s in so.scheduled:
            r = s.request
            start = r.num_computed_tokens
            # The chunk never reaches past the known + pending tokens.
            assert start + s.num_new_tokens <= r.num_tokens + r.num_pending_outputs
            assert len(r.block_ids) * sched.block_size >= start + s.num_new_tokens
        launched = None if so.is_empty else so
        if launched is not None:
            sched.advance(so)
        if in_flight is not None:
            tok = (token_of or {}).get(step - 1, 7)
            for out in sched.update(in_flight, _tokens(in_flight, tok)):
                counts[out.request_id] += len(out.new_token_ids)
        in_flight = launched
        if in_flight is None and not sched.has_unfinished_requests():
            return counts
    raise AssertionError("did not finish")


def test_decode_with_a_pending_token_and_exact_max_tokens() -> None:
    sched = _make(budget=64)
    a = _req("a", 5, max_tokens=3, ignore_eos=True)
    sched.add_request(a)
    so1 = sched.schedule()
    assert [(s.num_new_tokens, s.sample) for s in so1.scheduled] == [(5, True)]
    sched.advance(so1)
    assert a.num_computed_tokens == 5 and a.num_pending_outputs == 1
    # Step 2 computes the pending token (position 5) before step 1's id is known.
    so2 = sched.schedule()
    assert [(s.num_new_tokens, s.sample) for s in so2.scheduled] == [(1, True)]
    sched.advance(so2)
    assert a.num_pending_outputs == 2
    sched.update(so1, _tokens(so1))
    assert a.output_token_ids == [7] and a.num_pending_outputs == 1
    so3 = sched.schedule()
    sched.advance(so3)
    sched.update(so2, _tokens(so2))
    # Two known outputs + one pending = max_tokens: nothing more is scheduled.
    assert sched.schedule().is_empty
    outs = sched.update(so3, _tokens(so3))
    assert a.output_token_ids == [7, 7, 7] and outs[0].finish_reason == "length"
    assert a.status == RequestStatus.FINISHED_LENGTH and a.block_ids == []


def test_many_requests_get_exact_lengths_with_chunking_and_preemption() -> None:
    sched = _make(budget=40, num_blocks=10, block_size=8, max_num_seqs=6)
    want = {}
    for i in range(8):
        n = 3 + 6 * (i % 3)
        want[f"r{i}"] = n
        sched.add_request(_req(f"r{i}", 12 + i, max_tokens=n, ignore_eos=True))
    counts = _run_async(sched)
    assert dict(counts) == want
    assert sched.num_preemptions_total > 0
    assert sched.kv.num_free_blocks == sched.kv.num_total_blocks


def test_eos_found_one_step_late_drops_the_extra_token() -> None:
    sched = _make()
    a = _req("a", 4, max_tokens=10)
    sched.add_request(a)
    # Step 0 prefill samples 7; step 1 samples EOS; step 2 (already launched) is dropped.
    counts = _run_async(sched, token_of={1: EOS})
    assert a.output_token_ids == [7, EOS]
    assert counts["a"] == 2 and a.status == RequestStatus.FINISHED_STOPPED


def test_abort_while_a_step_is_in_flight() -> None:
    sched = _make()
    a, b = _req("a", 4, max_tokens=6, ignore_eos=True), _req("b", 4, max_tokens=6, ignore_eos=True)
    sched.add_request(a)
    sched.add_request(b)
    so1 = sched.schedule()
    sched.advance(so1)
    sched.abort_requests(["a"])
    outs = sched.update(so1, _tokens(so1))
    assert [o.request_id for o in outs] == ["b"]
    assert a.status == RequestStatus.FINISHED_ABORTED and a.block_ids == []


def test_preempted_request_drops_its_pending_token() -> None:
    r = Request("r", [10, 11, 12], _req("x", 1).sampling_params)
    sched = _make(num_blocks=4)
    sched.add_request(r)
    so = sched.schedule()
    sched.advance(so)
    assert r.num_pending_outputs == 1
    sched._preempt(sched.running.pop())
    assert r.num_pending_outputs == 0 and r.num_computed_tokens == 0
    assert sched.update(so, _tokens(so)) == []
    assert r.output_token_ids == []


def test_pending_token_is_not_hashed_into_the_prefix_cache() -> None:
    sched = _make(block_size=8, prefix=True)
    a = _req("a", 7, max_tokens=4, ignore_eos=True)  # the sampled token fills block 0
    sched.add_request(a)
    so1 = sched.schedule()
    sched.advance(so1)
    so2 = sched.schedule()  # computes position 3 (pending): block 0 becomes full
    assert sched.kv._req_num_registered.get("a", 0) == 0
    sched.advance(so2)
    sched.update(so1, _tokens(so1))
    so3 = sched.schedule()  # position 3's id is known now: block 0 is registered
    assert sched.kv._req_num_registered["a"] == 1
    assert so3.scheduled[0].num_new_tokens == 1


def _random_async_workload(seed: int) -> None:
    """One seeded workload driven as the engine drives asynchronous scheduling (schedule k,
    advance k, update k - 1): random prompts (half of them sharing a prefix), ``max_tokens``
    0 to 20 (prompt scoring included), ``min_tokens``, EOS, ``ignore_eos``, prompt logprobs,
    aborts, either policy, a context just long enough, a tiny pool (preemption) and budget
    (chunks). Every request gets exactly its tokens, finish reason and prompt rows; no block
    leaks."""
    rng = random.Random(seed)
    bs, policy = rng.choice([8, 16]), rng.choice(["fcfs", "priority"])
    bases = [[rng.randrange(3, 50) for _ in range(40)] for _ in range(2)]
    specs = []
    for _ in range(rng.randint(1, 25)):
        plen = rng.randint(1, 40)
        prompt = (
            bases[rng.randrange(2)][:plen]
            if rng.random() < 0.5
            else [rng.randrange(3, 50) for _ in range(plen)]
        )
        mt = 0 if rng.random() < 0.15 else rng.randint(1, 20)
        specs.append(
            {
                "prompt": prompt,
                "mt": mt,
                "min": rng.choice([0, rng.randint(0, mt)]),
                "ignore": rng.random() < 0.3,
                "eos": rng.randrange(mt + 2) if rng.random() < 0.5 else None,
                "arrival": rng.randint(0, 20),
                "abort": rng.randint(0, 30) if rng.random() < 0.15 else None,
                "priority": rng.randint(-2, 2) if policy == "priority" else 0,
                "plp": rng.random() < 0.4,
            }
        )
    max_len = max(len(s["prompt"]) + s["mt"] for s in specs) + rng.choice([0, 0, 5])
    max_num_seqs = rng.choice([1, 2, 4, 32])
    budget = rng.choice([1, 3, 5, 16, 48])
    sched = Scheduler(
        SchedulerConfig(
            max_num_seqs=min(max_num_seqs, budget),  # more is refused (as vLLM); the budget stays tiny
            max_num_batched_tokens=budget,
            max_model_len=max_len,
            watermark=rng.choice([0.0, 0.01, 0.1]),
            scheduling_policy=policy,  # type: ignore[arg-type]
        ),
        CacheConfig(block_size=bs, enable_prefix_caching=rng.random() < 0.7),
        max(-(-(len(s["prompt"]) + s["mt"]) // bs) for s in specs) + rng.randint(0, 4),
    )

    def token(i: int, index: int) -> int:
        return EOS if index == specs[i]["eos"] else 100 + (index * 7 + seed) % 37

    requests: dict[int, Request] = {}
    aborted: set[int] = set()
    tokens: dict[str, list[int]] = {}
    reasons: dict[str, str] = {}
    prompt_rows: dict[str, list[list[int]]] = {}
    in_flight: tuple[SchedulerOutput, ModelOutput] | None = None
    step = 0
    while step <= 30 or in_flight is not None or sched.has_unfinished_requests():
        assert step < 5000, "no progress"
        for i, s in enumerate(specs):
            if s["arrival"] == step:
                params = SamplingParams(
                    max_tokens=s["mt"],
                    min_tokens=s["min"],
                    ignore_eos=s["ignore"],
                    prompt_logprobs=0 if s["plp"] else None,
                )
                requests[i] = Request(f"r{i}", s["prompt"], params, frozenset({EOS}), priority=s["priority"])
                sched.add_request(requests[i])
            if s["abort"] is not None and s["arrival"] + s["abort"] == step:
                if not requests[i].is_finished:
                    aborted.add(i)
                sched.abort_requests([f"r{i}"])
        so = sched.schedule()
        out = ModelOutput()  # what the executor computes, known when the step is launched
        for x in so.scheduled:
            r = x.request
            i = int(r.request_id[1:])
            if x.sample:
                out.sampled_token_ids[r.request_id] = token(i, r.num_output_tokens + r.num_pending_outputs)
            start = r.num_computed_tokens
            hi = min(start + x.num_new_tokens, r.num_prompt_tokens - 1)
            if r.prompt_logprobs is not None and hi > start:
                rows = range(start + 1, hi + 1)
                out.prompt_logprobs[r.request_id] = (
                    start + 1,
                    LogprobsLists([[j] for j in rows], [[0.0]] * len(rows), [1] * len(rows)),
                )
        launched = None
        if not so.is_empty:
            sched.advance(so)
            launched = (so, out)
        if in_flight is not None:
            for o in sched.update(*in_flight):
                tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
                if o.prompt_logprobs is not None:
                    prompt_rows[o.request_id] = list(o.prompt_logprobs.token_ids)
                if o.finish_reason is not None:
                    reasons[o.request_id] = o.finish_reason
        in_flight = launched
        held = Counter(b for r in sched.running for b in r.block_ids)
        assert all(sched.kv.pool.ref_counts[b] == held[b] for b in range(sched.kv.num_total_blocks))
        step += 1
    assert sched.kv.num_free_blocks == sched.kv.num_total_blocks
    for i, s in enumerate(specs):
        if i in aborted:
            continue
        want, reason = [], "length"
        for index in range(s["mt"]):
            want.append(token(i, index))
            if want[-1] == EOS and not s["ignore"] and index + 1 >= s["min"]:
                reason = "stop"
                break
        rid = f"r{i}"
        assert (requests[i].output_token_ids, tokens.get(rid, []), reasons.get(rid)) == (
            want,
            want,
            reason,
        ), (seed, i)
        if s["plp"]:
            assert prompt_rows.get(rid) == [[j] for j in range(1, len(s["prompt"]))], (seed, i)


def test_random_workloads_under_asynchronous_scheduling_are_exact() -> None:
    for seed in range(300):
        _random_async_workload(seed)
