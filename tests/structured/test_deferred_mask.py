"""The overlapped grammar mask: with asynchronous scheduling a constrained step's mask waits
for the previous step's ids inside the sampler (after the forward is launched) instead of the
engine applying that step before scheduling the next; the batched fill packs only the
constrained rows. Both must give exactly the tokens of the old sequential path."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from surge import SamplingParams
from surge.engine.llm_engine import LLMEngine, build_engine_config
from surge.request import Request
from surge.sampling_params import StructuredOutputsParams
from surge.structured import manager as manager_module
from surge.structured.manager import RequestGrammar, StructuredOutputManager
from surge.worker.model_runner import StepHandle
from tests.conftest import STORIES
from tests.structured.test_offline_constrained import CHOICES, REGEX, SCHEMA

NUM_CONSTRAINED = 10  # over BATCH_FILL_MIN_ROWS: the batched fill


def _requests() -> list[tuple[str, list[int], SamplingParams]]:
    """Unseeded temperature-1 constrained requests (drawn from the engine's generator, so the
    old path applied none of their steps early) and two free ones, all ``ignore_eos``."""
    kinds = [
        StructuredOutputsParams(json=SCHEMA),
        StructuredOutputsParams(regex=REGEX),
        StructuredOutputsParams(choice=CHOICES),
        StructuredOutputsParams(json_object=True),
    ]
    out = []
    for i in range(NUM_CONSTRAINED):
        so = kinds[i % len(kinds)]
        params = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True, structured_outputs=so)
        out.append((f"c{i}", [1, 5 + i, 40 + 3 * i, 7], params))
    for i in range(2):
        params = SamplingParams(temperature=1.0, top_k=30, max_tokens=40, ignore_eos=True)
        out.append((f"f{i}", [1, 9, 90 + i], params))
    return out


def _generate(
    async_scheduling: bool, defer: bool = True, model: str | Path = STORIES
) -> dict[str, list[int]]:
    config = build_engine_config(str(model), device="cpu", seed=3, async_scheduling=async_scheduling)
    engine = LLMEngine(config)
    assert engine.async_scheduling is async_scheduling
    engine._defer_grammar = defer  # False: the old path, a constrained step applied before the next
    for rid, prompt, params in _requests():
        engine.add_request(rid, prompt, params)
    structured = engine._structured
    assert structured is not None
    deadline = time.monotonic() + 120
    while any(not f.done() for _, f in structured.waiting.values()):  # all join in one step
        assert time.monotonic() < deadline
        structured.wait(0.1)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def test_overlapped_and_batched_paths_give_the_sequential_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    sequential = _generate(async_scheduling=False)
    assert len(sequential) == NUM_CONSTRAINED + 2
    assert all(len(t) == 40 for t in sequential.values())
    old_async = _generate(async_scheduling=True, defer=False)
    waits: list[int] = []
    original = StepHandle.sampled_token_ids

    def counting(self: StepHandle) -> dict[str, int]:
        waits.append(1)
        return original(self)

    monkeypatch.setattr(StepHandle, "sampled_token_ids", counting)
    overlapped = _generate(async_scheduling=True)
    assert len(waits) >= 30  # the masks did take their previous tokens from the step in flight
    monkeypatch.setattr(manager_module, "BATCH_FILL_MIN_ROWS", 10**6)  # one fill call per row
    per_row = _generate(async_scheduling=True)
    assert old_async == sequential
    assert overlapped == sequential
    assert per_row == sequential


def test_overlapped_masks_keep_outputs_valid() -> None:
    from surge import LLM

    llm = LLM(STORIES, device="cpu", async_scheduling=True, seed=1)
    assert llm.engine._defer_grammar
    so = StructuredOutputsParams(json=SCHEMA)
    params = [SamplingParams(temperature=1.0, max_tokens=160, structured_outputs=so)] * 20
    for out in llm.generate(["Once upon a time"] * 20, params):
        assert out.outputs[0].finish_reason == "stop"
        jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)
    so = StructuredOutputsParams(regex=REGEX)
    params = [SamplingParams(temperature=1.0, max_tokens=60, structured_outputs=so)] * 20
    for out in llm.generate(["Once upon a time"] * 20, params):
        assert re.fullmatch(REGEX, out.outputs[0].text), out.outputs[0].text


def _mask_of(manager: StructuredOutputManager, request: Request, grammar: RequestGrammar) -> Any:
    n = manager.fill([request], {request.request_id: grammar})
    mask, rows = manager.buffer.filled_views(n)
    return mask.clone(), rows.clone()


def test_matcher_ahead_of_outputs_is_checked_when_its_token_lands() -> None:
    manager = StructuredOutputManager(str(STORIES), 512, (2,), "cpu")
    params = SamplingParams(
        max_tokens=50, structured_outputs=StructuredOutputsParams(choice=["ab", "ba", "bb"])
    )
    compiled = manager.cache.submit(params.structured_outputs).result()  # type: ignore[arg-type]
    from surge.tokenizer import load_tokenizer

    tok = load_tokenizer(str(STORIES))
    a, b = (tok.encode(c, add_special_tokens=False)[-1] for c in ("a", "b"))

    def fresh(outputs: list[int]) -> Any:
        r = Request("x", [1], params, frozenset({2}))
        r.output_token_ids = list(outputs)
        return _mask_of(manager, r, RequestGrammar(compiled, None, (2,)))

    r = Request("x", [1], params, frozenset({2}))
    g = RequestGrammar(compiled, None, (2,))
    r.num_pending_outputs = 1
    manager.fill([r], {"x": g}, lambda: {"x": a})  # "a" pending: fed ahead of the outputs
    assert g.num_seen == 1
    r.num_pending_outputs = 0
    r.output_token_ids = [b]  # a different token landed (the pending one was dropped)
    got = _mask_of(manager, r, g)
    want = fresh([b])
    assert all(x.equal(y) for x, y in zip(got, want, strict=True))
    r.num_pending_outputs = 1
    with pytest.raises(RuntimeError, match="pending"):
        manager.fill([r], {"x": g}, None)
