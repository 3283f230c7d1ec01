"""The scheduler's side of logprobs (no torch): prompt rows stored once across chunks and
recomputes, sent with the first output, no prefix-cache hits while they are missing, and
the step flag that tells the executor to look for prompt positions."""

from __future__ import annotations

from surge.config import CacheConfig, SchedulerConfig
from surge.core.logprobs import LogprobsLists
from surge.core.outputs import ModelOutput, SchedulerOutput
from surge.core.scheduler import Scheduler
from surge.request import Request
from surge.sampling_params import SamplingParams


def _make(budget: int = 8, num_blocks: int = 64, prefix: bool = False) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=256, watermark=0.0),
        CacheConfig(block_size=8, enable_prefix_caching=prefix),
        num_blocks,
    )


def _rows(first: int, count: int) -> LogprobsLists:
    """Rows whose single value encodes the prompt index it is for (-index)."""
    idx = range(first, first + count)
    return LogprobsLists([[i] for i in idx], [[-float(i)] for i in idx], [1] * count)


def _executor(so: SchedulerOutput) -> ModelOutput:
    """What the runner computes: each chunk's prompt positions that predict a prompt token."""
    out = ModelOutput()
    for s in so.scheduled:
        req = s.request
        if s.sample:
            out.sampled_token_ids[req.request_id] = 7
            if req.sampling_params.logprobs is not None:
                out.logprobs[req.request_id] = LogprobsLists([[7]], [[-0.5]], [1])
        if req.prompt_logprobs is not None:
            start = req.num_computed_tokens
            hi = min(start + s.num_new_tokens, req.num_prompt_tokens - 1)
            if hi > start:
                out.prompt_logprobs[req.request_id] = (start + 1, _rows(start + 1, hi - start))
    return out


def test_prompt_rows_across_chunks_sent_once_with_the_first_token() -> None:
    sched = _make(budget=8)
    req = Request("a", list(range(10, 30)), SamplingParams(max_tokens=3, prompt_logprobs=1, logprobs=0))
    plain = Request("b", [5, 6, 7], SamplingParams(max_tokens=3))
    sched.add_request(req)
    sched.add_request(plain)
    outputs = []
    while sched.has_unfinished_requests():
        so = sched.schedule()
        assert so.any_prompt_logprobs == ("a" in sched.requests)
        outputs += sched.update(so, _executor(so))
    mine = [o for o in outputs if o.request_id == "a"]
    assert len(mine) == 3
    assert mine[0].prompt_logprobs is not None
    assert mine[0].prompt_logprobs.token_ids == [[i] for i in range(1, 20)]
    assert all(o.prompt_logprobs is None for o in mine[1:])
    assert all(o.logprobs is not None and o.logprobs.token_ids == [[7]] for o in mine)
    assert all(o.logprobs is None and o.prompt_logprobs is None for o in outputs if o.request_id == "b")
    assert not sched.schedule().any_prompt_logprobs


def test_recomputed_rows_are_not_stored_twice() -> None:
    sched = _make()
    req = Request("a", list(range(10, 22)), SamplingParams(max_tokens=2, prompt_logprobs=0))
    sched.add_request(req)
    so = sched.schedule()  # the first 8 prompt tokens
    sched.update(so, _executor(so))
    assert req.prompt_logprobs is not None and len(req.prompt_logprobs) == 8
    # As after a preemption: the same positions come again, then the rest.
    again = ModelOutput(prompt_logprobs={"a": (1, _rows(1, 8))})
    sched._store_prompt_logprobs(again)
    assert len(req.prompt_logprobs) == 8
    overlap = ModelOutput(prompt_logprobs={"a": (5, _rows(5, 7))})
    sched._store_prompt_logprobs(overlap)
    assert req.prompt_logprobs.token_ids == [[i] for i in range(1, 12)]
    assert req.num_prompt_logprobs_missing == 0


