"""The engine with grammars: constrained and free requests in one batch under chunked prefill,
preemption and asynchronous scheduling; requests waiting for their grammar do not hold the
others up; compiled grammars are cached; compile failures are reported per request."""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import Future
from typing import Any

import jsonschema
import pytest

from surge import LLM, SamplingParams
from surge.engine.llm_engine import LLMEngine, build_engine_config
from surge.request import Request
from surge.sampling_params import StructuredOutputsParams
from tests.conftest import STORIES
from tests.structured.test_offline_constrained import REGEX, SCHEMA


def _prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 500) for _ in range(n)] for n in lengths]


FREE = [
    SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
    SamplingParams(temperature=0.9, seed=11, max_tokens=25, ignore_eos=True),
    SamplingParams(temperature=0.0, repetition_penalty=1.3, max_tokens=20, ignore_eos=True),
    SamplingParams(temperature=1.0, seed=5, top_k=20, max_tokens=28, ignore_eos=True),
]


@pytest.mark.parametrize(
    "engine_args",
    [
        {"max_num_batched_tokens": 16},  # chunked prefill
        {"num_kv_blocks": 9, "enable_prefix_caching": False},  # preemption
        {"num_kv_blocks": 9, "enable_prefix_caching": False, "max_num_batched_tokens": 16},
    ],
    ids=["chunked", "preemption", "both"],
)
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_free_rows_unchanged_by_constrained_rows(engine_args: dict[str, Any], async_scheduling: bool) -> None:
    free_prompts = _prompts(3, (14, 30, 9, 21))
    con_prompts = _prompts(4, (12, 25, 7))
    constrained = [
        SamplingParams(
            temperature=1.0, seed=1, max_tokens=60, structured_outputs=StructuredOutputsParams(json=SCHEMA)
        ),
        SamplingParams(
            temperature=0.0, max_tokens=40, structured_outputs=StructuredOutputsParams(regex=REGEX)
        ),
        SamplingParams(
            temperature=1.0, seed=2, max_tokens=60, structured_outputs=StructuredOutputsParams(json=SCHEMA)
        ),
    ]
    alone = LLM(STORIES, device="cpu", async_scheduling=async_scheduling, **engine_args)
    free_alone = [o.outputs[0].token_ids for o in alone.generate(free_prompts, FREE)]
    mixed = LLM(STORIES, device="cpu", async_scheduling=async_scheduling, **engine_args)
    assert mixed.engine.async_scheduling is async_scheduling
    prompts = [free_prompts[0], con_prompts[0], free_prompts[1], con_prompts[1], free_prompts[2]]
    prompts += [con_prompts[2], free_prompts[3]]
    params = [FREE[0], constrained[0], FREE[1], constrained[1], FREE[2], constrained[2], FREE[3]]
    outs = mixed.generate(prompts, params)
    free_mixed = [outs[i].outputs[0].token_ids for i in (0, 2, 4, 6)]
    assert free_mixed == free_alone
    for i in (1, 5):
        o = outs[i].outputs[0]
        if o.finish_reason == "stop":
            jsonschema.validate(json.loads(o.text), SCHEMA)
        else:
            assert len(o.token_ids) == 60
    import re

    assert re.fullmatch(REGEX, outs[3].outputs[0].text)
    if "num_kv_blocks" in engine_args:
        assert mixed.engine.get_stats().num_preemptions_total > 0


