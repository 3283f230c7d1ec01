"""``thinking_token_budget`` and ``logprob_token_ids`` on a CUDA device (written in session 39,
which had no GPU: the sampler's on-device overwrite of the forced ``</think>`` and the listed-id
gather are tested on CPU only otherwise). A tiny random Qwen3 with the real Qwen3 tokenizer runs
the same five requests synchronously eager, synchronously under CUDA graphs and asynchronously
under CUDA graphs: ``</think>`` must stand at each budget, greedy outputs must agree across the
modes, and the listed ids' logprobs must be there and agree. Skipped without CUDA."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from surge import LLM, SamplingParams
from tests.conftest import requires_qwen3_8b
from tests.structured.conftest import make_qwen3_vocab_model

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    requires_qwen3_8b,
]

THINK, END = 151667, 151668
BUDGETS = [0, 3, 7, None, 5]
MODES = {
    "sync-eager": {"async_scheduling": False, "enforce_eager": True},
    "sync-graphs": {"async_scheduling": False, "enforce_eager": False},
    "async-graphs": {"async_scheduling": True, "enforce_eager": False},
}


def _params() -> list[SamplingParams]:
    greedy = {"max_tokens": 24, "temperature": 0.0, "ignore_eos": True}
    return [
        SamplingParams(**greedy, thinking_token_budget=0),
        SamplingParams(**greedy, thinking_token_budget=3, logprob_token_ids=[END, THINK, 11]),
        SamplingParams(**greedy, thinking_token_budget=7, logprobs=2),
        SamplingParams(**greedy),
        # unseeded sampling: the CUDA window sampler, on the fast asynchronous path
        SamplingParams(max_tokens=24, temperature=0.8, top_k=20, ignore_eos=True, thinking_token_budget=5),
    ]


def test_forced_end_and_listed_logprobs_agree_across_modes(tmp_path: Path) -> None:
    model = make_qwen3_vocab_model(tmp_path)
    results = {}
    for name, kwargs in MODES.items():
        llm = LLM(
            str(model),
            load_format="dummy",
            device="cuda",
            dtype="float32",
            max_model_len=256,
            max_num_seqs=8,
            reasoning_parser="qwen3",
            seed=0,
            **kwargs,  # type: ignore[arg-type]
        )
        prompt = {"prompt_token_ids": llm.get_tokenizer().encode("Question: why?\n<think>")}
        outs = llm.generate([prompt] * len(BUDGETS), _params())
        for out, budget in zip(outs, BUDGETS, strict=True):
            ids = list(out.outputs[0].token_ids)
            if budget is not None:
                assert ids[budget] == END, (name, budget, ids)
        rows = outs[1].outputs[0].logprobs
        assert rows is not None and all(set(row) >= {END, THINK, 11} for row in rows), name
        results[name] = outs
        llm.close()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    base = results["sync-eager"]
    for name, outs in results.items():
        for i in range(4):  # the greedy ones
            assert list(outs[i].outputs[0].token_ids) == list(base[i].outputs[0].token_ids), (name, i)
        got, ref = outs[1].outputs[0].logprobs, base[1].outputs[0].logprobs
        assert got is not None and ref is not None
        for a, b in zip(got, ref, strict=True):
            for t in (END, THINK, 11):
                assert abs(a[t].logprob - b[t].logprob) < 1e-3, (name, t)
