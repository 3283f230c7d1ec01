"""A request id taken again once its request finished gets its own sampling settings: the
runner's per-composition sampling tensors (keyed by the batch's request ids) are rebuilt."""

from __future__ import annotations

from surge.engine.llm_engine import LLMEngine, build_engine_config
from surge.sampling_params import SamplingParams


def _run(engine: LLMEngine, request_id: str, params: SamplingParams) -> list:
    engine.add_request(request_id, [1, 403, 407, 261], params)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == request_id]
    return outs


def test_a_reused_id_gets_its_own_logprobs_width() -> None:
    engine = LLMEngine(build_engine_config(None, device="cpu", async_scheduling=False))
    first = _run(engine, "r", SamplingParams(temperature=0.0, max_tokens=3, logprobs=1))
    assert [len(o.logprobs.token_ids[0]) for o in first] == [2, 2, 2]  # the token, then its top 1
    again = _run(engine, "r", SamplingParams(temperature=0.0, max_tokens=3, logprobs=4))
    assert [len(o.logprobs.token_ids[0]) for o in again] == [5, 5, 5]
    assert [o.new_token_ids for o in again] == [o.new_token_ids for o in first]


def test_a_reused_id_gets_its_own_temperature() -> None:
    """A greedy request, then a sampled one under the same id: the second samples (it was
    served the first one's argmax)."""
    engine = LLMEngine(build_engine_config(None, device="cpu", async_scheduling=False))
    greedy = [
        t for o in _run(engine, "r", SamplingParams(temperature=0.0, max_tokens=24)) for t in o.new_token_ids
    ]
    fresh = LLMEngine(build_engine_config(None, device="cpu", async_scheduling=False))
    hot = SamplingParams(temperature=2.0, seed=3, max_tokens=24, ignore_eos=True)
    expected = [t for o in _run(fresh, "x", hot) for t in o.new_token_ids]
    assert expected != greedy
    got = [t for o in _run(engine, "r", hot) for t in o.new_token_ids]
    assert got == expected
