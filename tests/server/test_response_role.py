"""vLLM's ``--response-role``: the role of chat completions answers under
``add_generation_prompt`` (vLLM's ``get_chat_request_role``; without it the answer takes the last
message's role), non-streamed, streamed (the role chunk) and batched; ``echo`` repeats a last
message of that role. The flag was refused with a hint."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server, start_server

CHAT = "/v1/chat/completions"
BASE: dict[str, Any] = {"max_tokens": 3, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def role_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("serve-role"), "--response-role", "narrator")
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def _post(srv: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(srv.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _deltas(srv: Server, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = httpx.post(srv.url + CHAT, json=body | {"stream": True}, timeout=120)
    assert r.status_code == 200, r.text
    events = [json.loads(e[6:]) for e in r.text.split("\n\n") if e.startswith("data: {")]
    return [e["choices"][0]["delta"] for e in events if e["choices"]]


def test_the_answer_takes_the_flags_role(role_server: Server) -> None:
    body = BASE | {"messages": [{"role": "user", "content": "Once upon a time"}], "n": 2}
    choices = _post(role_server, CHAT, body)["choices"]
    assert [c["message"]["role"] for c in choices] == ["narrator", "narrator"]
    deltas = _deltas(role_server, body)
    assert [d for d in deltas if "role" in d] == [{"role": "narrator", "content": ""}] * 2


def test_without_a_generation_prompt_the_last_messages_role(role_server: Server, server: Server) -> None:
    body = BASE | {
        "messages": [{"role": "user", "content": "Once upon a time"}],
        "add_generation_prompt": False,
        "echo": True,
    }
    for srv in (role_server, server):
        message = _post(srv, CHAT, body)["choices"][0]["message"]
        assert message["role"] == "user" and message["content"].startswith("Once upon a time"), message
        assert _deltas(srv, body)[:2] == [{"role": "user", "content": ""}, {"content": "Once upon a time"}]


def test_echo_repeats_a_last_message_of_the_answers_role(role_server: Server) -> None:
    said = "There was a little girl"
    for last, echoed in (("narrator", True), ("assistant", False)):
        body = BASE | {
            "messages": [{"role": "user", "content": "Tell me"}, {"role": last, "content": said}],
            "echo": True,
        }
        content = _post(role_server, CHAT, body)["choices"][0]["message"]["content"]
        assert content.startswith(said) is echoed, (last, content)


def test_batch_answers_take_the_role_per_conversation(role_server: Server) -> None:
    convs = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "hello"}]]
    choices = _post(role_server, CHAT + "/batch", BASE | {"messages": convs})["choices"]
    assert [c["message"]["role"] for c in choices] == ["narrator", "narrator"]
    unprompted = BASE | {"messages": convs, "add_generation_prompt": False}
    choices = _post(role_server, CHAT + "/batch", unprompted)["choices"]
    assert [c["message"]["role"] for c in choices] == ["user", "user"]
