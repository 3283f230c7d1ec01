"""Logprobs under tensor parallelism on CPU (gloo): TP=2 returns TP=1's logprobs and prompt
logprobs, under chunked prefill (prompt rows from chunks that sample nothing) and
asynchronous scheduling."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from surge import LLM, SamplingParams
from tests.engine.tiny_models import make_tiny_model


def _flatten(entries: list[dict | None] | None) -> list[tuple[int, int, float]]:  # type: ignore[type-arg]
    assert entries is not None
    return [(t, lp.rank, lp.logprob) for e in entries if e is not None for t, lp in e.items()]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_tp2_logprobs_match_tp1(async_scheduling: bool, tmp_path: Path) -> None:
    model_dir = make_tiny_model("qwen3", tmp_path / "qwen3")
    rng = random.Random(9)
    prompts = [[1] + [rng.randrange(3, 512) for _ in range(n)] for n in (30, 5, 21)]
    params = [
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, prompt_logprobs=0),
    ]
    kwargs = dict(device="cpu", dtype="float32", max_num_batched_tokens=16, async_scheduling=async_scheduling)
    want = LLM(model_dir, **kwargs).generate(prompts, params)  # type: ignore[arg-type]
    with LLM(model_dir, tensor_parallel_size=2, **kwargs) as tp2:  # type: ignore[arg-type]
        got = tp2.generate(prompts, params)
    for w, g, p in zip(want, got, params, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        if p.logprobs is not None:
            a, b = _flatten(g.outputs[0].logprobs), _flatten(w.outputs[0].logprobs)
            assert [x[:2] for x in a] == [x[:2] for x in b]
            assert [x[2] for x in a] == pytest.approx([x[2] for x in b], abs=1e-4)
        else:
            assert g.outputs[0].logprobs is None
        if p.prompt_logprobs is not None:
            assert g.prompt_logprobs is not None and len(g.prompt_logprobs) == len(g.prompt_token_ids)
            a, b = _flatten(g.prompt_logprobs), _flatten(w.prompt_logprobs)
            assert [x[:2] for x in a] == [x[:2] for x in b]
            assert [x[2] for x in a] == pytest.approx([x[2] for x in b], abs=1e-4)
        else:
            assert g.prompt_logprobs is None
