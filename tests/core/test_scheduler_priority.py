"""The priority scheduling policy (vLLM's ``--scheduling-policy priority``), driven by hand-built
model outputs (no torch): waiting order, preemption victims, where a preempted request goes."""

from __future__ import annotations

from collections import Counter

import pytest

from surge.config import CacheConfig, SchedulerConfig
from surge.core.outputs import ModelOutput, SchedulerOutput
from surge.core.scheduler import PriorityQueue, Scheduler
from surge.request import Request, RequestStatus
from surge.sampling_params import SamplingParams


def _make(policy: str, *, budget: int = 64, num_blocks: int = 64, max_num_seqs: int = 16) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=1024,
            watermark=0.0,
            scheduling_policy=policy,  # type: ignore[arg-type]
        ),
        CacheConfig(block_size=8, enable_prefix_caching=False),
        num_blocks,
    )


def _req(rid: str, prompt: int, *, priority: int, arrival: float, max_tokens: int = 16) -> Request:
    return Request(
        rid,
        list(range(10, 10 + prompt)),
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        arrival_time=arrival,
        priority=priority,
    )


def _position_token(r: Request) -> int:
    return 100 + r.num_output_tokens  # encodes the output position: outputs survive a recompute


def _step(sched: Scheduler) -> SchedulerOutput:
    so = sched.schedule()
    assert so.num_scheduled_tokens == sum(s.num_new_tokens for s in so.scheduled) <= 64
    sched.update(
        so, ModelOutput({s.request.request_id: _position_token(s.request) for s in so.scheduled if s.sample})
    )
    return so


def _ids(so: SchedulerOutput) -> list[str]:
    return [s.request.request_id for s in so.scheduled]


def test_config_refuses_an_unknown_policy() -> None:
    with pytest.raises(ValueError, match="scheduling_policy must be one of fcfs, priority, got 'lifo'"):
        SchedulerConfig(scheduling_policy="lifo")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("policy", "order"),
    [
        # fcfs: arrival order, priorities play no part
        ("fcfs", ["p3", "p1-late", "p2", "p1-early", "p-neg"]),
        # priority: lower first, ties by arrival time (not by the order of add_request)
        ("priority", ["p-neg", "p1-early", "p1-late", "p2", "p3"]),
    ],
)
def test_waiting_requests_are_admitted_by_priority_then_arrival(policy: str, order: list[str]) -> None:
    sched = _make(policy, max_num_seqs=1)
    for rid, priority, arrival in [
        ("p3", 3, 1.0),
        ("p1-late", 1, 3.0),
        ("p2", 2, 2.0),
        ("p1-early", 1, 2.5),
        ("p-neg", -(2**63), 9.0),
    ]:
        sched.add_request(_req(rid, 4, priority=priority, arrival=arrival, max_tokens=2))
    assert [r.request_id for r in sched.waiting] == order
    admitted: list[str] = []
    while sched.has_unfinished_requests():
        so = _step(sched)
        admitted += [rid for rid in _ids(so) if rid not in admitted]
    assert admitted == order


def _three_running(policy: str) -> tuple[Scheduler, dict[str, Request]]:
    """A pool of 4 blocks of 8 tokens: ``a`` (priority 5, admitted first), then ``b`` (0) and
    ``c`` (1), 8-token prompts with one output token each: 3 blocks held, 1 free; a's second
    block is taken in the step that admits b and c."""
    sched = _make(policy, num_blocks=4)
    reqs = {
        "a": _req("a", 8, priority=5, arrival=1.0),
        "b": _req("b", 8, priority=0, arrival=2.0),
        "c": _req("c", 8, priority=1, arrival=3.0),
    }
    sched.add_request(reqs["a"])
    assert _ids(_step(sched)) == ["a"]
    sched.add_request(reqs["b"])
    sched.add_request(reqs["c"])
    assert _ids(_step(sched)) == ["a", "b", "c"]
    assert [r.request_id for r in sched.running] == ["a", "b", "c"] and sched.kv.num_free_blocks == 0
    return sched, reqs


def test_priority_preempts_the_running_request_of_the_largest_priority() -> None:
    """b needs a block: under fcfs the latest admitted (c) is preempted; under priority the worst
    (a), which was scheduled earlier in the same step and gives its token back."""
    sched, reqs = _three_running("priority")
    so = _step(sched)
    assert so.preempted_request_ids == ["a"]
    assert _ids(so) == ["b", "c"]  # a's decode of this step was taken back
    a = reqs["a"]
    assert a.status == RequestStatus.PREEMPTED and a.block_ids == [] and a.num_computed_tokens == 0
    assert a.output_token_ids == [100, 101]  # its output is kept
    assert [r.request_id for r in sched.running] == ["b", "c"]
    while sched.has_unfinished_requests():
        _step(sched)
    for r in reqs.values():
        assert r.status == RequestStatus.FINISHED_LENGTH
        assert r.output_token_ids == list(range(100, 116))
    assert sched.kv.num_free_blocks == 4


def test_fcfs_still_preempts_the_latest_admitted() -> None:
    sched, _ = _three_running("fcfs")
    so = _step(sched)
    assert so.preempted_request_ids == ["c"]
    assert _ids(so) == ["a", "b"]
    assert sched.waiting[0].request_id == "c"


def test_a_preempted_request_goes_back_by_its_priority_not_to_the_front() -> None:
    sched, reqs = _three_running("priority")
    sched.add_request(_req("d", 8, priority=2, arrival=4.0))  # arrives later, but of a lower priority
    so = _step(sched)
    assert so.preempted_request_ids == ["a"]
    assert [r.request_id for r in sched.waiting] == ["d", "a"]  # fcfs would put a first


