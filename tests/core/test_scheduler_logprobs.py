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
