"""Grammar-constrained sampling through the offline LLM: with random or tiny models at
temperature 1, the mask alone must make every output valid."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from surge import LLM, SamplingParams
from surge.sampling_params import StructuredOutputsParams

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pet": {"enum": ["cat", "dog", "bird"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["name", "age", "pet", "tags"],
}
REGEX = r"(cat|dog)-[0-9]{2,4}(\.[a-z]{1,3})?"
CHOICES = ["yes", "no", "maybe so", "Zürich"]
SEEDS = range(20)


def _params(so: StructuredOutputsParams, seed: int, max_tokens: int = 160) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens, structured_outputs=so)


def _check_all(llm: LLM, prompt: str, max_tokens: int = 160) -> None:
    so = StructuredOutputsParams(json=SCHEMA)
    for out in llm.generate([prompt] * len(SEEDS), [_params(so, s, max_tokens) for s in SEEDS]):
        o = out.outputs[0]
        assert o.finish_reason == "stop", o
        jsonschema.validate(json.loads(o.text), SCHEMA)
    so = StructuredOutputsParams(regex=REGEX)
    for out in llm.generate([prompt] * len(SEEDS), [_params(so, s) for s in SEEDS]):
        assert re.fullmatch(REGEX, out.outputs[0].text), out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop"
    so = StructuredOutputsParams(choice=CHOICES)
    texts = {out.outputs[0].text for out in llm.generate([prompt] * 20, [_params(so, s) for s in SEEDS])}
    assert texts <= set(CHOICES), texts
    so = StructuredOutputsParams(json_object=True)
    for out in llm.generate([prompt] * 4, [_params(so, s, 200) for s in range(4)]):
        o = out.outputs[0]
        assert o.text.startswith("{")
        if o.finish_reason == "stop":
            assert isinstance(json.loads(o.text), dict)


def test_bundled_model_byte_fallback_vocab() -> None:
    _check_all(LLM(device="cpu"), "Once upon a time")


def test_tiny_random_model(tiny_qwen3_dir: Path) -> None:
    _check_all(LLM(tiny_qwen3_dir, device="cpu"), "Once upon a time")


def test_qwen3_tokenizer_padded_vocab(qwen3_vocab_dir: Path) -> None:
    llm = LLM(qwen3_vocab_dir, device="cpu", load_format="dummy", max_model_len=512)
    _check_all(llm, "Give me a person as JSON:")


def test_ebnf_grammar_and_cut_json_ends_with_length() -> None:
    llm = LLM(device="cpu")
    grammar = 'root ::= "(" item ("," item)* ")"\nitem ::= [a-c] | "[" [0-9] "]"'
    so = StructuredOutputsParams(grammar=grammar)
    for out in llm.generate(["Once"] * 8, [_params(so, s, 40) for s in range(8)]):
        o = out.outputs[0]
        if o.finish_reason == "stop":
            assert re.fullmatch(r"\((?:[a-c]|\[[0-9]\])(?:,(?:[a-c]|\[[0-9]\]))*\)", o.text), o.text
    so = StructuredOutputsParams(json=SCHEMA)
    out = llm.generate("Once", _params(so, 0, max_tokens=5))[0].outputs[0]
    assert out.finish_reason == "length"
    assert len(out.token_ids) == 5
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.text)


def test_n_seeds_penalties_stop_strings_and_greedy() -> None:
    llm = LLM(device="cpu")
    so = StructuredOutputsParams(json=SCHEMA)
    params = SamplingParams(
        n=4,
        temperature=1.0,
        seed=7,
        max_tokens=160,
        repetition_penalty=1.3,
        presence_penalty=0.5,
        structured_outputs=so,
    )
    first = llm.generate("Lily and Tim", params)[0].outputs
    assert len(first) == 4
    for o in first:
        jsonschema.validate(json.loads(o.text), SCHEMA)
    again = llm.generate("Lily and Tim", params)[0].outputs
    assert [o.token_ids for o in again] == [o.token_ids for o in first]  # seeded: reproducible
    greedy = SamplingParams(temperature=0.0, max_tokens=160, structured_outputs=so)
    o = llm.generate("Lily and Tim", greedy)[0].outputs[0]
    jsonschema.validate(json.loads(o.text), SCHEMA)
    stop = SamplingParams(temperature=0.0, max_tokens=160, stop=['"age"'], structured_outputs=so)
    s = llm.generate("Lily and Tim", stop)[0].outputs[0]
    assert s.finish_reason == "stop" and s.stop_reason == '"age"'
    assert o.text.startswith(s.text) and '"age"' not in s.text


def test_invalid_grammar_raises_value_error() -> None:
    llm = LLM(device="cpu")
    with pytest.raises(ValueError, match="regex"):
        llm.generate("Once", SamplingParams(structured_outputs=StructuredOutputsParams(regex="([a-z")))
    with pytest.raises(ValueError, match="json"):
        llm.generate("Once", SamplingParams(structured_outputs=StructuredOutputsParams(json="{bad")))
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["b"])
    # a negative length failed an xgrammar assertion in the engine ("Check failed", a C++ path);
    # a pattern of another type read as picojson's "type mismatch!"
    for schema, message in (
        ({"type": "string", "minLength": -3}, "'minLength' at # must be a non-negative integer"),
        ({"type": "string", "pattern": 5}, "'pattern' at # must be a string"),
    ):
        with pytest.raises(ValueError, match=message) as e:
            llm.generate("Once", SamplingParams(structured_outputs=StructuredOutputsParams(json=schema)))
        assert "Check failed" not in str(e.value) and ".cc" not in str(e.value)
    # the engine still serves afterwards
    assert llm.generate("Once", SamplingParams(max_tokens=3, ignore_eos=True))[0].outputs[0].token_ids


def test_llm_chat_renders_tools_and_forces_a_call() -> None:
    from surge.server.parsers.forced import RequiredToolParser, required_schema

    llm = LLM(device="cpu")
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_time",
                "parameters": {
                    "type": "object",
                    "properties": {"zone": {"enum": ["UTC", "CET"]}},
                    "required": ["zone"],
                },
            },
        }
    ]
    so = StructuredOutputsParams(json=required_schema(tools, parallel=False))
    out = llm.chat(
        [{"role": "user", "content": "Time?"}],
        SamplingParams(max_tokens=60, structured_outputs=so),
        tools=tools,
    )[0]
    assert llm.tokenizer.decode(out.prompt_token_ids, skip_special_tokens=True).startswith("tools: [")
    parser = RequiredToolParser()
    deltas = parser.feed(out.outputs[0].text).extend(parser.finish())
    assert [d.name for d in deltas.tool_calls if d.name] == ["get_time"]
    args = "".join(d.arguments for d in deltas.tool_calls)
    assert json.loads(args)["zone"] in ("UTC", "CET")


def test_vllm_whitespace_options() -> None:
    """vLLM's ``StructuredOutputsParams(disable_any_whitespace=..., whitespace_pattern=...)`` was
    msgspec's "Unexpected keyword argument". ``disable_any_whitespace`` is honoured for JSON
    (True, Surge's default: compact; False: any whitespace between JSON tokens, vLLM's default),
    with a grammar cache entry of its own; ``whitespace_pattern`` (vLLM's outlines option) is
    refused by name."""
    from xgrammar import testing as xgr_testing

    from surge.structured.validate import build_grammar

    schema = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    spaced = '{\n  "a": 1\n}'
    compact = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    loose = StructuredOutputsParams(json=schema, disable_any_whitespace=False)
    assert StructuredOutputsParams(json=schema) == compact and compact.key != loose.key

    def accepts(so: StructuredOutputsParams, text: str) -> bool:
        return bool(xgr_testing._is_grammar_accept_string(build_grammar(so), text))

    assert accepts(compact, '{"a": 1}') and not accepts(compact, spaced)
    assert accepts(loose, '{"a": 1}') and accepts(loose, spaced)
    any_object = StructuredOutputsParams(json_object=True, disable_any_whitespace=False)
    assert accepts(any_object, '{ "b" : [ 1 ] }')
    assert not accepts(StructuredOutputsParams(json_object=True), '{ "b" : [ 1 ] }')
    regex = StructuredOutputsParams(regex="a b", disable_any_whitespace=False)
    assert regex.key == StructuredOutputsParams(regex="a b").key  # no JSON tokens to space

    llm = LLM(device="cpu")
    for out in llm.generate(["Once upon a time"] * 3, [_params(loose, s, 200) for s in range(3)]):
        if out.outputs[0].finish_reason == "stop":
            assert isinstance(json.loads(out.outputs[0].text)["a"], int)
        else:
            assert out.outputs[0].text.lstrip().startswith("{")
    # vLLM's default json_object=None is "not set" (it was refused as not a boolean)
    assert not StructuredOutputsParams(json=schema, json_object=None).json_object  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="disable_any_whitespace must be a boolean, got int 0"):
        StructuredOutputsParams(json=schema, disable_any_whitespace=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"whitespace_pattern is not supported: .*vLLM's outlines"):
        StructuredOutputsParams(json=schema, whitespace_pattern=r"[ ]?")
    # vLLM's disable_additional_properties (was "Unexpected keyword argument"): the grammar's
    # objects are closed either way
    closed = StructuredOutputsParams(json=schema, disable_additional_properties=True)
    assert closed.key == compact.key and not accepts(closed, '{"a": 1, "b": 2}')
    with pytest.raises(ValueError, match="disable_additional_properties must be a boolean"):
        StructuredOutputsParams(json=schema, disable_additional_properties=1)  # type: ignore[arg-type]


def test_length_bounded_strings_are_json_that_strict_parsers_read(qwen3_vocab_dir: Path) -> None:
    """A string with ``maxLength`` (as pydantic's ``Field(max_length=...)`` writes it for the
    openai SDK's ``parse``) is JSON ``json.loads`` reads: xgrammar 0.2.9's own grammar let raw
    control characters into it, and the tiny random Qwen3 wrote tabs there ("Invalid JSON:
    control character (\\u0000-\\u001F) found while parsing a string" from pydantic)."""
    llm = LLM(qwen3_vocab_dir, device="cpu", load_format="dummy", max_model_len=512)
    schema = {
        "type": "object",
        "properties": {f"s{i}": {"type": "string", "minLength": 1, "maxLength": 12} for i in range(4)},
        "required": [f"s{i}" for i in range(4)],
    }
    so = StructuredOutputsParams(json=schema)
    texts = [o.outputs[0].text for o in llm.generate(["A:"] * 16, [_params(so, s, 80) for s in range(16)])]
    for text in texts:
        jsonschema.validate(json.loads(text), schema)  # json.loads is strict: no raw control character
