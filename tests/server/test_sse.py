"""Raw SSE framing (httpx) for --stream-interval 1, 4 and 16; API key and model name checks."""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server, start_server

API_KEY = "sekret"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_TOKENS = 40


@pytest.fixture(scope="module", params=[1, 4, 16])
def sse_server(
    request: pytest.FixtureRequest, server: Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[int, Server]]:
    interval = request.param
    if interval == 1:
        yield interval, server
        return
    srv = start_server(
        tmp_path_factory.mktemp(f"serve-i{interval}"),
        "--stream-interval",
        str(interval),
        "--api-key",
        API_KEY,
        "--served-model-name",
        "stories",
        "tiny",
    )
    yield interval, srv
    # one server stops on SIGINT (Ctrl-C), the other on SIGTERM: both exit 0 with no orphan engine
    assert srv.stop(signal.SIGINT if interval == 16 else signal.SIGTERM) == 0, srv.log()[-3000:]


def parse_sse(raw: bytes) -> list[Any]:
    """Split an SSE body into events; every event must be one ``data: `` line."""
    text = raw.decode()
    assert text.endswith("\n\n"), "the stream ends with a blank line"
    events = text[:-2].split("\n\n")
    out: list[Any] = []
    for ev in events:
        assert ev.startswith("data: ") and "\n" not in ev, f"bad SSE event {ev!r}"
        payload = ev[len("data: ") :]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def stream(srv: Server, path: str, body: dict[str, Any]) -> list[Any]:
    with httpx.Client(timeout=120) as c, c.stream("POST", srv.url + path, json=body, headers=AUTH) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return parse_sse(r.read())


