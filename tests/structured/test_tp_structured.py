"""Grammars under tensor parallelism (CPU, gloo): the engine fills the mask, every rank applies
it, and TP=2 gives the tokens of TP=1."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema

from surge import LLM, SamplingParams
from surge.sampling_params import StructuredOutputsParams
from tests.engine.tiny_models import make_tiny_model
from tests.structured.test_offline_constrained import REGEX, SCHEMA


def test_tp2_constrained_matches_tp1(tmp_path: Path) -> None:
    model_dir = make_tiny_model("qwen3", tmp_path / "qwen3")
    params = [
        SamplingParams(
            temperature=1.0, seed=s, max_tokens=120, structured_outputs=StructuredOutputsParams(json=SCHEMA)
        )
        for s in range(3)
    ]
    params += [
        SamplingParams(
            temperature=1.0, seed=9, max_tokens=40, structured_outputs=StructuredOutputsParams(regex=REGEX)
        ),
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
    ]
    prompts = ["Once upon a time"] * len(params)
    kwargs = dict(device="cpu", dtype="float32", async_scheduling=True, max_num_batched_tokens=16)
    tp1 = [o.outputs[0] for o in LLM(model_dir, **kwargs).generate(prompts, params)]  # type: ignore[arg-type]
    with LLM(model_dir, tensor_parallel_size=2, **kwargs) as llm:  # type: ignore[arg-type]
        tp2 = [o.outputs[0] for o in llm.generate(prompts, params)]
    assert [o.token_ids for o in tp2] == [o.token_ids for o in tp1]
    for o in tp2[:3]:
        jsonschema.validate(json.loads(o.text), SCHEMA)
    assert re.fullmatch(REGEX, tp2[3].text)