def _run(engine: LLMEngine, limit: int = 5000) -> dict[str, list[int]]:
    """Step ``engine`` until it has no request left (at most ``limit`` steps; an idle step
    waits up to 5 ms for a grammar, and the first grammar starts a compile worker, ~3 s)."""
    tokens: dict[str, list[int]] = {}
    for _ in range(limit):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def test_waiting_grammar_does_not_block_others_and_cache_by_key() -> None:
    engine = LLMEngine(build_engine_config(None, device="cpu"))
    so = StructuredOutputsParams(regex=REGEX)
    engine.add_request("warm", [1, 5, 6], SamplingParams(max_tokens=20, structured_outputs=so))
    _run(engine)
    structured = engine._structured
    assert structured is not None
    assert len(engine.take_grammar_compile_times()) == 1
    # A grammar that never finishes compiling: the free request still runs to the end.
    stuck: Future[Any] = Future()
    real_submit = structured.cache.submit
    structured.cache.submit = lambda params: stuck  # type: ignore[method-assign]
    engine.add_request("slow", [1, 7, 8], SamplingParams(max_tokens=8, structured_outputs=so))
    engine.add_request("free", [1, 9, 10], SamplingParams(max_tokens=8, ignore_eos=True))
    for _ in range(30):
        engine.step()
    assert engine.get_stats().num_waiting == 1
    assert engine.get_stats().num_waiting_deferred == 1  # vLLM's "deferred" waiting reason
    slow_request = structured.waiting["slow"][0]
    slow_queued = slow_request.queued_time
    assert slow_queued is not None  # queued at add_request, as vLLM's WAITING_FOR_FSM request
    assert "slow" in structured.waiting and "free" not in engine.scheduler.requests
    structured.cache.submit = real_submit  # type: ignore[method-assign]
    stuck.set_result(real_submit(so).result())
    tokens = _run(engine)
    assert set(tokens) == {"slow"}
    assert engine.get_stats().num_waiting_deferred == 0
    assert slow_request.queued_time == slow_queued  # its admission did not restart its queue time
    # The same grammar again: a cache hit, no new compilation.
    engine.add_request("again", [1, 5, 6], SamplingParams(max_tokens=20, structured_outputs=so))
    _run(engine)
    assert engine.take_grammar_compile_times() == []


def test_an_id_waiting_for_its_grammar_is_in_use() -> None:
    """A plain request with the id of one waiting for its grammar is refused at add_request: it
    was accepted, and the scheduler's refusal at admission, inside step(), ended the engine."""
    engine = LLMEngine(build_engine_config(None, device="cpu"))
    so = StructuredOutputsParams(regex="ab")
    engine.add_request("a-0", [1, 5, 6], SamplingParams(max_tokens=4, structured_outputs=so))
    with pytest.raises(ValueError, match="'a-0' is already in use"):
        engine.add_request("a-0", [1, 5, 6], SamplingParams(max_tokens=50))
    tokens = _run(engine)
    assert set(tokens) == {"a-0"} and engine.take_request_errors() == []
    assert not engine.has_unfinished_requests()


def test_abort_cancels_a_compilation_nobody_waits_for() -> None:
    """An aborted request's compilation that has not started is cancelled (it held the compile
    thread); one another waiting request shares is kept; a cancelled key compiles anew later."""
    import threading

    from surge.structured.manager import StructuredOutputManager

    manager = StructuredOutputManager(str(STORIES), 512, (2,), "cpu")
    gate = threading.Event()
    blocker = manager.cache._pool.submit(gate.wait)  # every compile thread busy
    extra = [manager.cache._pool.submit(gate.wait) for _ in range(manager.cache._pool.max_workers - 1)]

    def request(rid: str, regex: str) -> Request:
        return Request(rid, [1, 5], SamplingParams(structured_outputs=StructuredOutputsParams(regex=regex)))

    manager.add(request("lone", "a+"))
    manager.add(request("shared-1", "b+"))
    manager.add(request("shared-2", "b+"))
    lone, shared = manager.waiting["lone"][1], manager.waiting["shared-1"][1]
    manager.abort(["lone", "shared-1"])
    assert lone.cancelled() and not shared.cancelled()
    gate.set()
    blocker.result(timeout=30)
    for f in extra:
        f.result(timeout=30)
    assert shared.result(timeout=60) is not None
    again = manager.cache.submit(StructuredOutputsParams(regex="a+"))  # not the cancelled future
    assert again is not lone and again.result(timeout=60) is not None


