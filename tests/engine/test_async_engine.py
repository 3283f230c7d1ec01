"""Asynchronous scheduling end to end on CPU: the same tokens as the synchronous engine
(greedy and seeded sampling, penalties, chunked prefill, preemption, EOS), exact lengths,
and aborts while a step is in flight."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from surge import LLM, SamplingParams
from surge.engine.llm_engine import LLMEngine, build_engine_config
from tests.conftest import STORIES
from tests.engine.tiny_models import make_tiny_model


def _prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 500) for _ in range(n)] for n in lengths]


def _tokens(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module", params=["stories260K", "qwen3"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if request.param == "stories260K":
        return STORIES
    return make_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3"))


@pytest.mark.parametrize(
    "engine_args",
    [
        {},
        {"max_num_batched_tokens": 16},  # chunked prefill
        {"num_kv_blocks": 6, "enable_prefix_caching": False},  # preemption
    ],
    ids=["defaults", "chunked", "preemption"],
)
def test_async_matches_sync(model_dir: Path, engine_args: dict[str, object]) -> None:
    prompts = _prompts(5, (14, 13, 12, 11, 30, 29, 3, 1))
    params = [SamplingParams(temperature=0.0, max_tokens=9 + i, ignore_eos=True) for i in range(len(prompts))]
    params[2] = SamplingParams(temperature=0.9, seed=11, max_tokens=10, ignore_eos=True)
    params[3] = SamplingParams(temperature=0.0, repetition_penalty=1.3, max_tokens=10, ignore_eos=True)
    results = []
    for mode in (False, True):
        llm = LLM(model_dir, device="cpu", dtype="float32", async_scheduling=mode, **engine_args)  # type: ignore[arg-type]
        assert llm.engine.async_scheduling is mode
        results.append(_tokens(llm, prompts, params))
        if "num_kv_blocks" in engine_args:
            assert llm.engine.get_stats().num_preemptions_total > 0
    sync, async_ = results
    assert async_ == sync
    assert [len(t) for t in async_] == [p.max_tokens for p in params]


def test_async_stops_at_a_stop_token_like_sync() -> None:
    prompts = ["Once upon a time", "The dog", "Lily and Tim"]
    free = LLM(device="cpu", async_scheduling=False).generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=30)
    )
    stop = free[1].outputs[0].token_ids[6]  # a token the second prompt reaches mid-sequence
    params = SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[stop])
    outs = []
    for mode in (False, True):
        llm = LLM(device="cpu", async_scheduling=mode)
        outs.append(
            [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in llm.generate(prompts, params)]
        )
    assert outs[1] == outs[0]
    ids, reason = outs[1][1]
    assert reason == "stop" and ids[-1] == stop and len(ids) <= 7


def test_abort_while_in_flight_frees_everything() -> None:
    engine = LLMEngine(build_engine_config(None, device="cpu", async_scheduling=True))
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"r{i}", [1, 5 + i, 9], params)
    got: dict[str, int] = {}
    for _ in range(3):
        for out in engine.step():
            got[out.request_id] = got.get(out.request_id, 0) + len(out.new_token_ids)
    engine.abort_requests(["r1"])
    while engine.has_unfinished_requests():
        for out in engine.step():
            got[out.request_id] = got.get(out.request_id, 0) + len(out.new_token_ids)
    assert got["r0"] == got["r2"] == 20 and got["r1"] < 20
    kv = engine.scheduler.kv
    assert kv.num_free_blocks == kv.num_total_blocks


def test_prompt_scoring_in_chunks_keeps_every_prompt_row() -> None:
    """``max_tokens=0`` with ``prompt_logprobs`` (completions' echo of a scored prompt) over
    several chunks: under asynchronous scheduling every prompt row arrives, the same rows as
    the synchronous engine (the rows of the last chunk were lost when an earlier chunk's
    update finished the request)."""
    prompt = _prompts(7, (53,))[0]
    rows = []
    for mode in (False, True):
        llm = LLM(device="cpu", async_scheduling=mode, max_num_batched_tokens=16)
        out = llm.generate([prompt], SamplingParams(max_tokens=0, prompt_logprobs=1))[0]
        assert out.outputs[0].token_ids == [] and out.outputs[0].finish_reason == "length"
        assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(prompt)
        rows.append([None if r is None else sorted(r) for r in out.prompt_logprobs])
    assert rows[0] == rows[1]


@pytest.fixture(scope="module")
def sync_and_async() -> dict[bool, LLM]:
    """A synchronous and an asynchronous ``LLM`` on stories260K, by ``async_scheduling``."""
    return {mode: LLM(device="cpu", async_scheduling=mode) for mode in (False, True)}


_PROMPTS = ["The dog", "Once upon a time", "Lily and Tim"]
_EOS = 2  # stories260K's
_ENDINGS = {
    # logit_bias makes EOS the first greedy token (min_tokens would make every step wait for
    # the one before: nothing in flight)
    "eos": SamplingParams(temperature=0.0, max_tokens=30, logit_bias={_EOS: 100.0}),
    "stop_token_ids": SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[426, 432]),  # "." ","
    "stop_string": SamplingParams(temperature=0.0, max_tokens=30, stop=[" big", " a ", " play"]),
}


def _run_call(llm: LLM, call: str, params: SamplingParams) -> list[tuple[list[int], str, str | None]]:
    if call == "generate":
        results = llm.generate(_PROMPTS, params)
    elif call == "chat":
        results = llm.chat([[{"role": "user", "content": p}] for p in _PROMPTS], params)
    else:
        llm.enqueue(_PROMPTS, params)
        results = llm.wait_for_completion()
    return [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason) for o in results]


@pytest.mark.parametrize("ending", list(_ENDINGS))
@pytest.mark.parametrize("call", ["generate", "chat", "wait_for_completion"])
def test_offline_call_returns_with_the_engine_idle(
    sync_and_async: dict[bool, LLM], call: str, ending: str
) -> None:
    """Every request of a call ends on EOS, a stop id or a stop string: under asynchronous
    scheduling the step launched after the last one applied is settled before the call returns,
    as vLLM's offline loop leaves its engine empty. It was left in flight (the engine had
    unfinished work with no request in the scheduler, and the next call applied it)."""
    got = {}
    for mode, llm in sync_and_async.items():
        got[mode] = _run_call(llm, call, _ENDINGS[ending])
        assert all(reason == "stop" for _, _, reason in got[mode]), got[mode]
        engine = llm.engine
        assert not engine.has_unfinished_requests()
        stats = engine.get_stats()
        assert stats.num_running == stats.num_waiting == 0 and stats.num_free_blocks == stats.num_total_blocks
    assert got[True] == got[False]


def _engine_mid_run(launched: list[object]) -> LLMEngine:
    """An asynchronous CPU engine with three requests running and a step in flight; the
    handles it launched are appended to ``launched``."""
    engine = LLMEngine(build_engine_config(None, device="cpu", async_scheduling=True))
    execute_async = engine.runner.execute_async

    def recording(scheduler_output: object) -> object:
        handle = execute_async(scheduler_output)
        launched.append(handle)
        return handle

    engine.runner.execute_async = recording  # type: ignore[method-assign]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"r{i}", [1, 5 + i, 9], params)
    for _ in range(3):
        engine.step()
    assert engine._in_flight is not None and engine.scheduler.kv.num_free_blocks < engine.num_kv_blocks
    return engine


def test_close_settles_the_step_in_flight_and_frees_every_block() -> None:
    """close() under asynchronous scheduling waits for the step in flight and drops it, and
    aborts the running requests: nothing launched is left unresolved, every KV block is free,
    the engine has no work, and a second close() is a no-op. The step stayed in flight and the
    requests kept their blocks."""
    launched: list[object] = []
    engine = _engine_mid_run(launched)
    engine.close()
    assert all(h._done for h in launched)  # type: ignore[attr-defined]
    assert not engine.has_unfinished_requests()
    kv = engine.scheduler.kv
    assert kv.num_free_blocks == kv.num_total_blocks
    engine.close()


def test_close_logs_a_failed_step_in_flight(caplog: pytest.LogCaptureFixture) -> None:
    """A step in flight that fails while close() waits for it (a worker that died) is logged,
    not raised, and the requests are aborted all the same."""
    launched: list[object] = []
    engine = _engine_mid_run(launched)
    assert engine._in_flight is not None

    class _DeadWorker:
        def result(self) -> None:
            raise RuntimeError("tensor-parallel worker rank 1 died")

    engine._in_flight.handle = _DeadWorker()
    with caplog.at_level("WARNING", logger="surge.engine"):
        engine.close()
    assert "rank 1 died" in caplog.text
    assert not engine.has_unfinished_requests()
    assert engine.scheduler.kv.num_free_blocks == engine.scheduler.kv.num_total_blocks
