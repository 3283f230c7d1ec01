"""``tool_choice: "required"`` over tools whose parameter schemas use local ``$ref``s (Pydantic's
nested and recursive models): the forced grammar compiles and enforces each tool's schema."""

from __future__ import annotations

import json

import pytest
import xgrammar.testing as xgr_testing
from pydantic import BaseModel

from surge.sampling_params import StructuredOutputsParams
from surge.server.chat_tools import plan_chat
from surge.server.parsers.forced import required_schema
from surge.server.protocol import ChatCompletionRequest
from surge.structured.validate import build_grammar


class Loc(BaseModel):
    city: str


class Args(BaseModel):
    loc: Loc
    days: int


class Tree(BaseModel):
    name: str
    kids: list[Tree] = []


def _tool(name: str, params: dict) -> dict:  # type: ignore[type-arg]
    return {"type": "function", "function": {"name": name, "parameters": params}}


def test_required_calls_with_defs_and_recursion_compile_and_are_enforced() -> None:
    tools = [
        _tool("weather", Args.model_json_schema()),
        _tool("tree", Tree.model_json_schema()),
        _tool("plain", {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}),
    ]
    schema = required_schema(tools)
    # only the tools with references move to $defs; their references follow them
    assert schema["items"]["anyOf"][0]["properties"]["parameters"] == {"$ref": "#/$defs/tool_0"}
    assert schema["$defs"]["tool_0"]["properties"]["loc"]["$ref"] == "#/$defs/tool_0/$defs/Loc"
    assert "tool_2" not in schema["$defs"]
    grammar = build_grammar(StructuredOutputsParams(json=json.dumps(schema)))

    def accepts(calls: list[dict]) -> bool:  # type: ignore[type-arg]
        return bool(xgr_testing._is_grammar_accept_string(grammar, json.dumps(calls)))

    assert accepts([{"name": "weather", "parameters": {"loc": {"city": "Paris"}, "days": 2}}])
    assert accepts([{"name": "tree", "parameters": {"name": "a", "kids": [{"name": "b", "kids": []}]}}])
    assert accepts([{"name": "plain", "parameters": {"x": 1}}])
    assert not accepts([{"name": "weather", "parameters": {"loc": {"town": "Paris"}, "days": 2}}])
    assert not accepts([{"name": "tree", "parameters": {"name": "a", "kids": [{"kids": []}]}}])


def test_ref_keys_inside_instance_values_are_left_alone() -> None:
    params = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A"}, "b": {"const": {"$ref": "#/not/a/schema"}}},
        "required": ["a", "b"],
        "$defs": {"A": {"type": "integer"}},
    }
    schema = required_schema([_tool("f", params)])
    moved = schema["$defs"]["tool_0"]
    assert moved["properties"]["a"]["$ref"] == "#/$defs/tool_0/$defs/A"
    assert moved["properties"]["b"]["const"] == {"$ref": "#/not/a/schema"}


def test_properties_named_like_keywords_are_schemas() -> None:
    """A parameter called ``default``, ``enum``, ``const`` or ``examples`` is a schema like any
    other: its ``$ref`` follows the tool into ``$defs`` (it was left pointing at the array's
    root: a 400, or, for ``#``, the parameter took the array of calls' schema)."""
    params = {
        "type": "object",
        "properties": {
            "default": {"$ref": "#/$defs/Mode"},
            "enum": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
            "$ref": {"type": "string", "maxLength": 3},
        },
        "required": ["default", "enum", "$ref"],
        "$defs": {"Mode": {"enum": ["fast", "slow"]}},
    }
    schema = required_schema([_tool("f", params)])
    moved = schema["$defs"]["tool_0"]
    assert moved["properties"]["default"] == {"$ref": "#/$defs/tool_0/$defs/Mode"}
    assert moved["properties"]["enum"]["anyOf"][0] == {"$ref": "#/$defs/tool_0"}
    assert moved["properties"]["$ref"] == params["properties"]["$ref"]
    grammar = build_grammar(StructuredOutputsParams(json=json.dumps(schema)))

    def accepts(args: dict) -> bool:  # type: ignore[type-arg]
        return bool(
            xgr_testing._is_grammar_accept_string(grammar, json.dumps([{"name": "f", "parameters": args}]))
        )

    inner = {"default": "slow", "enum": None, "$ref": "b"}
    assert accepts({"default": "fast", "enum": inner, "$ref": "a"})
    assert not accepts({"default": "fast", "enum": [{"name": "f", "parameters": inner}], "$ref": "a"})
    assert not accepts({"default": "medium", "enum": None, "$ref": "a"})


@pytest.mark.parametrize(
    "params",
    [
        {"description": "no arguments described"},
        {"title": "Args"},
        {"properties": {"x": {"type": "integer"}}},
    ],
)
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "f"}}])
def test_parameters_without_a_type_still_force_an_object(params: dict, tool_choice: object) -> None:  # type: ignore[type-arg]
    """The tools' check takes a ``parameters`` schema without ``type`` as an object schema; the
    forced grammar must too: ``{"description": ...}`` alone let a named call's arguments be a
    JSON string or a number (a call no client can pass as keyword arguments)."""
    body = ChatCompletionRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "x"}],
            "tools": [_tool("f", params)],
            "tool_choice": tool_choice,
        }
    )
    plan = plan_chat(body, None, None, None)
    assert plan.structured_outputs is not None and plan.structured_outputs.json is not None
    grammar = build_grammar(plan.structured_outputs)

    def accepts(arguments: str) -> bool:
        text = arguments if tool_choice != "required" else f'[{{"name": "f", "parameters": {arguments}}}]'
        return bool(xgr_testing._is_grammar_accept_string(grammar, text))

    assert accepts('{"x": 1}')
    for other in ('"abc"', "1", "[1]", "null", "true"):
        assert not accepts(other), other