def test_compile_failure_is_a_request_error_and_abort_while_waiting() -> None:
    engine = LLMEngine(build_engine_config(None, device="cpu"))
    engine.add_request(
        "bad", [1, 5], SamplingParams(structured_outputs=StructuredOutputsParams(regex="([a-z"))
    )
    engine.add_request("free", [1, 5], SamplingParams(max_tokens=4, ignore_eos=True))
    tokens = _run(engine)
    errors = engine.take_request_errors()
    assert [e.request_id for e in errors] == ["bad"]
    assert "regex" in errors[0].message and errors[0].status == 400
    assert len(tokens["free"]) == 4
    engine.add_request(
        "gone", [1, 5], SamplingParams(structured_outputs=StructuredOutputsParams(choice=["a", "b"]))
    )
    engine.abort_requests(["gone"])
    assert not engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="maximum context length"):
        engine.add_request(
            "long",
            [1] * 500,
            SamplingParams(max_tokens=100, structured_outputs=StructuredOutputsParams(regex="a")),
        )


def test_reasoning_gate_frees_tokens_until_the_end_token() -> None:
    """With ``reasoning_end_token_id`` the output is free until that token, then follows the
    grammar."""
    llm = LLM(STORIES, device="cpu")
    tok = llm.tokenizer
    gate = tok.convert_tokens_to_ids(",")
    so = StructuredOutputsParams(choice=["yes", "no"], reasoning_end_token_id=gate)
    out = llm.generate(
        "Once upon a time", SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=so)
    )
    o = out[0].outputs[0]
    assert gate in o.token_ids
    after = o.token_ids[o.token_ids.index(gate) + 1 :]
    assert tok.decode(after, skip_special_tokens=True) in ("yes", "no")
    free = llm.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=60))[0].outputs[0]
    cut = o.token_ids.index(gate) + 1
    assert free.token_ids[:cut] == o.token_ids[:cut]


def test_compile_thread_budget_leaves_the_cpus_to_the_engine() -> None:
    """Compilations together use at most one thread per 8 CPUs (at least one, at most 4)."""
    from surge.structured.compiler import compile_thread_budget

    assert compile_thread_budget(1) == (1, 1)
    assert compile_thread_budget(2) == (1, 1)
    assert compile_thread_budget(16) == (2, 1)
    assert compile_thread_budget(128) == (4, 1)
    for cpus in range(1, 200):
        workers, threads = compile_thread_budget(cpus)
        assert 1 <= workers * threads <= max(1, cpus // 8)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_min_tokens_gives_way_to_a_finished_grammar(async_scheduling: bool) -> None:
    """A choice grammar that ends before ``min_tokens`` stops the request at its EOS ("stop",
    the EOS counted once) instead of padding the output with EOS tokens up to ``min_tokens``."""
    llm = LLM(STORIES, device="cpu", async_scheduling=async_scheduling)
    choice = StructuredOutputsParams(choice=["no"])
    base = SamplingParams(temperature=0.0, max_tokens=8, structured_outputs=choice)
    padded = SamplingParams(temperature=0.0, max_tokens=8, min_tokens=6, structured_outputs=choice)
    plain, with_min = (o.outputs[0] for o in llm.generate(["Once upon a time"] * 2, [base, padded]))
    assert with_min.text == plain.text == "no"
    assert with_min.finish_reason == plain.finish_reason == "stop"
    assert with_min.token_ids == plain.token_ids
    assert with_min.token_ids.count(with_min.token_ids[-1]) == 1


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_grammar_at_a_dead_end_is_an_error_not_a_stop(async_scheduling: bool) -> None:
    """A regex that no token can continue after "a" ended with EOS and "stop" (the sampler gave
    way, the output broke the constraint); now the request fails, naming the grammar. A grammar
    that completes still stops normally, and the engine keeps serving."""
    llm = LLM(STORIES, device="cpu", async_scheduling=async_scheduling)
    dead = SamplingParams(
        temperature=0.0, max_tokens=8, structured_outputs=StructuredOutputsParams(regex=r"a[^\s\S]")
    )
    with pytest.raises(ValueError, match="no token can continue the grammar"):
        llm.generate(["Once upon a time"], dead)
    ok = SamplingParams(
        temperature=0.0, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=["yes"])
    )
    out = llm.generate(["Once upon a time"], ok)[0].outputs[0]
    assert out.text == "yes" and out.finish_reason == "stop"