def test_a_request_of_the_largest_priority_preempts_itself_and_the_rest_still_run() -> None:
    """The request that needs a block is the worst running one: it is preempted, not another,
    and the running requests after it are scheduled in the same step."""
    sched = _make("priority", num_blocks=4)
    a = _req("a", 4, priority=5, arrival=1.0)
    sched.add_request(a)
    assert _ids(_step(sched)) == ["a"]  # 1 block
    sched.add_request(_req("b", 20, priority=0, arrival=2.0, max_tokens=8))
    assert _ids(_step(sched)) == ["a", "b"]  # b takes the 3 other blocks
    for _ in range(3):
        assert _ids(_step(sched)) == ["a", "b"]  # both decode inside their blocks
    assert a.num_tokens == 9 and sched.kv.num_free_blocks == 0
    so = _step(sched)  # a's 9th token needs a block: a is the worst running request
    assert so.preempted_request_ids == ["a"] and _ids(so) == ["b"]
    # a 9-token prompt of priority -1 needs 2 blocks, 1 is free: it waits ahead of a, and
    # nobody is preempted for it
    sched.add_request(_req("e", 9, priority=-1, arrival=4.0))
    so = _step(sched)
    assert so.preempted_request_ids == [] and _ids(so) == ["b"]
    assert [r.request_id for r in sched.waiting] == ["e", "a"]


def test_a_waiting_request_of_a_lower_priority_never_preempts_running_ones() -> None:
    """As in vLLM: admission waits for free blocks whatever the priority."""
    sched = _make("priority", num_blocks=4)
    sched.add_request(_req("low", 30, priority=9, arrival=1.0, max_tokens=2))  # 4 blocks: the whole pool
    _step(sched)
    sched.add_request(_req("urgent", 4, priority=-9, arrival=2.0))
    so = _step(sched)
    assert _ids(so) == ["low"] and so.preempted_request_ids == []
    assert [r.request_id for r in sched.waiting] == ["urgent"]


def test_abort_removes_a_waiting_request_from_the_priority_queue() -> None:
    sched = _make("priority", max_num_seqs=1)
    for rid, priority in [("x", 2), ("y", 1), ("z", 3)]:
        sched.add_request(_req(rid, 4, priority=priority, arrival=1.0))
    sched.abort_requests(["y"])
    assert [r.request_id for r in sched.waiting] == ["x", "z"] and sched.num_waiting == 2
    assert _ids(_step(sched)) == ["x"]


def test_priority_queue_ties_keep_insertion_order() -> None:
    q = PriorityQueue()
    reqs = [_req(f"r{i}", 1, priority=0, arrival=1.0) for i in range(5)]
    for r in reqs:
        q.append(r)
    assert [r.request_id for r in q] == [f"r{i}" for i in range(5)]
    assert q[0] is reqs[0] and q[3] is reqs[3] and len(q) == 5
    q.remove(reqs[2])
    with pytest.raises(ValueError, match="not in the waiting queue"):
        q.remove(reqs[2])
    assert [q.popleft().request_id for _ in range(4)] == ["r0", "r1", "r3", "r4"]
    assert not q
    with pytest.raises(IndexError):
        q.popleft()


def test_priority_preemption_under_asynchronous_scheduling_keeps_exact_lengths() -> None:
    """Schedule k+1 before update(k), as the engine does: requests of a worse priority admitted
    first, then better ones arriving, so that victims have a token in flight (dropped) or were
    already scheduled in the step being built (given back): every request still ends with
    exactly max_tokens tokens and no block leaks."""
    sched = _make("priority", budget=40, num_blocks=10, max_num_seqs=6)
    arrivals: dict[int, list[Request]] = {}
    want = {}
    for i in range(12):
        n = 3 + 6 * (i % 3)
        want[f"r{i}"] = n
        request = Request(
            f"r{i}",
            list(range(10, 22 + i)),
            SamplingParams(max_tokens=n, ignore_eos=True),
            arrival_time=float(i),
            priority=9 - i,  # each later one is better
        )
        arrivals.setdefault(2 * i, []).append(request)
    counts: Counter[str] = Counter()
    in_flight: SchedulerOutput | None = None
    dropped_pending = 0
    for step in range(1000):
        for request in arrivals.get(step, []):
            sched.add_request(request)
        so = sched.schedule()
        for x in so.scheduled:  # a chunk within the known + pending tokens, and its blocks held
            r = x.request
            assert r.num_computed_tokens + x.num_new_tokens <= r.num_tokens + r.num_pending_outputs
            assert len(r.block_ids) * sched.block_size >= r.num_computed_tokens + x.num_new_tokens
        dropped_pending += sum(1 for rid in so.preempted_request_ids if in_flight and rid in _ids(in_flight))
        launched = None if so.is_empty else so
        if launched is not None:
            sched.advance(so)
        if in_flight is not None:
            outs = sched.update(
                in_flight, ModelOutput({s.request.request_id: 7 for s in in_flight.scheduled if s.sample})
            )
            for out in outs:
                counts[out.request_id] += len(out.new_token_ids)
        in_flight = launched
        if in_flight is None and not sched.has_unfinished_requests() and step > 2 * 11:
            break
    assert dict(counts) == want
    assert sched.num_preemptions_total > 0 and dropped_pending > 0
    assert sched.kv.num_free_blocks == sched.kv.num_total_blocks
