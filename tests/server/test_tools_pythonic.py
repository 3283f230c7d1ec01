"""``--tool-call-parser pythonic --enable-auto-tool-choice`` over HTTP, as a vLLM user serves Llama
3.2 or Llama 4: a tiny random Llama with the real Llama 3.1 tokenizer (the same vocabulary as 3.2)
whose output a regex forces into a pythonic call list (the weights being random), so that an
``auto`` answer goes through the parser end to end: chat completions streamed and not, with
``parallel_tool_calls: false``, an answer that is no call, and the Responses API."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server, serve_tiny_llama31
from tests.server.test_tools_llama3 import MSGS, _calls, _chat, _streamed

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}
ZONE = {"type": "object", "properties": {"zone": {"type": "string"}}}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
    {"type": "function", "function": {"name": "get_time", "parameters": ZONE}},
]
TWO = "[get_weather(city='Zürich', unit=\"c\"), get_time(zone={'name': 'CET', 'dst': [True, None]})]"
TWO_CALLS = [
    ("get_weather", '{"city": "Zürich", "unit": "c"}'),
    ("get_time", '{"zone": {"name": "CET", "dst": [true, null]}}'),
]


@pytest.fixture(scope="module")
def pythonic_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve_tiny_llama31(
        tmp_path_factory, "pythonic", "--tool-call-parser", "pythonic", "--enable-auto-tool-choice"
    )


def _forced(text: str, **fields: Any) -> dict[str, Any]:
    regex = re.escape(text).replace("\\ ", " ")
    return {
        "tools": TOOLS,
        "tool_choice": "auto",
        "max_tokens": 80,
        "structured_outputs": {"regex": regex},
    } | fields


def test_auto_calls_go_through_the_pythonic_parser(pythonic_server: Server) -> None:
    body = _forced(TWO)
    choice = _chat(pythonic_server, body)
    assert choice["message"]["content"] is None and choice["finish_reason"] == "tool_calls"
    assert _calls(choice) == TWO_CALLS
    ids = [t["id"] for t in choice["message"]["tool_calls"]]
    assert all(t["type"] == "function" for t in choice["message"]["tool_calls"]) and len(set(ids)) == 2
    assert _streamed(pythonic_server, body) == ("", TWO_CALLS, "tool_calls")
    # parallel_tool_calls false: the first call only, streamed and not
    single = body | {"parallel_tool_calls": False}
    assert _calls(_chat(pythonic_server, single)) == TWO_CALLS[:1]
    assert _streamed(pythonic_server, single) == ("", TWO_CALLS[:1], "tool_calls")


def test_text_that_is_not_a_call_list_is_content(pythonic_server: Server) -> None:
    for text in ("[1] Sunny, I think", "[get_weather(city=Paris)]"):
        choice = _chat(pythonic_server, _forced(text))
        assert (
            choice["message"] == {"role": "assistant", "content": text} and choice["finish_reason"] == "stop"
        )
    assert _streamed(pythonic_server, _forced("[1] Sunny, I think")) == ("[1] Sunny, I think", [], "stop")


def test_a_responses_api_answer_has_function_call_items(pythonic_server: Server) -> None:
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    body = _forced(TWO, tools=tools, max_output_tokens=80)
    del body["max_tokens"]
    r = httpx.post(
        pythonic_server.url + "/v1/responses", json={"input": MSGS[0]["content"]} | body, timeout=120
    )
    assert r.status_code == 200, r.text
    items = r.json()["output"]
    assert [(o["type"], o["name"], o["arguments"]) for o in items] == [
        ("function_call", name, args) for name, args in TWO_CALLS
    ]
    assert all(o["call_id"] and o["status"] == "completed" for o in items)
    assert json.loads(items[1]["arguments"]) == {"zone": {"name": "CET", "dst": [True, None]}}