def test_compile_failures_carry_the_status_of_whose_fault_it_is() -> None:
    """A refused grammar (ValueError) fails its request with status 400, the grammar's fault; a
    compile worker that died or could not start (RuntimeError) with 500, the server's fault."""
    from surge.core.outputs import RequestFailure
    from surge.structured.manager import StructuredOutputManager

    manager = StructuredOutputManager(str(STORIES), 512, (2,), "cpu")
    outcomes: dict[str, Exception] = {
        "refused": ValueError("the regex grammar accepts no text"),
        "crashed": RuntimeError("the grammar compile worker exited unexpectedly"),
    }
    for rid, error in outcomes.items():
        future: Future[Any] = Future()
        future.set_exception(error)
        params = SamplingParams(structured_outputs=StructuredOutputsParams(regex=f"{rid}+"))
        manager.waiting[rid] = (Request(rid, [1, 5], params), future)
    ready, failed = manager.take_ready()
    assert ready == [] and manager.waiting == {}
    assert failed == [
        RequestFailure("refused", "the regex grammar accepts no text", 400, grammar=True),
        RequestFailure("crashed", "the grammar compile worker exited unexpectedly", 500, grammar=False),
    ]
    manager.close()


def test_offline_generate_raises_runtime_error_for_a_server_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    """``LLM.generate`` raises ValueError for a request's fault (status 400) and RuntimeError
    for the server's (500), and leaves no request behind either way."""
    from surge.core.outputs import RequestFailure

    llm = LLM(STORIES, device="cpu")
    for status, kind in ((400, ValueError), (500, RuntimeError)):
        failures = [RequestFailure("any", f"failed with {status}", status)]
        monkeypatch.setattr(llm.engine, "take_request_errors", lambda f=failures: f)
        with pytest.raises(kind, match=f"^failed with {status}$"):
            llm.generate([[1, 5]], SamplingParams(max_tokens=2))
        assert not llm.engine.has_unfinished_requests()
    llm.close()


@pytest.mark.parametrize("ignore_eos", [False, True], ids=["eos", "ignore_eos"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_grammar_at_a_dead_end_outputs_no_token_it_forbids(
    async_scheduling: bool, ignore_eos: bool
) -> None:
    """At a dead end (no token allowed, not even a stop token) the row used to be left unmasked
    by the sampler and one forbidden token was output (and streamed) before the error; now the
    row allows only the stop tokens, so every token the request output is one the grammar took.
    Under ``ignore_eos`` the request used to run to ``max_tokens`` on stop tokens and end with
    "length", no error; now it fails at the dead end too."""
    import xgrammar as xgr

    engine = LLMEngine(build_engine_config(None, device="cpu", async_scheduling=async_scheduling))
    params = SamplingParams(
        temperature=1.0,
        seed=3,
        max_tokens=200,
        ignore_eos=ignore_eos,
        structured_outputs=StructuredOutputsParams(regex=r"a[^\s\S]"),
    )
    engine.add_request("dead", [1, 5, 9], params)
    emitted: list[int] = []
    deadline = time.monotonic() + 120  # the grammar compiles meanwhile (a worker starts)
    while engine.has_unfinished_requests() and time.monotonic() < deadline:
        outputs = engine.step()
        emitted += [t for out in outputs if out.request_id == "dead" for t in out.new_token_ids]
        if not outputs:
            time.sleep(0.01)
    errors = engine.take_request_errors()
    assert [(e.request_id, e.status) for e in errors] == [("dead", 400)]
    assert "no token can continue the grammar" in errors[0].message
    structured = engine._structured
    assert structured is not None and emitted
    matcher = xgr.GrammarMatcher(structured.cache.submit(params.structured_outputs).result(timeout=60))
    assert all(matcher.accept_token(t) for t in emitted), emitted
    assert not engine.has_unfinished_requests()
    engine.close()
