"""Scheduler driven by hand-built model outputs (no torch): budget, ordering, chunking, preemption, stops."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from surge.config import CacheConfig, SchedulerConfig
from surge.core.outputs import EngineOutput, ModelOutput, SchedulerOutput
from surge.core.scheduler import Scheduler, check_request_fits, room_for_output
from surge.request import Request, RequestStatus
from surge.sampling_params import SamplingParams

EOS = 2
TokenFn = Callable[[Request], int]


def _always7(_: Request) -> int:
    return 7


def _make(
    budget: int = 64,
    num_blocks: int = 64,
    block_size: int = 8,
    max_num_seqs: int = 16,
    max_model_len: int = 1024,
    watermark: float = 0.0,
    prefix: bool = False,
) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=max_model_len,
            watermark=watermark,
        ),
        CacheConfig(block_size=block_size, enable_prefix_caching=prefix),
        num_blocks,
    )


def _req(rid: str, prompt: int | list[int], max_tokens: int = 4, **kw: object) -> Request:
    tokens = list(range(10, 10 + prompt)) if isinstance(prompt, int) else prompt
    return Request(rid, tokens, SamplingParams(max_tokens=max_tokens, **kw), eos_token_ids=frozenset({EOS}))


def _model_output(so: SchedulerOutput, token_fn: TokenFn) -> ModelOutput:
    return ModelOutput({s.request.request_id: token_fn(s.request) for s in so.scheduled if s.sample})


def _step(sched: Scheduler, token_fn: TokenFn = _always7) -> tuple[SchedulerOutput, list[EngineOutput]]:
    so = sched.schedule()
    assert so.num_scheduled_tokens == sum(s.num_new_tokens for s in so.scheduled)
    assert so.num_scheduled_tokens <= sched.config.max_num_batched_tokens
    assert len(so.scheduled) <= sched.config.max_num_seqs
    return so, sched.update(so, _model_output(so, token_fn))


def _run(sched: Scheduler, token_fn: TokenFn = _always7, max_steps: int = 10_000) -> dict[str, EngineOutput]:
    """Run to completion; return the final output of each request."""
    finals: dict[str, EngineOutput] = {}
    for _ in range(max_steps):
        if not sched.has_unfinished_requests():
            break
        _, outs = _step(sched, token_fn)
        finals.update({o.request_id: o for o in outs if o.finished})
    assert not sched.has_unfinished_requests()
    assert sched.kv.num_free_blocks == sched.kv.num_total_blocks
    return finals


def test_scheduler_does_not_import_torch() -> None:
    code = (
        "import sys; import surge.core.scheduler, surge.core.kv_cache_manager; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_single_request_prefill_then_decode() -> None:
    sched = _make()
    r = _req("a", 20, max_tokens=3)
    sched.add_request(r)
    so, outs = _step(sched)
    assert [(s.request.request_id, s.num_new_tokens, s.sample) for s in so.scheduled] == [("a", 20, True)]
    assert r.num_computed_tokens == 20 and r.output_token_ids == [7]
    assert r.first_scheduled_time is not None and r.first_token_time is not None
    assert [o.new_token_ids for o in outs] == [[7]] and not outs[0].finished
    so, _ = _step(sched)
    assert [(s.num_new_tokens, s.sample) for s in so.scheduled] == [(1, True)]
    _, outs = _step(sched)
    (final,) = outs
    assert final.finish_reason == "length" and final.stop_token_id is None
    assert final.num_prompt_tokens == 20 and final.num_preemptions == 0
    assert final.arrival_time <= final.first_scheduled_time <= final.first_token_time <= final.finished_time
    assert r.status == RequestStatus.FINISHED_LENGTH and r.output_token_ids == [7, 7, 7]
    assert sched.kv.num_free_blocks == 64 and not sched.has_unfinished_requests()
    assert sched.schedule().finished_request_ids == ["a"]
    assert sched.schedule().finished_request_ids == []


def test_chunked_prefill_samples_only_on_last_chunk() -> None:
    sched = _make(budget=16)
    r = _req("a", 50, max_tokens=2)
    sched.add_request(r)
    chunks = []
    for expected_computed in (16, 32, 48, 50):
        so, outs = _step(sched)
        (s,) = so.scheduled
        chunks.append((s.num_new_tokens, s.sample))
        assert r.num_computed_tokens == expected_computed
        assert (outs != []) == s.sample
    assert chunks == [(16, False), (16, False), (16, False), (2, True)]
    assert r.output_token_ids == [7]


def test_budget_and_decodes_before_prefill() -> None:
    sched = _make(budget=32, num_blocks=256, max_num_seqs=32)
    n = 0
    saw_decode_and_prefill = False
    for step in range(200):
        if step % 3 == 0 and n < 40:
            sched.add_request(_req(f"r{n}", 5 + (n * 37) % 90, max_tokens=1 + n % 17))
            n += 1
        running_before = [r.request_id for r in sched.running]
        so, _ = _step(sched)
        ids = [s.request.request_id for s in so.scheduled]
        # Running requests come first and in order; a new request is scheduled only after
        # every running one got its tokens.
        num_old = sum(1 for i in ids if i in running_before)
        assert ids[:num_old] == running_before[:num_old]
        if num_old < len(ids):
            assert num_old == len(running_before)
        saw_decode_and_prefill |= any(s.num_new_tokens == 1 for s in so.scheduled) and any(
            s.num_new_tokens > 1 for s in so.scheduled
        )
    _run(sched)
    assert n == 40 and saw_decode_and_prefill


def test_decodes_never_wait_behind_a_long_prompt() -> None:
    sched = _make(budget=16, num_blocks=64)
    a = _req("a", 4, max_tokens=20)
    sched.add_request(a)
    _step(sched)
    sched.add_request(_req("long", 200, max_tokens=2))
    for _ in range(10):
        so, _ = _step(sched)
        assert so.scheduled[0].request is a and so.scheduled[0].num_new_tokens == 1
        assert so.scheduled[1].request.request_id == "long"
        assert so.scheduled[1].num_new_tokens == 15 and not so.scheduled[1].sample


def test_max_num_seqs_respected() -> None:
    sched = _make(budget=1024, max_num_seqs=3)
    for i in range(7):
        sched.add_request(_req(f"r{i}", 10, max_tokens=5))
    max_running = 0
    while sched.has_unfinished_requests():
        _step(sched)
        max_running = max(max_running, sched.num_running)
        assert sched.num_running <= 3
    assert max_running == 3


def test_strict_fcfs_no_skipping() -> None:
    sched = _make(budget=1024, num_blocks=12)
    sched.add_request(_req("a", 60, max_tokens=20))  # 8 blocks at admission
    sched.add_request(_req("big", 60, max_tokens=4))  # does not fit next to a
    sched.add_request(_req("small", 4, max_tokens=4))  # would fit, but must not overtake
    so, _ = _step(sched)
    assert [s.request.request_id for s in so.scheduled] == ["a"]
    assert [r.request_id for r in sched.waiting] == ["big", "small"]


def test_watermark_only_blocks_admission() -> None:
    # 10 blocks, watermark 20% -> 2 blocks kept free when admitting.
    sched = _make(budget=1024, num_blocks=10, watermark=0.2)
    sched.add_request(_req("a", 44, max_tokens=20))  # 6 blocks, enough up to 48 tokens
    _step(sched)
    sched.add_request(_req("b", 16, max_tokens=2))  # 2 of the 4 free blocks, 2 left = the watermark
    so, _ = _step(sched)
    assert [s.request.request_id for s in so.scheduled] == ["a", "b"]
    sched.add_request(_req("c", 8, max_tokens=2))  # needs 1 block, 2 free, watermark 2 -> waits
    so, _ = _step(sched)
    assert "c" not in [s.request.request_id for s in so.scheduled]
    assert sched.num_waiting == 1
    finals = _run(sched)
    assert finals["c"].finish_reason == "length"


def test_lone_request_may_use_the_whole_pool_despite_watermark() -> None:
    sched = _make(budget=1024, num_blocks=4, watermark=0.5)
    sched.add_request(_req("a", 24, max_tokens=8))  # 4 blocks: the whole pool
    finals = _run(sched)
    assert len(finals["a"].new_token_ids) == 1 and sched.kv.num_free_blocks == 4


def _position_token(r: Request) -> int:
    """A token that encodes the output position, to check that preemption keeps outputs."""
    return 100 + r.num_output_tokens


def test_preemption_with_tiny_pool() -> None:
    sched = _make(budget=64, num_blocks=6)
    reqs = [_req(f"r{i}", 8, max_tokens=16, ignore_eos=True) for i in range(4)]
    for r in reqs:
        sched.add_request(r)
    tokens: dict[str, list[int]] = {r.request_id: [] for r in reqs}
    preempted: list[str] = []
    while sched.has_unfinished_requests():
        so, outs = _step(sched, _position_token)
        preempted += so.preempted_request_ids
        for o in outs:
            tokens[o.request_id] += o.new_token_ids
        # No running request holds fewer blocks than its computed tokens need.
        for r in sched.running:
            assert len(r.block_ids) * 8 >= r.num_computed_tokens
    assert preempted, "the pool was meant to force a preemption"
    assert sched.get_stats().num_preemptions_total == len(preempted)
    for r in reqs:
        assert r.status == RequestStatus.FINISHED_LENGTH
        assert r.output_token_ids == list(range(100, 116))
        assert tokens[r.request_id] == r.output_token_ids
    assert sum(r.num_preemptions for r in reqs) == len(preempted)
    assert sched.kv.num_free_blocks == 6


def test_preempted_request_goes_to_front_and_keeps_output() -> None:
    sched = _make(budget=64, num_blocks=4)
    a, b = _req("a", 8, max_tokens=16, ignore_eos=True), _req("b", 8, max_tokens=16, ignore_eos=True)
    sched.add_request(a)
    sched.add_request(b)
    c = _req("c", 4, max_tokens=1)
    sched.add_request(c)
    while not b.num_preemptions:
        so, _ = _step(sched, _position_token)
    assert so.preempted_request_ids == ["b"]
    assert b.status == RequestStatus.PREEMPTED and b.block_ids == [] and b.num_computed_tokens == 0
    assert b.num_output_tokens > 0
    assert sched.waiting[0] is b
    finals = _run(sched, _position_token)
    assert finals["b"].num_preemptions == 1
    assert b.output_token_ids == list(range(100, 116))


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "match"),
    [
        (1000, 100, "maximum context length is 1024 tokens"),
        ([], 4, "at least one token"),
    ],
)
def test_impossible_request_rejected(prompt: int | list[int], max_tokens: int, match: str) -> None:
    sched = _make()
    with pytest.raises(ValueError, match=match):
        sched.add_request(_req("x", prompt, max_tokens=max_tokens))
    assert not sched.has_unfinished_requests()


def test_request_larger_than_pool_rejected() -> None:
    sched = _make(num_blocks=4, block_size=8)
    sched.add_request(_req("ok", 24, max_tokens=8))  # exactly 4 blocks
    with pytest.raises(ValueError, match="KV cache holds only 4 blocks"):
        sched.add_request(_req("x", 24, max_tokens=9))
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(_req("ok", 4))
    assert sched.num_waiting == 1


def test_a_pool_of_one_block_is_one_block_in_the_message() -> None:
    with pytest.raises(ValueError, match=r"holds only 1 block \(8 tokens\)\. Please"):
        check_request_fits(4, 8, max_model_len=1024, block_size=8, num_kv_blocks=1)
    with pytest.raises(ValueError, match=r"holds only 1 block \(1 token\)\. Please"):
        check_request_fits(1, 1, max_model_len=1024, block_size=1, num_kv_blocks=1)


def test_abort_running_and_waiting_frees_blocks() -> None:
    sched = _make(budget=1024, num_blocks=10, max_num_seqs=2)
    for i in range(3):
        sched.add_request(_req(f"r{i}", 20, max_tokens=50))
    _step(sched)
    assert sched.num_running == 2 and sched.num_waiting == 1
    assert sched.kv.num_free_blocks == 4
    sched.abort_requests(["r0", "r2", "unknown"])
    r0 = sched.running[0]  # r1 is left
    assert r0.request_id == "r1"
    assert sched.num_waiting == 0 and sched.kv.num_free_blocks == 7
    so = sched.schedule()
    assert so.finished_request_ids == ["r0", "r2"]
    sched.abort_requests(["r0"])  # already finished: ignored
    sched.update(so, _model_output(so, _always7))
    sched.abort_requests(["r1"])
    assert sched.kv.num_free_blocks == 10 and not sched.has_unfinished_requests()


def test_abort_between_schedule_and_update_is_skipped() -> None:
    sched = _make()
    r = _req("a", 10, max_tokens=5)
    sched.add_request(r)
    so = sched.schedule()
    sched.abort_requests(["a"])
    assert r.status == RequestStatus.FINISHED_ABORTED and r.status.finish_reason == "abort"
    assert sched.update(so, _model_output(so, _always7)) == []
    assert r.output_token_ids == [] and sched.kv.num_free_blocks == 64


def test_abort_preempted_request() -> None:
    sched = _make(budget=64, num_blocks=4)
    a, b = _req("a", 8, max_tokens=16), _req("b", 8, max_tokens=16)
    sched.add_request(a)
    sched.add_request(b)
    while not b.num_preemptions:
        _step(sched)
    sched.abort_requests(["b"])
    assert sched.num_waiting == 0
    _run(sched)


def _eos_at(index: int) -> TokenFn:
    return lambda r: EOS if r.num_output_tokens == index else 7


def test_eos_gives_stop() -> None:
    sched = _make()
    sched.add_request(_req("a", 5, max_tokens=10))
    finals = _run(sched, _eos_at(3))
    assert finals["a"].finish_reason == "stop" and finals["a"].stop_token_id == EOS
    assert finals["a"].new_token_ids == [EOS]


def test_max_tokens_gives_length_and_ignore_eos_is_exact() -> None:
    sched = _make()
    sched.add_request(_req("a", 5, max_tokens=6))
    sched.add_request(_req("b", 5, max_tokens=9, ignore_eos=True))
    reqs = {r.request_id: r for r in sched.waiting}
    finals = _run(sched, lambda r: EOS)
    assert finals["a"].finish_reason == "stop" and reqs["a"].num_output_tokens == 1
    assert finals["b"].finish_reason == "length" and reqs["b"].output_token_ids == [EOS] * 9


def test_min_tokens_suppresses_eos_stop() -> None:
    sched = _make()
    sched.add_request(_req("a", 5, max_tokens=10, min_tokens=4))
    r = sched.waiting[0]
    finals = _run(sched, lambda r: EOS)
    assert finals["a"].finish_reason == "stop" and r.num_output_tokens == 4


def test_min_tokens_gives_way_to_constraints_that_leave_only_eos() -> None:
    """A request whose allowed_token_ids (or grammar) left the sampler only EOS under min_tokens
    stops at it ("stop", EOS counted once) instead of padding the output with EOS up to
    min_tokens; an unconstrained one keeps min_tokens."""
    sched = _make()
    sched.add_request(_req("a", 5, max_tokens=10, min_tokens=6, allowed_token_ids=(7, EOS)))
    sched.add_request(_req("b", 5, max_tokens=10, min_tokens=6))
    reqs = {r.request_id: r for r in sched.waiting}
    finals = _run(sched, lambda r: EOS if r.num_output_tokens >= 2 else 7)
    assert finals["a"].finish_reason == "stop" and finals["a"].stop_token_id == EOS
    assert reqs["a"].output_token_ids == [7, 7, EOS]
    assert finals["b"].finish_reason == "stop" and reqs["b"].num_output_tokens == 6


def test_stop_token_ids() -> None:
    sched = _make()
    sched.add_request(_req("a", 5, max_tokens=10, stop_token_ids=[9]))
    r = sched.waiting[0]
    finals = _run(sched, lambda r: 9 if r.num_output_tokens == 2 else 7)
    assert finals["a"].finish_reason == "stop" and finals["a"].stop_token_id == 9
    assert r.output_token_ids == [7, 7, 9]


def test_repetition_detection_gives_repetition_after_min_tokens() -> None:
    """vLLM 0.26's check_stop order: a repeated n-gram at the output's end finishes the request
    with "repetition" once min_tokens outputs exist; a stop token or the length limit on the
    same token wins; a request without detection runs on."""
    cycle = [7, 8, 9]

    def tokens(r: Request) -> int:
        return cycle[r.num_output_tokens % 3]

    detect = {"max_pattern_size": 4, "min_count": 3}
    sched = _make()
    sched.add_request(_req("a", 5, max_tokens=30, repetition_detection=detect))
    sched.add_request(_req("b", 5, max_tokens=30, repetition_detection=detect, min_tokens=11))
    sched.add_request(_req("c", 5, max_tokens=9, repetition_detection=detect))  # length on the 9th
    sched.add_request(_req("d", 5, max_tokens=9, repetition_detection=detect, stop_token_ids=[9]))
    sched.add_request(_req("e", 5, max_tokens=30))
    reqs = {r.request_id: r for r in sched.waiting}
    finals = _run(sched, tokens)
    assert finals["a"].finish_reason == "repetition" and finals["a"].stop_token_id is None
    assert reqs["a"].output_token_ids == cycle * 3
    assert finals["b"].finish_reason == "repetition" and reqs["b"].num_output_tokens == 11
    assert finals["c"].finish_reason == "length" and reqs["c"].num_output_tokens == 9
    assert finals["d"].finish_reason == "stop" and reqs["d"].num_output_tokens == 3
    assert finals["e"].finish_reason == "length" and reqs["e"].num_output_tokens == 30


def test_prefix_cache_hit_on_shared_long_prefix() -> None:
    shared = list(range(1000, 1064))  # 8 full blocks

    def blocks_used(prefix: bool) -> tuple[int, list[Request]]:
        sched = _make(budget=1024, num_blocks=64, prefix=prefix)
        reqs = [_req(f"r{i}", shared + [i, i + 1, i + 2], max_tokens=3) for i in range(4)]
        for r in reqs:
            sched.add_request(r)
        _step(sched)  # all four admitted in the same step
        used = sched.kv.num_total_blocks - sched.kv.num_free_blocks
        _run(sched)
        return used, reqs

    used_plain, _ = blocks_used(False)
    used_cached, reqs = blocks_used(True)
    assert used_plain == 4 * 9
    assert used_cached == 8 + 4 * 1  # siblings hit the first request's blocks in the same step
    assert reqs[0].num_cached_tokens == 0
    assert all(r.num_cached_tokens == 64 for r in reqs[1:])


def test_prefix_cache_across_steps_and_stats() -> None:
    sched = _make(budget=1024, num_blocks=64, prefix=True)
    shared = list(range(500, 548))  # 6 blocks
    sched.add_request(_req("a", shared + [1], max_tokens=2))
    _run(sched)
    b = _req("b", shared + [2, 3], max_tokens=2)
    sched.add_request(b)
    so, outs = _step(sched)
    assert so.scheduled[0].num_new_tokens == 2  # only the tail is computed
    assert outs[0].num_cached_tokens == 48
    stats = sched.get_stats()
    assert stats.prefix_cache_hit_tokens == 48
    assert stats.prefix_cache_query_tokens == 49 + 50
    assert stats.prefix_cache_requests == 2
    _run(sched)


def test_prefix_cache_counters_leave_out_requests_that_skip_the_lookup() -> None:
    """A request with prompt logprobs computes every prompt position and does not look the
    cache up; it was counted as a lookup that missed (three requests of one 81-token prompt,
    the second with prompt logprobs: 243 queried tokens, 80 hits, a 32.9 % hit rate where vLLM
    reports 162 and 49.4 %)."""
    sched = _make(budget=1024, num_blocks=64, prefix=True)
    prompt = list(range(500, 581))  # 81 tokens: 5 full blocks of 16
    sched.add_request(_req("a", prompt, max_tokens=2))
    _run(sched)
    sched.add_request(_req("b", prompt, max_tokens=2, prompt_logprobs=1))
    so, _ = _step(sched)
    assert so.scheduled[0].num_new_tokens == 81  # no cache hit: every position computed
    sched.abort_requests(["b"])
    sched.add_request(_req("c", prompt, max_tokens=2))
    _run(sched)
    stats = sched.get_stats()
    assert (stats.prefix_cache_query_tokens, stats.prefix_cache_hit_tokens) == (2 * 81, 80)
    assert stats.prefix_cache_requests == 2


def test_prefix_cache_counters_leave_out_readmissions_after_preemption() -> None:
    """The hit and query counters (``/metrics`` prefix_cache_hits / _queries, the log's hit
    rate) count each request's first admission only, as vLLM's do: a re-admission after a
    preemption looks up prompt and output again and finds its own blocks, which would make a
    pool that thrashes look like one that shares prefixes."""
    sched = _make(budget=64, num_blocks=6, prefix=True)
    reqs = [
        _req(f"r{i}", list(range(100 * i + 10, 100 * i + 18)), max_tokens=16, ignore_eos=True)
        for i in range(4)
    ]
    for r in reqs:
        sched.add_request(r)
    _run(sched, _position_token)
    stats = sched.get_stats()
    assert stats.num_preemptions_total > 0, "the pool was meant to force a preemption"
    assert stats.prefix_cache_query_tokens == 4 * 8  # each prompt once
    assert stats.prefix_cache_requests == 4
    assert stats.prefix_cache_hit_tokens == 0  # no two prompts share a block


def test_stats_snapshot() -> None:
    sched = _make(budget=1024, num_blocks=10, max_num_seqs=1)
    sched.add_request(_req("a", 16, max_tokens=4))
    sched.add_request(_req("b", 16, max_tokens=4))
    _step(sched)
    stats = sched.get_stats()
    assert (stats.num_running, stats.num_waiting) == (1, 1)
    assert stats.num_total_blocks == 10 and stats.num_free_blocks == 8
    assert stats.kv_cache_usage == pytest.approx(0.2)


@pytest.mark.parametrize("prompt_len", [64, 70])
def test_repeated_prompt_costs_one_step_of_at_most_one_block(prompt_len: int) -> None:
    """A prompt already in the prefix cache: every full block but the one holding its last
    token is a hit (the last token must be computed for its logits), so the repeat is one
    step of at most ``block_size`` tokens that samples, and the hit counter rises by the
    hit blocks' tokens."""
    sched = _make(budget=1024, num_blocks=64, prefix=True)
    prompt = list(range(300, 300 + prompt_len))
    sched.add_request(_req("first", prompt, max_tokens=2))
    _run(sched)
    hits_before = sched.get_stats().prefix_cache_hit_tokens
    sched.add_request(_req("again", prompt, max_tokens=1))
    so, outs = _step(sched)
    hit = (prompt_len - 1) // 8 * 8
    assert [(s.num_new_tokens, s.sample) for s in so.scheduled] == [(prompt_len - hit, True)]
    assert 1 <= prompt_len - hit <= 8
    assert sched.get_stats().prefix_cache_hit_tokens - hits_before == hit
    assert outs[0].finished and outs[0].num_cached_tokens == hit


@pytest.mark.parametrize(
    ("prompt", "max_model_len", "block_size", "num_kv_blocks"),
    [(10, 64, 16, 100), (10, 4096, 16, 8), (100, 128, 16, 100), (1, 33, 16, 2), (50, 40, 16, 100)],
)
def test_room_for_output_is_the_largest_max_tokens_that_fits(
    prompt: int, max_model_len: int, block_size: int, num_kv_blocks: int
) -> None:
    """An unset ``max_tokens`` becomes this room (server and engine): it passes
    ``check_request_fits`` and one token more does not; none when the prompt fills the room."""
    limits = {"max_model_len": max_model_len, "block_size": block_size, "num_kv_blocks": num_kv_blocks}
    room = room_for_output(prompt, **limits)
    assert room == min(max_model_len, num_kv_blocks * block_size) - prompt
    if room >= 1:
        check_request_fits(prompt, room, **limits)
    with pytest.raises(ValueError):
        check_request_fits(prompt, max(room, 0) + 1, **limits)
