"""Review tests of asynchronous scheduling (edge cases not covered by test_async_engine.py):
victims whose last token is in flight, ``max_model_len`` boundaries, a budget of as few tokens
as sequences, aborting every request while a step is in flight, pending tokens through the
decode-graph path, a randomized sync-vs-async comparison, and the engine process loop."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import msgspec
import pytest
import zmq

from surge import LLM, SamplingParams
from surge.core.outputs import ModelOutput, SchedulerOutput
from surge.engine.core_proc import AbortRequest, AddRequest, EngineOutputs, _busy_loop
from surge.engine.llm_engine import LLMEngine, build_engine_config, split_n
from surge.request import RequestStatus
from surge.worker.cuda_graph import DecodeGraphRunner, decode_buckets
from tests.core.test_scheduler import _make, _req
from tests.core.test_scheduler_async import _run_async


def _tokens(so: SchedulerOutput) -> ModelOutput:
    return ModelOutput({s.request.request_id: 7 for s in so.scheduled if s.sample})


def _prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 500) for _ in range(n)] for n in lengths]


def _assert_all_free(engine: LLMEngine) -> None:
    kv = engine.scheduler.kv
    assert kv.num_free_blocks == kv.num_total_blocks
    assert not any(kv.pool.ref_counts)


# ----------------------------------------------------------------------------- scheduler


def test_victim_with_its_last_token_in_flight_is_recomputed_to_its_exact_length() -> None:
    sched = _make(budget=64, num_blocks=2, block_size=8)
    b = _req("b", 8, max_tokens=3, ignore_eos=True)  # its first decode needs a second block
    a = _req("a", 7, max_tokens=1, ignore_eos=True)  # its only token is its last
    sched.add_request(b)
    sched.add_request(a)
    so1 = sched.schedule()
    assert [s.request.request_id for s in so1.scheduled] == ["b", "a"]
    sched.advance(so1)
    assert a.num_pending_outputs == 1
    so2 = sched.schedule()  # b needs a block: a (last token in flight) is the victim
    assert so2.preempted_request_ids == ["a"] and a.status == RequestStatus.PREEMPTED
    assert a.num_pending_outputs == 0 and a.num_computed_tokens == 0
    sched.advance(so2)
    outs = sched.update(so1, _tokens(so1))
    assert [o.request_id for o in outs] == ["b"] and a.output_token_ids == []
    in_flight: SchedulerOutput | None = so2
    counts: dict[str, int] = {"b": 1}
    for _ in range(50):
        so = sched.schedule()
        launched = None if so.is_empty else so
        if launched is not None:
            sched.advance(so)
        if in_flight is not None:
            for o in sched.update(in_flight, _tokens(in_flight)):
                counts[o.request_id] = counts.get(o.request_id, 0) + len(o.new_token_ids)
        in_flight = launched
        if in_flight is None and not sched.has_unfinished_requests():
            break
    assert counts == {"b": 3, "a": 1}
    assert a.status == RequestStatus.FINISHED_LENGTH
    assert sched.kv.num_free_blocks == sched.kv.num_total_blocks


def test_a_budget_of_as_few_tokens_as_sequences_keeps_exact_lengths() -> None:
    """A budget of 3 tokens for 3 sequences (fewer tokens than sequences is refused, as by vLLM):
    requests whose last token is in flight hold a slot without a token, prompts wait for the
    budget, and every request still gets its exact length."""
    sched = _make(budget=3, num_blocks=64, block_size=8, max_num_seqs=3)
    want = {}
    for i in range(8):
        want[f"r{i}"] = 2 + i
        sched.add_request(_req(f"r{i}", 1 + i % 3, max_tokens=2 + i, ignore_eos=True))
    assert dict(_run_async(sched)) == want


# ----------------------------------------------------------------------------- engine


@pytest.mark.parametrize(
    "engine_args",
    [
        {"block_size": 8},
        {"block_size": 16, "max_num_batched_tokens": 2, "max_num_seqs": 2},
        {"block_size": 8, "num_kv_blocks": 9},
    ],
    ids=["max-model-len", "tiny-budget", "preemption"],
)
def test_boundaries_match_sync(engine_args: dict[str, Any]) -> None:
    """prompt + max_tokens == max_model_len, max_tokens=1, a stop on the first sampled
    token, and several generate() calls on one LLM (each returns with nothing in flight)."""
    prompts = _prompts(0, (5, 30, 61, 2, 17, 40))
    results = []
    for mode in (False, True):
        llm = LLM(device="cpu", dtype="float32", max_model_len=64, async_scheduling=mode, **engine_args)
        full = [SamplingParams(temperature=0.0, max_tokens=64 - len(p), ignore_eos=True) for p in prompts]
        a = [o.outputs[0].token_ids for o in llm.generate(prompts, full)]
        assert [len(t) for t in a] == [p.max_tokens for p in full]
        b = [
            o.outputs[0].token_ids
            for o in llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1))
        ]
        stop = SamplingParams(temperature=0.0, max_tokens=2, stop_token_ids=tuple(t[0] for t in b))
        c = [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in llm.generate(prompts, stop)]
        assert all(len(ids) == 1 and reason == "stop" for ids, reason in c)
        assert not llm.engine.has_unfinished_requests()  # generate() settled its last step
        _assert_all_free(llm.engine)
        results.append((a, b, c))
    assert results[1] == results[0]


def test_abort_everything_while_in_flight_then_serve_new_requests() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    engine = LLMEngine(build_engine_config(None, device="cpu", dtype="float32", async_scheduling=True))
    for i in range(3):
        engine.add_request(f"old{i}", [1, 5 + i, 9, 11], params)
    for _ in range(3):
        engine.step()
    assert engine._in_flight is not None
    engine.abort_requests([f"old{i}" for i in range(3)])
    assert engine.has_unfinished_requests()  # the step in flight
    assert engine.step() == []  # an empty step with only finished ids, then the in-flight one
    assert not engine.has_unfinished_requests()
    _assert_all_free(engine)
    prompts = _prompts(3, (4, 9, 20))
    got: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        engine.add_request(f"new{i}", p, params)
    while engine.has_unfinished_requests():
        for o in engine.step():
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
    ref = LLM(device="cpu", dtype="float32", async_scheduling=False)
    want = [o.outputs[0].token_ids for o in ref.generate(prompts, params)]
    assert [got[f"new{i}"] for i in range(3)] == want
    _assert_all_free(engine)


def test_pending_tokens_through_the_decode_graph_path_match_sync() -> None:
    """The graph branch on CPU (static buffers, run eagerly): ``_fill_pending`` writes the
    pending ids before ``DecodeGraphRunner.fill`` copies the token rows."""
    prompts = _prompts(7, (3, 12, 25, 1, 8))
    params = [
        SamplingParams(temperature=0.0, max_tokens=6 + 3 * i, ignore_eos=True) for i in range(len(prompts))
    ]
    results = []
    pending_via_graph = 0
    for mode in (False, True):
        llm = LLM(device="cpu", dtype="float32", max_num_seqs=8, async_scheduling=mode)
        runner = llm.engine.runner
        sc = runner.config.scheduler
        graphs = DecodeGraphRunner(
            runner._forward,
            runner.device,
            decode_buckets(sc.max_num_seqs, sc.max_num_batched_tokens),
            runner.max_blocks_per_seq,
            sc.max_model_len,
            use_graphs=False,
        )
        run = graphs.run

        def counting_run(inputs: Any, run: Any = run) -> Any:
            nonlocal pending_via_graph
            pending_via_graph += inputs.num_pending
            return run(inputs)

        graphs.run = counting_run  # type: ignore[method-assign]
        runner.graph_runner = graphs
        results.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
    assert pending_via_graph > 0
    assert results[1] == results[0]


def _random_case(
    seed: int,
) -> tuple[dict[str, Any], list[tuple[str, list[int], SamplingParams]], dict[int, list[str]]]:
    rng = random.Random(seed)
    bs = rng.choice([8, 16])
    base = [1] + [rng.randrange(3, 500) for _ in range(rng.choice([9, 17]))]
    reqs = []
    for i in range(rng.randrange(4, 8)):
        if rng.random() < 0.6:
            prompt = base + [rng.randrange(3, 500) for _ in range(rng.randrange(0, 12))]
        else:
            prompt = [1] + [rng.randrange(3, 500) for _ in range(rng.randrange(0, 30))]
        kw: dict[str, Any] = dict(
            temperature=0.0, max_tokens=rng.randrange(1, 25), ignore_eos=rng.random() < 0.5
        )
        if rng.random() < 0.3:
            kw["stop_token_ids"] = tuple(rng.sample(range(3, 500), 40))
        if rng.random() < 0.25:
            kw["n"] = rng.randrange(2, 4)
        if rng.random() < 0.15:
            kw["repetition_penalty"] = 1.3
        reqs.append((f"q{i}", prompt, SamplingParams(**kw)))
    need = -(-max(len(p) + sp.max_tokens for _, p, sp in reqs) // bs)
    max_num_seqs = rng.choice([3, 4, 8])
    budget = rng.choice([5, 16, 64])
    cfg = dict(
        block_size=bs,
        max_num_seqs=min(max_num_seqs, budget),  # more is refused (as vLLM); the budget stays tiny
        max_num_batched_tokens=budget,
        num_kv_blocks=rng.choice([need, need + 2, 2 * need]),
        enable_prefix_caching=True,
        max_model_len=128,
    )
    aborts: dict[int, list[str]] = {}
    for _ in range(2):
        rid, _, sp = rng.choice(reqs)
        aborts.setdefault(rng.randrange(1, 15), []).extend(c for c, _ in split_n(rid, sp))
    return cfg, reqs, aborts


def _drive(cfg: dict[str, Any], reqs: list, aborts: dict[int, list[str]], mode: bool) -> dict[str, list[int]]:
    engine = LLMEngine(build_engine_config(None, device="cpu", dtype="float32", async_scheduling=mode, **cfg))
    got: dict[str, list[int]] = {}
    finished: set[str] = set()
    for rid, prompt, sp in reqs:
        for cid, cp in split_n(rid, sp):
            engine.add_request(cid, prompt, cp)
            got[cid] = []
    step = 0
    while engine.has_unfinished_requests():
        if step in aborts:
            engine.abort_requests(aborts[step])
        for o in engine.step():
            assert o.request_id not in finished
            got[o.request_id] += o.new_token_ids
            if o.finish_reason is not None:
                finished.add(o.request_id)
        step += 1
        assert step < 2000
    _assert_all_free(engine)
    return {k: v for k, v in got.items() if not any(k in ids for ids in aborts.values())}


@pytest.mark.parametrize("seed", [3, 11, 29])
def test_randomized_async_matches_sync(seed: int) -> None:
    """Preemption, prefix caching with shared prefixes, n > 1, stop ids, penalties and
    aborts: the requests that were not aborted get the same tokens in both modes."""
    cfg, reqs, aborts = _random_case(seed)
    assert _drive(cfg, reqs, aborts, True) == _drive(cfg, reqs, aborts, False)


# ----------------------------------------------------------------------------- engine process


class _StopLoop(Exception):
    pass


class _Engine:
    """An async LLMEngine whose loop a request id "__stop__" ends, counting steps."""

    def __init__(self) -> None:
        self.engine = LLMEngine(build_engine_config(None, device="cpu", async_scheduling=True))
        self.steps = 0

    def add_request(self, request_id: str, *args: Any) -> None:
        if request_id == "__stop__":
            raise _StopLoop
        self.engine.add_request(request_id, *args)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.engine.abort_requests(request_ids)

    def step(self) -> list:
        self.steps += 1
        return self.engine.step()

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests()

    def get_stats(self) -> Any:
        return self.engine.get_stats()


def test_engine_loop_with_async_scheduling_aborts_and_goes_idle() -> None:
    engine = _Engine()
    ctx = zmq.Context()
    api_in, api_out = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    api_in.bind("inproc://review-in")
    api_out.bind("inproc://review-out")
    eng_in, eng_out = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    eng_in.connect("inproc://review-in")
    eng_out.connect("inproc://review-out")
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            _busy_loop(engine, eng_in, eng_out, msgspec.msgpack.Encoder(), os.getppid())
        except _StopLoop:
            pass
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(EngineOutputs)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    try:
        for i in range(4):
            api_in.send(enc.encode(AddRequest(f"r{i}", [1, 5 + i, 9], params)))
        counts: dict[str, int] = {}
        done: set[str] = set()
        deadline = time.monotonic() + 60
        while len(done) < 3 and time.monotonic() < deadline:
            if not api_out.poll(1000):
                continue
            for o in dec.decode(api_out.recv()).outputs:
                assert o.request_id not in done
                counts[o.request_id] = counts.get(o.request_id, 0) + len(o.new_token_ids)
                if o.finish_reason is not None:
                    done.add(o.request_id)
                if o.request_id == "r3" and counts["r3"] == 2:
                    api_in.send(enc.encode(AbortRequest(["r3"])))
        assert {r: counts[r] for r in ("r0", "r1", "r2")} == {"r0": 12, "r1": 12, "r2": 12}
        assert counts["r3"] < 12 and "r3" not in done
        time.sleep(0.3)
        assert not engine.has_unfinished_requests()
        steps = engine.steps
        time.sleep(0.5)
        assert engine.steps == steps  # idle: blocked on the socket
        _assert_all_free(engine.engine)
    finally:
        api_in.send(enc.encode(AddRequest("__stop__", [1], params)))
        thread.join(10)
        for s in (api_in, api_out, eng_in, eng_out):
            s.close(linger=0)
        ctx.term()
    assert not errors
