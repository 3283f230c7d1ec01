"""Priority scheduling through the offline API and the engine process's request message
(vLLM's ``LLM(scheduling_policy="priority")`` and ``generate(..., priority=[...])``)."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest

from surge import LLM, SamplingParams
from surge.engine.core_proc import AddRequest, EngineInput, RequestError, _add_request

PARAMS = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
PROMPTS = ["Once upon a time", "The cat", "A little girl", "One day"]


@pytest.fixture(scope="module")
def by_priority() -> Iterator[LLM]:
    with LLM(device="cpu", max_num_seqs=1, scheduling_policy="priority") as model:
        yield model


@pytest.fixture(scope="module")
def fcfs() -> Iterator[LLM]:
    with LLM(device="cpu", max_num_seqs=1) as model:
        yield model


def _admission_order(llm: LLM, priority: list[int] | None) -> list[int]:
    """The prompts' indices in the order the engine first gave them a token (one sequence at a
    time: the order of admission), from the real engine's steps."""
    engine = llm.engine
    first: list[str] = []
    step = engine.step

    def recording_step() -> list:
        outputs = step()
        first.extend(o.request_id for o in outputs if o.request_id not in first)
        return outputs

    engine.step = recording_step  # type: ignore[method-assign]
    try:
        results = llm.generate(PROMPTS, PARAMS, priority=priority)
    finally:
        del engine.step
    assert all(len(r.outputs[0].token_ids) == 3 for r in results)
    index = {r.request_id: i for i, r in enumerate(results)}
    return [index[rid] for rid in first]


def test_generate_admits_by_priority_then_prompt_order(by_priority: LLM) -> None:
    """priority was not a generate() argument: a vLLM script that passed it got a TypeError."""
    assert _admission_order(by_priority, [2, 0, 1, 0]) == [1, 3, 2, 0]
    assert _admission_order(by_priority, [0, 0, -(2**70), 5]) == [2, 0, 1, 3]  # any integer offline
    assert _admission_order(by_priority, None) == [0, 1, 2, 3]


def test_fcfs_keeps_prompt_order_and_refuses_a_priority(fcfs: LLM) -> None:
    assert _admission_order(fcfs, [0, 0, 0, 0]) == [0, 1, 2, 3]
    with pytest.raises(
        ValueError, match=r"priority 3 needs the priority scheduling policy \(LLM\(scheduling_policy="
    ):
        fcfs.generate(PROMPTS[:2], PARAMS, priority=[0, 3])
    assert not fcfs.engine.has_unfinished_requests()  # the first prompt, added, was aborted


@pytest.mark.parametrize(
    ("priority", "match"),
    [
        ([1], "priority must be one integer per prompt: 1 for 2 prompts"),
        (5, "priority must be a list of integers, one per prompt, got 5"),
        ([0, True], "priority must be an integer, got True"),
        ([0, 1.0], "priority must be an integer, got 1.0"),
    ],
)
def test_bad_priorities_are_refused(by_priority: LLM, priority: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        by_priority.generate(PROMPTS[:2], PARAMS, priority=priority)  # type: ignore[arg-type]
    assert not by_priority.engine.has_unfinished_requests()


def test_llm_refuses_an_unknown_policy() -> None:
    with pytest.raises(ValueError, match="scheduling_policy must be one of fcfs, priority, got 'lifo'"):
        LLM(device="cpu", scheduling_policy="lifo")


def _sent(msg: AddRequest) -> AddRequest:
    """``msg`` as the engine process decodes it from the API process's socket."""
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(msg), type=EngineInput)
    assert isinstance(decoded, AddRequest)
    return decoded


def test_add_request_message_carries_the_priority_to_the_scheduler(by_priority: LLM, fcfs: LLM) -> None:
    engine = by_priority.engine
    errors: list[RequestError] = []
    params = SamplingParams(max_tokens=2)
    _add_request(engine, _sent(AddRequest("one", [1, 2, 3], params, priority=7)), errors, None)
    _add_request(
        engine,
        _sent(
            AddRequest(
                "n", [1, 2], msgspec.structs.replace(params, n=2), choice_ids=["n-0", "n-1"], priority=-7
            )
        ),
        errors,
        None,
    )
    assert errors == []
    waiting = engine.scheduler.waiting
    assert [(r.request_id, r.priority) for r in waiting] == [("n-0", -7), ("n-1", -7), ("one", 7)]
    engine.abort_requests(["one", "n-0", "n-1"])
    assert not engine.has_unfinished_requests()
    # under fcfs the engine refuses a priority (each choice gets the error)
    _add_request(
        fcfs.engine,
        _sent(
            AddRequest(
                "f", [1, 2], msgspec.structs.replace(params, n=2), choice_ids=["f-0", "f-1"], priority=1
            )
        ),
        errors,
        None,
    )
    assert [e.request_id for e in errors] == ["f-0", "f-1"]
    assert "needs the priority scheduling policy" in errors[0].message
    assert not fcfs.engine.has_unfinished_requests()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_priority_preemption_keeps_greedy_outputs(async_scheduling: bool) -> None:
    """A pool too small for all eight: priority preemption recomputes requests (with a token in
    flight under asynchronous scheduling) and every output stays the unpressured fcfs one."""
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    prompts = [
        f"Once upon a time there was a {w}"
        for w in ("cat", "dog", "girl", "boy", "tree", "bird", "king", "frog")
    ]
    with LLM(device="cpu") as roomy:
        want = [o.outputs[0].token_ids for o in roomy.generate(prompts, params)]
    with LLM(
        device="cpu",
        scheduling_policy="priority",
        num_kv_blocks=12,
        enable_prefix_caching=False,
        async_scheduling=async_scheduling,
    ) as tight:
        got = tight.generate(prompts, params, priority=[3, -1, 2, 0, 5, 1, 4, -2])
        assert tight.engine.scheduler.num_preemptions_total > 0
    assert [o.outputs[0].token_ids for o in got] == want
