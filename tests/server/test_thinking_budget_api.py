"""vLLM's ``thinking_token_budget`` over HTTP, with ``--reasoning-parser qwen3`` on a tiny random
Qwen3 with the real Qwen3 tokenizer (``--load-format dummy``). A prompt that opens ``<think>``
(a raw completions prompt, or a chat template that ends with ``<think>\\n`` as DeepSeek-R1's and
Qwen3's thinking templates do) puts the output inside the reasoning; a spent budget forces
``</think>`` (151668) as the next token: the token ids say where, the chat message splits its
reasoning there, streamed as non-streamed, and a grammar gated on ``</think>`` starts there.
Without ``--reasoning-parser`` a budget is a 400 naming the field, as in vLLM."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest

from tests.server.conftest import Server, serve_tiny_qwen3

END = 151668  # Qwen3's </think>
CHAT, CMPL = "/v1/chat/completions", "/v1/completions"
# DeepSeek-R1 / Qwen3-thinking style: the prompt opens the reasoning for the model (Jinja drops
# the template's last newline: the prompt ends with <think>)
OPEN_THINK = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n<think>\n"
CHAT_BASE: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Time?"}],
    "chat_template": OPEN_THINK,
    "return_token_ids": True,
    "temperature": 0,
    "max_tokens": 12,
}
CMPL_BASE: dict[str, Any] = {
    "prompt": "Question: why?\n<think>",
    "return_token_ids": True,
    "temperature": 0,
    "max_tokens": 10,
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}


@pytest.fixture(scope="module")
def qwen3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve_tiny_qwen3(
        tmp_path_factory, "thinking", "--reasoning-parser", "qwen3", "--trust-request-chat-template"
    )


def _post(srv: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(srv.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _stream(srv: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The streamed choice joined: its token ids, text (completions) or content and reasoning (chat)."""
    r = httpx.post(srv.url + path, json=body | {"stream": True}, timeout=120)
    assert r.status_code == 200, r.text
    joined: dict[str, Any] = {"token_ids": [], "text": "", "content": "", "reasoning": ""}
    for event in r.text.strip().split("\n\n"):
        if event.startswith(":") or event == "data: [DONE]":
            continue
        for c in json.loads(event.removeprefix("data: "))["choices"]:
            joined["token_ids"] += c.get("token_ids") or []
            joined["text"] += c.get("text") or ""
            delta = c.get("delta", {})
            joined["content"] += delta.get("content") or ""
            joined["reasoning"] += delta.get("reasoning") or ""
    return joined


def test_completions_budget_forces_the_end_after_n_tokens(qwen3_server: Server) -> None:
    free = _post(qwen3_server, CMPL, CMPL_BASE)["token_ids"]
    assert END not in free
    for n in (0, 2, 5):
        body = CMPL_BASE | {"thinking_token_budget": n}
        ids = _post(qwen3_server, CMPL, body)["token_ids"]
        assert ids[:n] == free[:n] and ids[n] == END, (n, ids)
        assert _stream(qwen3_server, CMPL, body)["token_ids"] == ids
    # larger than the output, or unlimited: nothing forced
    for budget in (10, -1, None):
        assert _post(qwen3_server, CMPL, CMPL_BASE | {"thinking_token_budget": budget})["token_ids"] == free


def test_chat_reasoning_ends_where_the_budget_says(qwen3_server: Server) -> None:
    body = CHAT_BASE | {"thinking_token_budget": 3}
    choice = _post(qwen3_server, CHAT, body)
    ids, msg = choice["token_ids"], choice["message"]
    assert ids[3] == END and END not in ids[:3]
    # the tiny model's reasoning is <think> tags, each dropped (vLLM 0.26's qwen3): null
    assert msg["reasoning"] == msg["reasoning_content"]
    assert msg["content"] is not None
    streamed = _stream(qwen3_server, CHAT, body)
    assert streamed["token_ids"] == ids
    assert (streamed["reasoning"] or None, streamed["content"]) == (msg["reasoning"], msg["content"])
    unlimited = _post(qwen3_server, CHAT, CHAT_BASE)
    assert END not in unlimited["token_ids"] and unlimited["message"]["content"] is None


