"""``tool_choice: "required"`` over tools whose parameter schemas use local ``$ref``s (Pydantic's
nested and recursive models): the forced grammar compiles and enforces each tool's schema."""

from __future__ import annotations

import json

import xgrammar.testing as xgr_testing
from pydantic import BaseModel

from surge.sampling_params import StructuredOutputsParams
from surge.server.parsers.forced import required_schema
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