def check_framing(
    events: list[Any], obj: str, n_choices: int, include_usage: bool
) -> tuple[dict[int, str], list[dict]]:
    """Check every streaming rule; return joined text per choice and the content chunks."""
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = events[:-1]
    assert chunks and all(isinstance(c, dict) for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    assert all(c["object"] == obj for c in chunks)
    usage_chunks = [c for c in chunks if c.get("usage")]
    if include_usage:
        assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and chunks[-1]["choices"] == []
    else:
        assert not usage_chunks and all(c["choices"] for c in chunks)
    content = [c for c in chunks if c["choices"]]
    texts: dict[int, str] = {}
    finished: dict[int, int] = {}
    for c in content:
        assert len(c["choices"]) == 1
        ch = c["choices"][0]
        i = ch["index"]
        assert finished.get(i, 0) == 0, "no chunk of a choice after its finish_reason"
        if obj == "chat.completion.chunk":
            delta = ch["delta"]
            if i not in texts:  # each choice opens with the role chunk, as vLLM and OpenAI
                assert delta == {"role": "assistant", "content": ""}, delta
                assert ch["logprobs"] is None and ch["finish_reason"] is None
            else:
                assert "role" not in delta, "the role is on the first chunk only"
            piece = delta.get("content") or ""
        else:
            piece = ch["text"]
        assert "\ufffd" not in piece
        texts[i] = texts.get(i, "") + piece
        if ch["finish_reason"] is not None:
            finished[i] = finished.get(i, 0) + 1
    assert sorted(texts) == list(range(n_choices))
    assert finished == {i: 1 for i in range(n_choices)}, "exactly one finish_reason per choice"
    return texts, content


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_stream_framing_and_interval(sse_server: tuple[int, Server], server: Server, kind: str) -> None:
    interval, srv = sse_server
    if kind == "chat":
        path, obj = "/v1/chat/completions", "chat.completion.chunk"
        body: dict[str, Any] = {"messages": [{"role": "user", "content": "Once upon a time"}]}
    else:
        path, obj = "/v1/completions", "text_completion"
        body = {"prompt": "Once upon a time"}
    body |= {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    reference = httpx.post(server.url + path, json=body, timeout=120).json()
    ref_choice = reference["choices"][0]
    ref_text = ref_choice["message"]["content"] if kind == "chat" else ref_choice["text"]

    events = stream(srv, path, body | {"stream": True, "stream_options": {"include_usage": True}})
    texts, content = check_framing(events, obj, 1, include_usage=True)
    assert texts[0] == ref_text, "the joined stream equals the non-stream text for every interval"
    assert events[-2]["usage"] == reference["usage"]
    assert reference["usage"]["completion_tokens"] == MAX_TOKENS
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    # first token at once, then every `interval` tokens, then the final one (chat: after the role chunk)
    role = 1 if kind == "chat" else 0
    assert 2 + role <= len(content) <= 1 + role + math.ceil((MAX_TOKENS - 1) / interval)

    events = stream(srv, path, body | {"stream": True})
    texts, _ = check_framing(events, obj, 1, include_usage=False)
    assert texts[0] == ref_text


def test_stream_n2_indices(sse_server: tuple[int, Server]) -> None:
    interval, srv = sse_server
    body = {
        "prompt": "Tom had a",
        "max_tokens": 17,
        "temperature": 0.9,
        "seed": 5,
        "n": 2,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = stream(srv, "/v1/completions", body)
    texts, content = check_framing(events, "text_completion", 2, include_usage=True)
    assert events[-2]["usage"]["completion_tokens"] == 34
    for i in range(2):
        n_chunks = sum(c["choices"][0]["index"] == i for c in content)
        assert 2 <= n_chunks <= 1 + math.ceil(16 / interval)
    plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    full = httpx.post(srv.url + "/v1/completions", json=plain, headers=AUTH, timeout=120).json()
    assert [c["text"] for c in full["choices"]] == [texts[0], texts[1]]


def test_chat_stream_n2_opens_each_choice_with_the_role(sse_server: tuple[int, Server]) -> None:
    """Chat, n = 2: each choice's first chunk is ``{"role": "assistant", "content": ""}`` (logprobs
    and finish_reason null, as vLLM and OpenAI), its later chunks carry no role, and each
    choice's joined content equals the non-streamed message."""
    _, srv = sse_server
    body = {
        "messages": [{"role": "user", "content": "Tom had a"}],
        "max_tokens": 17,
        "temperature": 0.9,
        "seed": 5,
        "n": 2,
        "ignore_eos": True,
        "stream": True,
    }
    events = stream(srv, "/v1/chat/completions", body)
    texts, content = check_framing(events, "chat.completion.chunk", 2, include_usage=False)
    for i in range(2):
        mine = [c["choices"][0] for c in content if c["choices"][0]["index"] == i]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""} and len(mine) >= 2
        assert mine[0]["logprobs"] is None and mine[0]["finish_reason"] is None
        assert mine[1]["delta"]["content"], "the first content chunk carries text"
        assert all("role" not in c["delta"] for c in mine[1:])
    plain = {k: v for k, v in body.items() if k != "stream"}
    full = httpx.post(srv.url + "/v1/chat/completions", json=plain, headers=AUTH, timeout=120).json()
    assert [c["message"]["content"] for c in full["choices"]] == [texts[0], texts[1]]


@pytest.mark.parametrize("sse_server", [4, 16], indirect=True)
def test_api_key_and_model_names(sse_server: tuple[int, Server]) -> None:
    _, srv = sse_server  # these servers run with --api-key and --served-model-name
    body = {"model": "tiny", "prompt": "Hi", "max_tokens": 2}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(
        srv.url + "/v1/completions", json=body, headers={"Authorization": "Bearer nope"}, timeout=60
    )
    assert r.status_code == 401
    r = httpx.post(srv.url + "/v1/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.json()["model"] == "stories"
    r = httpx.post(srv.url + "/v1/completions", json=body | {"model": "gpt-4"}, headers=AUTH, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    models = httpx.get(srv.url + "/v1/models", headers=AUTH).json()["data"]
    assert [m["id"] for m in models] == ["stories", "tiny"]
    assert httpx.get(srv.url + "/health").status_code == 200  # health and metrics need no key
    assert httpx.get(srv.url + "/metrics").status_code == 200