def test_a_grammar_gated_on_the_end_starts_where_the_budget_ends(qwen3_server: Server) -> None:
    body = CHAT_BASE | {
        "thinking_token_budget": 4,
        "max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": TIME}},
    }
    choice = _post(qwen3_server, CHAT, body)
    assert choice["token_ids"][4] == END and END not in choice["token_ids"][:4]
    msg = choice["message"]
    jsonschema.validate(json.loads(msg["content"]), TIME)
    assert choice["finish_reason"] == "stop"
    streamed = _stream(qwen3_server, CHAT, body)
    assert (streamed["reasoning"] or None, streamed["content"]) == (msg["reasoning"], msg["content"])


def test_a_grammar_from_the_first_token_inside_the_reasoning_is_a_400(qwen3_server: Server) -> None:
    """The forced </think> would break a grammar that applies from the first token (chat with
    include_reasoning false) when the prompt opens the reasoning."""
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": TIME}}
    body = CHAT_BASE | {"response_format": fmt, "include_reasoning": False}
    r = httpx.post(
        qwen3_server.url + CHAT, json=body | {"thinking_token_budget": 2, "max_tokens": 40}, timeout=60
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "thinking_token_budget" and "grammar" in err["message"], err
    assert httpx.post(qwen3_server.url + CHAT, json=body | {"max_tokens": 40}, timeout=60).status_code == 200


def test_a_completions_grammar_waits_for_the_reasoning_end(qwen3_server: Server) -> None:
    """With --reasoning-parser a completions grammar applies after the first </think> the
    output writes, unless the prompt closed the reasoning, as vLLM 0.26's engine decides from
    the prompt (``is_reasoning_end``) and Surge's offline ``LLM`` does: a budget after a prompt
    that opens <think> forces </think> and the JSON follows it (this was a 400: the grammar
    applied from the first token). ``logit_bias`` on </think> shows where the grammar starts."""
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": TIME}}
    base = CMPL_BASE | {"response_format": fmt, "max_tokens": 40}
    for choice in (
        _post(qwen3_server, CMPL, base | {"thinking_token_budget": 2}),
        _stream(qwen3_server, CMPL, base | {"thinking_token_budget": 2}),
    ):
        assert choice["token_ids"][2] == END and END not in choice["token_ids"][:2], choice
        assert choice["text"].count("</think>") == 1, choice
        jsonschema.validate(json.loads(choice["text"].split("</think>")[1]), TIME)
    bias = {"logit_bias": {str(END): 100}}
    # a prompt without <think> or </think> has not ended the reasoning: the grammar waits too
    waits = _post(qwen3_server, CMPL, base | bias | {"prompt": "Question: why?"})
    assert waits["token_ids"][0] == END, waits
    jsonschema.validate(json.loads(waits["text"].removeprefix("</think>")), TIME)
    # a prompt that closed it (Qwen3's with enable_thinking false): from the first token, where
    # the grammar forbids </think>
    closed = base | bias | {"prompt": "Question: why?\n<think>\n\n</think>\n\n", "thinking_token_budget": 2}
    for choice in (_post(qwen3_server, CMPL, closed), _stream(qwen3_server, CMPL, closed)):
        assert END not in choice["token_ids"], choice
        jsonschema.validate(json.loads(choice["text"]), TIME)


@pytest.mark.parametrize("path", [CHAT, CMPL])
@pytest.mark.parametrize("value", [True, -2, 1.5, "3", 2**40])
def test_a_bad_budget_is_a_400_naming_it(qwen3_server: Server, path: str, value: object) -> None:
    base = CHAT_BASE if path == CHAT else CMPL_BASE
    r = httpx.post(qwen3_server.url + path, json=base | {"thinking_token_budget": value}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "thinking_token_budget"


@pytest.mark.parametrize("path", [CHAT, CMPL])
def test_a_budget_without_reasoning_parser_is_a_400(server: Server, path: str) -> None:
    base: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "Hi"}]} if path == CHAT else {"prompt": "Hi"}
    )
    r = httpx.post(server.url + path, json=base | {"max_tokens": 4, "thinking_token_budget": 8}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "thinking_token_budget" and "--reasoning-parser" in err["message"], err
    for unlimited in (-1, None):  # asks for nothing
        r = httpx.post(
            server.url + path, json=base | {"max_tokens": 4, "thinking_token_budget": unlimited}, timeout=60
        )
        assert r.status_code == 200, r.text