def test_no_prefix_cache_hit_while_prompt_rows_are_missing() -> None:
    sched = _make(budget=64, prefix=True)
    prompt = list(range(10, 30))
    sched.add_request(Request("warm", prompt, SamplingParams(max_tokens=1)))
    while sched.has_unfinished_requests():
        so = sched.schedule()
        sched.update(so, _executor(so))
    cached = Request("cached", prompt, SamplingParams(max_tokens=1))
    scored = Request("scored", prompt, SamplingParams(max_tokens=1, prompt_logprobs=0))
    sched.add_request(cached)
    sched.add_request(scored)
    so = sched.schedule()
    starts = {s.request.request_id: s.num_new_tokens for s in so.scheduled}
    assert starts["cached"] < len(prompt)  # served from the cache
    assert starts["scored"] == len(prompt)  # computed from token 0


def _prompt_only_sched(budget: int) -> Scheduler:
    """A context of 64 tokens and a pool of exactly 64 (8 blocks of 8)."""
    return Scheduler(
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=64, watermark=0.0),
        CacheConfig(block_size=8, enable_prefix_caching=False),
        8,
    )


def test_max_tokens_zero_scores_a_prompt_of_the_whole_context_without_sampling() -> None:
    """Completions' echo with max_tokens 0: a prompt of max_model_len tokens fits (its blocks
    are the whole pool), no step samples it, and it ends with "length", no token, and every
    prompt row."""
    for budget in (64, 24):  # one step, or chunked
        sched = _prompt_only_sched(budget)
        req = Request("a", list(range(10, 74)), SamplingParams(max_tokens=0, prompt_logprobs=0))
        sched.add_request(req)
        outputs = []
        while sched.has_unfinished_requests():
            so = sched.schedule()
            assert so.scheduled and not any(s.sample for s in so.scheduled)
            outputs += sched.update(so, _executor(so))
        (final,) = outputs
        assert final.new_token_ids == [] and final.finish_reason == "length"
        assert final.num_prompt_tokens == 64 and final.first_token_time is None
        assert final.prompt_logprobs is not None
        assert final.prompt_logprobs.token_ids == [[i] for i in range(1, 64)]
        assert req.output_token_ids == [] and req.num_computed_tokens == 64
        assert sched.kv.num_free_blocks == 8
        assert sched.schedule().finished_request_ids == ["a"]


def test_max_tokens_zero_under_asynchronous_scheduling() -> None:
    """Launched but not yet applied, a prompt-only request is not scheduled again (no empty
    chunk, no pending token); applying the step finishes it."""
    sched = _prompt_only_sched(64)
    req = Request("a", list(range(10, 74)), SamplingParams(max_tokens=0))
    other = Request("b", [5, 6, 7], SamplingParams(max_tokens=2))
    sched.add_request(req)
    first = sched.schedule()
    sched.advance(first)
    assert req.num_pending_outputs == 0
    sched.add_request(other)  # waits: the pool is full
    second = sched.schedule()
    assert [s.request.request_id for s in second.scheduled] == []
    (final,) = sched.update(first, _executor(first))
    assert final.request_id == "a" and final.finish_reason == "length" and final.new_token_ids == []
    assert final.prompt_logprobs is None
    third = sched.schedule()
    assert third.finished_request_ids == ["a"] and [s.request.request_id for s in third.scheduled] == ["b"]


def test_max_tokens_zero_in_chunks_under_asynchronous_scheduling_keeps_every_prompt_row() -> None:
    """A prompt-only request of several chunks ends when the step of its last chunk is applied,
    not the step before (whose update comes after the last chunk is launched): echo with
    max_tokens 0 and logprobs under asynchronous scheduling lost the rows of the last chunk."""
    sched = _prompt_only_sched(24)
    req = Request("a", list(range(10, 74)), SamplingParams(max_tokens=0, prompt_logprobs=0))
    sched.add_request(req)
    outputs = []
    in_flight: tuple[SchedulerOutput, ModelOutput] | None = None
    while in_flight is not None or sched.has_unfinished_requests():
        so = sched.schedule()  # step k, then advance(k), then update(k - 1), as the engine does
        launched = None
        if not so.is_empty:
            launched = (so, _executor(so))
            sched.advance(so)
        if in_flight is not None:
            outputs += sched.update(*in_flight)
        in_flight = launched
    (final,) = outputs
    assert final.finish_reason == "length" and final.new_token_ids == []
    assert final.prompt_logprobs is not None
    assert final.prompt_logprobs.token_ids == [[i] for i in range(1, 64)]
    assert sched.kv.num_free_blocks == 8
