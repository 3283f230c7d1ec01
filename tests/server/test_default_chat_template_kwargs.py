"""vLLM's ``surge serve --default-chat-template-kwargs JSON``: chat template variables every chat
request gets under its own ``chat_template_kwargs`` and ``reasoning_effort`` (which win, as vLLM's
``ChatParams.with_defaults``), on every route that renders a chat prompt (chat completions and its
batch and render routes, the Responses and Messages APIs, ``/tokenize``) and in the reasoning
parser's plan. The flag was refused as unknown. Served: a tiny random Qwen3 with the real Qwen3
template, whose ``enable_thinking: false`` closes an empty think block in the prompt."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from surge.server.chat_tools import plan_chat
from surge.server.protocol import ChatCompletionRequest
from tests.server.conftest import Server, serve_tiny_qwen3
from tests.server.test_cli import _serve
from tests.server.test_parsers import _tokenizer

MSGS = [{"role": "user", "content": "Hi"}]
NO_THINK_TAIL = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def defaults_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve_tiny_qwen3(
        tmp_path_factory,
        "template-defaults",
        "--reasoning-parser",
        "qwen3",
        "--default-chat-template-kwargs",
        '{"enable_thinking": false}',
    )


def _post(srv: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(srv.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _prompt_tokens(srv: Server, body: dict[str, Any]) -> int:
    answer = _post(srv, "/v1/chat/completions", {"messages": MSGS, "max_tokens": 1} | body)
    return answer["usage"]["prompt_tokens"]


def test_every_chat_route_renders_with_the_default(defaults_server: Server) -> None:
    srv = defaults_server
    tok = _tokenizer()
    rendered = tok.apply_chat_template(MSGS, add_generation_prompt=True, tokenize=False)
    thinking = len(tok.encode(rendered, add_special_tokens=False))
    not_thinking = len(tok.encode(rendered + NO_THINK_TAIL, add_special_tokens=False))
    assert not_thinking > thinking

    assert _post(srv, "/tokenize", {"messages": MSGS})["count"] == not_thinking
    assert _prompt_tokens(srv, {}) == not_thinking
    render = _post(srv, "/v1/chat/completions/render", {"messages": MSGS})
    assert len(render["token_ids"]) == not_thinking
    batch = _post(srv, "/v1/chat/completions/batch", {"messages": [MSGS, MSGS], "max_tokens": 1})
    assert batch["usage"]["prompt_tokens"] == 2 * not_thinking
    resp = _post(srv, "/v1/responses", {"input": "Hi", "max_output_tokens": 1})
    assert resp["usage"]["input_tokens"] == not_thinking
    count = _post(srv, "/v1/messages/count_tokens", {"messages": MSGS, "max_tokens": 1})
    assert count["input_tokens"] == not_thinking

    # the request's own variables win: its chat_template_kwargs, and reasoning_effort's switch
    on = {"chat_template_kwargs": {"enable_thinking": True}}
    assert _post(srv, "/tokenize", {"messages": MSGS} | on)["count"] == thinking
    assert _prompt_tokens(srv, on) == thinking
    assert _prompt_tokens(srv, {"reasoning_effort": "high"}) == thinking
    resp = _post(
        srv, "/v1/responses", {"input": "Hi", "max_output_tokens": 1, "reasoning": {"effort": "low"}}
    )
    assert resp["usage"]["input_tokens"] == thinking


def test_the_reasoning_parser_follows_the_default() -> None:
    """With thinking off by default the plan has no reasoning parser (the answer is content), as
    a request that turns it off itself; a request that turns it on gets the parser back."""
    tok = _tokenizer()

    def plan(defaults: dict[str, Any] | None, **fields: Any) -> Any:
        body = ChatCompletionRequest.model_validate({"messages": MSGS, **fields})
        body.use_template_defaults(defaults)
        return plan_chat(body, tok, None, "qwen3")

    off = {"enable_thinking": False}
    assert plan(None).reasoning
    assert plan(off).reasoning is False
    assert plan(off, chat_template_kwargs={"enable_thinking": True}).reasoning
    assert plan(off, reasoning_effort="medium").reasoning
    assert plan({"enable_thinking": True}, reasoning_effort="none").reasoning is False


@pytest.mark.parametrize(
    ("value", "word"),
    [
        ('{"enable_thinking": false', "not JSON"),
        ('["enable_thinking"]', "must be a JSON object"),
        ('{"messages": []}', "must not set messages"),
    ],
)
def test_a_bad_value_is_one_line(value: str, word: str) -> None:
    r = _serve("--default-chat-template-kwargs", value)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--default-chat-template-kwargs" in lines[0] and word in lines[0], r.stderr
