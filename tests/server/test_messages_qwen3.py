"""``POST /v1/messages`` with ``--reasoning-parser qwen3 --tool-call-parser hermes`` on a tiny
random Qwen3 with the real Qwen3 tokenizer and chat template: forced tool calls (``tool_choice``
``tool`` or ``any``, grammar-driven, so random weights write valid input) as ``tool_use`` blocks
with ``stop_reason: tool_use``, their round trip (``tool_use`` and ``tool_result`` blocks in the
history), and ``thinking`` as Qwen3's ``enable_thinking`` with the reasoning as a ``thinking``
block; streamed the same (the events parsed as in test_messages_api)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest

from tests.server.conftest import Server, serve_tiny_qwen3
from tests.server.test_messages_api import _assembled, _same

TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
TOOLS = [
    {"name": "get_time", "description": "The time.", "input_schema": TIME},
    {"name": "noop", "input_schema": {"type": "object", "properties": {}}},
]
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "get_time", "description": "The time.", "parameters": TIME}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]
USER = {"role": "user", "content": "What time is it?"}
OFF = {"type": "disabled"}  # Qwen3's enable_thinking false: the grammar applies from the first token


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve_tiny_qwen3(
        tmp_path_factory,
        "messages",
        "--tool-call-parser",
        "hermes",
        "--enable-auto-tool-choice",
        "--reasoning-parser",
        "qwen3",
    )


def _post(srv: Server, body: dict[str, Any], path: str = "/v1/messages") -> dict[str, Any]:
    r = httpx.post(srv.url + path, json={"messages": [USER], "temperature": 0} | body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _stream(srv: Server, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(
        srv.url + "/v1/messages",
        json={"messages": [USER], "temperature": 0, "stream": True} | body,
        timeout=120,
    )
    assert r.status_code == 200, r.text
    events = []
    for raw in r.text.strip().split("\n\n"):
        lines = [line for line in raw.split("\n") if not line.startswith(":")]
        if lines:
            events.append((lines[0].removeprefix("event: "), json.loads(lines[1].removeprefix("data: "))))
    return _assembled(events)


@pytest.mark.parametrize(
    "choice",
    [{"type": "tool", "name": "get_time"}, {"type": "any", "disable_parallel_tool_use": True}],
)
def test_forced_tool_use_and_its_round_trip(srv: Server, choice: dict[str, Any]) -> None:
    body = {"tools": TOOLS, "tool_choice": choice, "thinking": OFF, "max_tokens": 60}
    m = _post(srv, body)
    assert m["stop_reason"] == "tool_use" and m["stop_sequence"] is None, m
    [use] = m["content"]
    assert use["type"] == "tool_use" and isinstance(use["input"], dict) and use["id"]
    if choice["type"] == "tool":
        assert use["name"] == "get_time"
        jsonschema.validate(use["input"], TIME)
    _same(_stream(srv, body), m)

    # the round trip: the call and its result in the history render as the chat messages do
    history = [
        USER,
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "12:00"}]},
    ]
    again = {"messages": history, "tools": TOOLS, "tool_choice": {"type": "none"}, "thinking": OFF}
    answer = _post(srv, again | {"max_tokens": 3})
    assert answer["stop_reason"] == "max_tokens"
    counted = _post(srv, again, "/v1/messages/count_tokens")
    call = {
        "id": use["id"],
        "type": "function",
        "function": {"name": use["name"], "arguments": json.dumps(use["input"])},
    }
    chat = [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": use["id"], "content": "12:00"},
    ]
    tokenized = httpx.post(
        srv.url + "/tokenize",
        json={"messages": chat, "tools": CHAT_TOOLS, "chat_template_kwargs": {"enable_thinking": False}},
        timeout=60,
    ).json()
    assert (
        counted == {"input_tokens": tokenized["count"]} == {"input_tokens": answer["usage"]["input_tokens"]}
    )


def test_a_tool_call_cut_by_max_tokens_is_no_tool_use(srv: Server) -> None:
    """A forced call that ``max_tokens`` cuts is its ``tool_use`` block with ``input`` ``{}`` (the
    arguments so far are no JSON object) and ``stop_reason: max_tokens``; streamed the same."""
    body = {
        "tools": TOOLS,
        "tool_choice": {"type": "tool", "name": "get_time"},
        "thinking": OFF,
        "max_tokens": 3,
    }
    m = _post(srv, body)
    assert m["stop_reason"] == "max_tokens" and m["usage"]["output_tokens"] == 3
    [use] = m["content"]
    assert use["type"] == "tool_use" and use["name"] == "get_time" and use["input"] == {}
    _same(_stream(srv, body), m)


def test_thinking_switches_qwen3_reasoning(srv: Server) -> None:
    """``thinking`` enabled (or left out: the template's default) renders Qwen3's thinking prompt,
    disabled its empty think block (more prompt tokens; the parser is off and the output is
    text). A prefill that opens ``<think>`` is continued inside the reasoning: the output (a
    random model writes no ``</think>``) is one ``thinking`` block with a signature."""
    on = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    count = {
        name: _post(srv, t, "/v1/messages/count_tokens")["input_tokens"]
        for name, t in (("on", on), ("default", {}), ("off", {"thinking": OFF}))
    }
    assert count["on"] == count["default"] < count["off"]
    off = _post(srv, {"thinking": OFF, "max_tokens": 5})
    assert [b["type"] for b in off["content"]] == ["text"] and off["usage"]["input_tokens"] == count["off"]
    _same(_stream(srv, {"thinking": OFF, "max_tokens": 5}), off)

    body = on | {"messages": [USER, {"role": "assistant", "content": "<think>\n"}], "max_tokens": 5}
    m = _post(srv, body)
    [block] = m["content"]
    assert block["type"] == "thinking" and block["thinking"] and block["signature"]
    assert m["stop_reason"] == "max_tokens" and m["usage"]["output_tokens"] == 5
    _same(_stream(srv, body), m)
    # display "omitted": the block without its text, the signature kept, streamed the same
    hidden = body | {"thinking": on["thinking"] | {"display": "omitted"}}
    m = _post(srv, hidden)
    assert [(b["type"], b["thinking"]) for b in m["content"]] == [("thinking", "")] and m["content"][0][
        "signature"
    ]
    assert m["usage"]["output_tokens"] == 5
    _same(_stream(srv, hidden), m)


def test_thinking_budget_tokens_caps_the_reasoning(srv: Server) -> None:
    """On a server with a reasoning parser, ``thinking.budget_tokens`` is vLLM's
    thinking_token_budget: once spent (the prefill's newline after ``<think>`` counts, as in
    vLLM), ``</think>`` is forced and the rest is the answer, streamed the same; a large budget
    leaves the reasoning to run to max_tokens."""
    prefill = {"messages": [USER, {"role": "assistant", "content": "<think>\n"}], "max_tokens": 12}
    capped = prefill | {"thinking": {"type": "enabled", "budget_tokens": 3}}
    m = _post(srv, capped)
    # the random model's reasoning here is newlines, which the qwen3 parser trims away (as
    # vLLM's): the forced end shows as an answer, which an uncapped reasoning never reaches
    assert [b["type"] for b in m["content"]][-1] == "text", m
    assert m["stop_reason"] == "max_tokens" and m["usage"]["output_tokens"] == 12
    _same(_stream(srv, capped), m)
    free = _post(srv, prefill | {"thinking": {"type": "enabled", "budget_tokens": 1024}})
    assert [b["type"] for b in free["content"]] == ["thinking"]
