"""A grammar through the offline ``LLM(..., reasoning_parser="qwen3")`` waits for the output's
first ``</think>``, as vLLM's ``LLM`` does (its structured-output manager reads the prompt with
the reasoning parser's ``is_reasoning_end``): the model thinks freely, then answers in the
constrained format; a prompt that has closed the reasoning (Qwen3's chat prompt with
``enable_thinking`` false) is constrained from its first token. Tiny random Qwen3 with the real
Qwen3 tokenizer (``</think>`` is one token, 151668); ``logit_bias`` on it makes the random model
end its reasoning after a few tokens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from surge import LLM, SamplingParams
from surge.sampling_params import StructuredOutputsParams

END = 151668  # Qwen3's </think>
SCHEMA = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
MESSAGES = [{"role": "user", "content": "Which zone?"}]


@pytest.fixture(scope="module")
def llm(qwen3_vocab_dir: Path) -> Iterator[LLM]:
    with LLM(
        str(qwen3_vocab_dir), load_format="dummy", device="cpu", max_model_len=256, reasoning_parser="qwen3"
    ) as llm:
        yield llm


def _params(**kwargs: object) -> SamplingParams:
    fields: dict[str, object] = {"max_tokens": 60, "temperature": 1.0} | kwargs
    return SamplingParams(structured_outputs=StructuredOutputsParams(json=json.dumps(SCHEMA)), **fields)  # type: ignore[arg-type]


def _answer(llm: LLM, token_ids: list[int]) -> dict[str, object]:
    """The JSON after the first </think>, checked against the schema."""
    answer = json.loads(
        llm.get_tokenizer().decode(token_ids[token_ids.index(END) + 1 :], skip_special_tokens=True)
    )
    jsonschema.validate(answer, SCHEMA)
    return answer


def test_chat_thinks_then_answers_in_the_schema(llm: LLM) -> None:
    """Qwen3's thinking chat prompt leaves the reasoning open: free text up to </think>, then
    JSON (before the fix the grammar masked </think> and the reasoning from the first token)."""
    reasoned = 0
    for seed in range(6):
        (out,) = llm.chat(MESSAGES, _params(seed=seed, logit_bias={END: 3.0}))
        o = out.outputs[0]
        assert o.finish_reason == "stop", o
        ids = list(o.token_ids)
        assert END in ids, o.text  # the grammar let the model end its reasoning
        _answer(llm, ids)
        reasoned += ids.index(END) > 0
    assert reasoned  # some outputs reason before </think>, which the grammar would forbid


def test_a_prompt_that_closed_the_reasoning_is_constrained_at_once(llm: LLM) -> None:
    params = _params(seed=0, logit_bias={END: 3.0})
    (out,) = llm.chat(MESSAGES, params, chat_template_kwargs={"enable_thinking": False})
    assert out.outputs[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)
    ids = llm.get_tokenizer().encode("Question?\n<think>\nhm\n</think>\n\n")
    (out,) = llm.generate([{"prompt_token_ids": ids}], params)
    jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)


def test_a_budget_inside_the_reasoning_ends_it_and_the_grammar_follows(llm: LLM) -> None:
    """The forced </think> of a spent thinking_token_budget opens the grammar (vLLM's order);
    the engine itself still refuses a grammar that would apply from the first token there."""
    ids = llm.get_tokenizer().encode("Question: why?\n<think>")
    params = _params(temperature=0.0, thinking_token_budget=2)
    (out,) = llm.generate([{"prompt_token_ids": ids}], params)
    token_ids = list(out.outputs[0].token_ids)
    assert token_ids[2] == END and out.outputs[0].finish_reason == "stop"
    _answer(llm, token_ids)
    with pytest.raises(ValueError, match="thinking_token_budget cannot be combined with a grammar"):
        llm.engine.add_request("ungated", ids, params)
