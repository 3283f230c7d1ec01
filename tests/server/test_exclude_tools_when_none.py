"""vLLM's ``surge serve --exclude-tools-when-tool-choice-none``: a chat request with
``tool_choice: "none"`` renders its prompt without its tools (by default the chat template
renders them), on every route that renders a chat prompt with tools (chat completions and its
render route, the Messages API and its ``count_tokens``; the Responses API renders none under
``"none"`` with or without it, as vLLM 0.26's); ``auto`` and forced
choices still render them. The flag was refused as unknown. Served: a tiny random Qwen3 with the
real Qwen3 template, which writes the tools into a system block."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server, serve_tiny_qwen3
from tests.server.test_parsers import _tokenizer

MSGS = [{"role": "user", "content": "Hi"}]
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}]


@pytest.fixture(scope="module")
def exclude_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve_tiny_qwen3(
        tmp_path_factory,
        "exclude-tools",
        "--tool-call-parser",
        "hermes",
        "--exclude-tools-when-tool-choice-none",
    )


def _post(srv: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(srv.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_tool_choice_none_renders_no_tools(exclude_server: Server) -> None:
    srv = exclude_server
    tok = _tokenizer()

    def count(tools: list[dict[str, Any]] | None) -> int:
        text = tok.apply_chat_template(MSGS, tools=tools, add_generation_prompt=True, tokenize=False)
        return len(tok.encode(text, add_special_tokens=False))

    bare, with_tools = count(None), count(TOOLS)
    assert with_tools > bare

    none = {"messages": MSGS, "tools": TOOLS, "tool_choice": "none", "max_tokens": 1}
    assert _post(srv, "/v1/chat/completions", none)["usage"]["prompt_tokens"] == bare
    render = _post(srv, "/v1/chat/completions/render", none | {"return_prompt_text": True})
    assert len(render["token_ids"]) == bare and "get_weather" not in render["prompt_text"]
    resp_tools = [{"type": "function", "name": "get_weather", "parameters": PARAMS}]
    resp = _post(
        srv,
        "/v1/responses",
        {"input": "Hi", "tools": resp_tools, "tool_choice": "none", "max_output_tokens": 1},
    )
    assert resp["usage"]["input_tokens"] == bare
    anthropic_tools = [{"name": "get_weather", "input_schema": PARAMS}]
    count = _post(
        srv,
        "/v1/messages/count_tokens",
        {"messages": MSGS, "tools": anthropic_tools, "tool_choice": {"type": "none"}},
    )
    assert count["input_tokens"] == bare
    message = _post(
        srv,
        "/v1/messages",
        {"messages": MSGS, "tools": anthropic_tools, "tool_choice": {"type": "none"}, "max_tokens": 1},
    )
    assert message["usage"]["input_tokens"] == bare

    # other choices still render the tools
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_weather"}}):
        body = none | {"tool_choice": choice}
        assert len(_post(srv, "/v1/chat/completions/render", body)["token_ids"]) == with_tools
    assert _post(srv, "/tokenize", {"messages": MSGS, "tools": TOOLS})["count"] == with_tools
