"""``--chat-template-content-format`` through a live `surge serve` (bundled model on CPU): a
template that loops over content parts gets them under ``auto`` (the server's ``--chat-template``
and a request's ``chat_template``, each detected) and ``openai``; ``/tokenize`` renders as chat
does; the detected format is logged at start-up."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server, start_server
from tests.test_chat_content_format import PARTS_TEMPLATE, STRING_TEMPLATE

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
]
PARTS_PROMPT = "system:[Be brief.];user:[Hi][there];"
STRING_PROMPT = "system:Be brief.\nuser:Hi\nthere\n"
JSON_TEMPLATE = "{% for m in messages %}{{ m['content'] | tojson }};{% endfor %}"
"""Writes each content as JSON: shows what the template received."""


@pytest.fixture(scope="module")
def parts_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``--chat-template`` of the list kind, the content format left at ``auto``."""
    srv = start_server(tmp_path_factory.mktemp("serve-parts"), "--chat-template", PARTS_TEMPLATE)
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


@pytest.fixture(scope="module")
def openai_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``--chat-template-content-format openai``, request templates allowed, no server template."""
    srv = start_server(
        tmp_path_factory.mktemp("serve-openai"),
        "--chat-template-content-format",
        "openai",
        "--trust-request-chat-template",
    )
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def _prompts(srv: Server, **fields: Any) -> tuple[str, int]:
    """The chat completion's templated prompt and its token count, checked against /tokenize
    with the same messages."""
    chat = httpx.post(
        srv.url + "/v1/chat/completions",
        json={"messages": MESSAGES, "max_tokens": 1, "return_prompt_text": True, **fields},
        timeout=60,
    )
    assert chat.status_code == 200, chat.text
    tok = httpx.post(
        srv.url + "/tokenize",
        json={"messages": MESSAGES, "add_generation_prompt": True, **fields},
        timeout=60,
    )
    assert tok.status_code == 200, tok.text
    body = chat.json()
    assert tok.json()["count"] == body["usage"]["prompt_tokens"], "/tokenize renders as chat does"
    return body["prompt_text"], body["usage"]["prompt_tokens"]


def test_server_template_of_parts_under_auto(parts_server: Server) -> None:
    text, _ = _prompts(parts_server)
    assert text == PARTS_PROMPT
    assert "chat template content format: 'openai', detected in the --chat-template" in parts_server.log(), (
        parts_server.log()[-2000:]
    )


def test_request_templates_detected_each(server: Server) -> None:
    """The shared server (``auto``, request templates allowed): each request's own template is
    detected; a string template renders as before."""
    assert _prompts(server, chat_template=PARTS_TEMPLATE)[0] == PARTS_PROMPT
    assert _prompts(server, chat_template=STRING_TEMPLATE)[0] == STRING_PROMPT
    text, _ = _prompts(server, chat_template=JSON_TEMPLATE)
    assert text == '"Be brief.";"Hi\\nthere";'


def test_openai_format_passes_parts(openai_server: Server) -> None:
    assert _prompts(openai_server, chat_template=PARTS_TEMPLATE)[0] == PARTS_PROMPT
    text, _ = _prompts(openai_server, chat_template=JSON_TEMPLATE)
    assert text == (
        '[{"type": "text", "text": "Be brief."}];'
        '[{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}];'
    )
    # the model has no template: the fallback rendering writes strings whatever the format
    assert _prompts(openai_server)[0] == "system: Be brief.\nuser: Hi\nthere\nassistant:"


def test_refused_parts_stay_refused(openai_server: Server) -> None:
    r = httpx.post(
        openai_server.url + "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "chat_template": PARTS_TEMPLATE,
        },
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    assert "only text content parts" in r.json()["error"]["message"]
