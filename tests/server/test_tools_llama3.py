"""Llama 3.1 over HTTP as a vLLM user serves it (``--tool-call-parser llama3_json
--enable-auto-tool-choice``): a tiny random Llama with the real Llama 3.1 tokenizer (the shared
folder's tiktoken ``tokenizer.model``, which transformers reads only with ``tiktoken``, a test
extra) and chat template. The prompt starts with ``<|begin_of_text|>`` once; tools, assistant
tool calls and tool results render as transformers renders them; an ``auto`` call (its text
forced by a regex, the weights being random) goes through the ``llama3_json`` parser, streamed
and not alike; forced calls, ``none`` and every EOS id of ``generation_config.json`` work."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import LLAMA31, Server, serve_tiny_llama31

BOS, EOM, PYTHON_TAG = 128000, 128008, 128010
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
MSGS: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
HISTORY: list[Any] = [
    {"role": "system", "content": "Be brief."},
    *MSGS,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve_tiny_llama31(
        tmp_path_factory, "llama3-json", "--tool-call-parser", "llama3_json", "--enable-auto-tool-choice"
    )


def _chat(srv: Server, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(
        srv.url + "/v1/chat/completions", json={"messages": MSGS, "temperature": 0} | body, timeout=120
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _streamed(srv: Server, body: dict[str, Any]) -> tuple[str, list[tuple[str, str]], str]:
    """(content, [(name, arguments)], finish_reason) joined from a streamed answer."""
    body = {"messages": MSGS, "temperature": 0, "stream": True} | body
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    content, calls, finish = "", {}, ""
    for event in r.text.strip().split("\n\n"):
        if event.startswith(":") or event == "data: [DONE]":
            continue
        for c in json.loads(event.removeprefix("data: "))["choices"]:
            finish = c["finish_reason"] or finish
            content += c["delta"].get("content") or ""
            for t in c["delta"].get("tool_calls") or []:
                call = calls.setdefault(t["index"], ["", ""])
                call[0] += t.get("function", {}).get("name") or ""
                call[1] += t.get("function", {}).get("arguments") or ""
    return content, [(n, a) for n, a in calls.values()], finish


def _calls(choice: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (t["function"]["name"], t["function"]["arguments"]) for t in choice["message"].get("tool_calls") or []
    ]


def test_the_prompt_renders_as_transformers_renders_it_with_one_bos(llama_server: Server) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(LLAMA31)
    as_object = json.loads(json.dumps(HISTORY))  # transformers' template wants the arguments as an object
    as_object[2]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    for messages, tools in ((MSGS, None), (MSGS, TOOLS), (HISTORY, TOOLS)):
        body: dict[str, Any] = {"messages": messages} | ({"tools": tools} if tools else {})
        ids = httpx.post(llama_server.url + "/tokenize", json=body, timeout=60).json()["tokens"]
        ref = tok.apply_chat_template(
            as_object if messages is HISTORY else messages,
            tools=tools,
            add_generation_prompt=True,
            tokenize=False,
        )
        assert ids == tok(ref, add_special_tokens=False).input_ids
        assert ids[0] == BOS and ids.count(BOS) == 1
    text = tok.decode(ids)
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>' in text
    assert text.endswith(
        '<|start_header_id|>ipython<|end_header_id|>\n\n"sunny"<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # the conversation goes on after the tool's result
    choice = _chat(llama_server, {"messages": HISTORY, "tools": TOOLS, "max_tokens": 3})
    assert choice["finish_reason"] == "length" and choice["message"]["content"]


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', [("get_weather", '{"city": "Paris"}')]),
        (
            '\n{"name": "get_weather", "arguments": {"city": "Paris"}}; '
            '{"name": "get_weather", "parameters": {"city": "Zürich"}}',
            [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Zürich"}')],
        ),
    ],
)
def test_auto_calls_go_through_the_llama3_json_parser(
    llama_server: Server, text: str, calls: list[tuple[str, str]]
) -> None:
    regex = re.escape(text).replace("\\ ", " ")
    body = {"tools": TOOLS, "tool_choice": "auto", "max_tokens": 80, "structured_outputs": {"regex": regex}}
    choice = _chat(llama_server, body)
    assert choice["message"]["content"] is None and choice["finish_reason"] == "tool_calls"
    assert _calls(choice) == calls
    assert all(t["id"] and t["type"] == "function" for t in choice["message"]["tool_calls"])
    assert _streamed(llama_server, body) == ("", calls, "tool_calls")


def test_text_that_is_not_a_call_is_content(llama_server: Server) -> None:
    body = {"tools": TOOLS, "max_tokens": 40, "structured_outputs": {"regex": "Sunny, I think"}}
    choice = _chat(llama_server, body)
    assert choice["message"] == {"role": "assistant", "content": "Sunny, I think"}
    assert _streamed(llama_server, body) == ("Sunny, I think", [], "stop")


def test_forced_calls_and_none(llama_server: Server) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    choice = _chat(llama_server, {"tools": TOOLS, "tool_choice": named, "max_tokens": 8})
    ((name, args),) = _calls(choice)
    assert name == "get_weather" and args.startswith('{"') and choice["message"]["content"] == ""
    assert _streamed(llama_server, {"tools": TOOLS, "tool_choice": named, "max_tokens": 8})[1] == [
        (name, args)
    ]
    # "required": a grammar-forced array; cut by max_tokens here (random weights never close it)
    content, streamed_calls, finish = _streamed(
        llama_server, {"tools": TOOLS, "tool_choice": "required", "max_tokens": 30}
    )
    assert finish == "length" and [n for n, _ in streamed_calls] == ["get_weather"] and not content
    none = _chat(llama_server, {"tools": TOOLS, "tool_choice": "none", "max_tokens": 5})
    assert "tool_calls" not in none["message"] and none["message"]["content"]


@pytest.mark.parametrize("eos", [128001, EOM, 128009])
def test_every_eos_id_of_the_generation_config_stops(llama_server: Server, eos: int) -> None:
    """Each stops; as in vLLM, the tokenizer's EOS (<|eot_id|>, 128009) reports stop_reason null
    and the generation_config's others (which vLLM adds to stop_token_ids) their id."""
    choice = _chat(llama_server, {"max_tokens": 5, "logit_bias": {str(eos): 100}})
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == (None if eos == 128009 else eos)
    assert choice["message"]["content"] == ""


def test_python_tag_is_special(llama_server: Server) -> None:
    """``<|python_tag|>`` is skipped from the text as vLLM skips it; kept, it is no call."""
    body = {"tools": TOOLS, "max_tokens": 2, "logit_bias": {str(PYTHON_TAG): 100}}
    assert _chat(llama_server, body)["message"]["content"] == ""
    kept = _chat(llama_server, body | {"skip_special_tokens": False})
    assert kept["message"]["content"] == "<|python_tag|>" * 2 and "tool_calls" not in kept["message"]
