"""vLLM 0.26's small serving routes: ``/ping`` (its SageMaker health check), the render API
(``/v1/completions/render``, ``/v1/chat/completions/render``), ``/tokenizer_info`` (behind
``--enable-tokenizer-info-endpoint``), ``/load`` (counted with ``--enable-server-load-tracking``)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from surge.server.drain import InFlight
from surge.server.load import LoadTrackingMiddleware, ServerLoad, counts_as_load
from surge.server.tokenization import TokenizerWorker
from surge.tokenizer import load_tokenizer
from tests.server.conftest import STORIES, Server, serve_tiny_qwen3
from tests.server.stub_app import stub_app, stub_state

KEY = "sk-test"


def _app(
    *,
    ready: bool = True,
    dead_reason: str | None = None,
    in_flight: InFlight | None = None,
    tokenizer_info: bool = False,
    **extra: Any,
) -> TestClient:
    """The app over a stub state (no engine, no lifespan): enough for the routes that only read
    the engine client's health and the server's settings. The server has ``--api-key sk-test``."""
    state = stub_state(api_keys=(KEY,), ready=ready, dead_reason=dead_reason, in_flight=in_flight, **extra)
    return stub_app(state, tokenizer_info=tokenizer_info)


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_ping_answers_as_health_without_the_key(method: str) -> None:
    app = _app()
    r = app.request(method, "/ping")
    health = app.get("/health")
    assert r.status_code == health.status_code == 200
    assert r.content == health.content == b""
    assert r.headers["x-surge-pid"] == health.headers["x-surge-pid"]
    # a SageMaker client may POST a body: it is not read, nor is a key asked for
    assert (
        app.post("/ping", content=b'{"x": 1}', headers={"content-type": "application/json"}).status_code
        == 200
    )
    assert app.get("/v1/models").status_code == 401, "the stub server does have a key"


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_ping_fails_as_health_when_the_engine_is_dead(method: str) -> None:
    app = _app(ready=False, dead_reason="the engine process died (exit code -9)")
    r = app.request(method, "/ping")
    health = app.get("/health")
    assert r.status_code == health.status_code == 503
    assert r.json() == health.json()
    assert "exit code -9" in r.json()["error"]["message"]


def test_ping_while_draining_is_503() -> None:
    in_flight = InFlight()
    app = _app(in_flight=in_flight)
    in_flight.draining = True
    assert app.get("/ping").status_code == app.get("/health").status_code == 503


def test_ping_on_a_live_server_and_its_schema(server: Server) -> None:
    assert httpx.get(server.url + "/ping").status_code == 200
    assert httpx.post(server.url + "/ping").status_code == 200
    r = httpx.head(server.url + "/ping")  # vLLM serves GET and POST only
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"GET", "POST"}
    paths = httpx.get(server.url + "/openapi.json").json()["paths"]
    assert set(paths["/ping"]) == {"get", "post"}
    assert "503" in paths["/ping"]["post"]["responses"]
    assert "401" not in paths["/ping"]["get"]["responses"]


# --- the render API ---------------------------------------------------------------------------

CMPL_RENDER = "/v1/completions/render"
CHAT_RENDER = "/v1/chat/completions/render"
GENERATE_REQUEST_KEYS = [  # vLLM's GenerateRequest, in its order
    "request_id",
    "token_ids",
    "assistant_tokens_mask",
    "token_offsets",
    "features",
    "sampling_params",
    "model",
    "stream",
    "stream_options",
    "cache_salt",
    "priority",
    "kv_transfer_params",
    "ec_transfer_params",
]
# assistant text in {% generation %} blocks, as transformers' return_assistant_tokens_mask reads it
GEN_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'assistant' %}A: {% generation %}{{ m.content }}"
    "{% endgeneration %}\n{% else %}U: {{ m.content }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)
TALK = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Once upon a time"},
    {"role": "user", "content": "More"},
]


def _requests_done(srv: Server) -> float:
    text = httpx.get(srv.url + "/metrics").text
    return sum(float(v) for v in re.findall(r"^surge:request_success_total\{[^}]*\} (\S+)$", text, re.M))


def test_completions_render_is_the_prompt_the_engine_would_get(server: Server) -> None:
    done = _requests_done(server)
    text = "Once upon a time, there was a cat"
    r = httpx.post(server.url + CMPL_RENDER, json={"prompt": text, "max_tokens": 5, "temperature": 0.25})
    assert r.status_code == 200, r.text
    [out] = r.json()
    assert list(out) == GENERATE_REQUEST_KEYS
    tokens = httpx.post(server.url + "/tokenize", json={"prompt": text}).json()["tokens"]
    assert out["token_ids"] == tokens
    assert out["request_id"].startswith("cmpl-") and out["token_offsets"] is None
    assert out["assistant_tokens_mask"] is None and out["features"] is None
    assert out["sampling_params"]["max_tokens"] == 5 and out["sampling_params"]["temperature"] == 0.25
    assert out["stream"] is False and out["stream_options"] is None and out["priority"] == 0
    # the same ids as the completion's own prompt
    gen = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": text, "max_tokens": 1, "return_token_ids": True},
        timeout=60,
    ).json()
    assert gen["choices"][0]["prompt_token_ids"] == out["token_ids"]
    assert _requests_done(server) == done + 1, "render sent nothing to the engine"


def test_completions_render_offsets_truncation_and_several_prompts(server: Server) -> None:
    texts = ["Once upon a time", "Hi"]
    body = {"prompt": texts, "return_token_offsets": True, "truncate_prompt_tokens": 3}
    r = httpx.post(server.url + CMPL_RENDER, json=body, headers={"X-Request-Id": "abc"})
    assert r.status_code == 200, r.text
    outs = r.json()
    assert [o["request_id"] for o in outs] == ["cmpl-abc-p0", "cmpl-abc-p1"]
    for text, out in zip(texts, outs, strict=True):
        whole = httpx.post(server.url + "/tokenize", json={"prompt": text}).json()["tokens"]
        assert out["token_ids"] == whole[-3:]  # left truncation keeps the last tokens
        offsets = out["token_offsets"]
        assert len(offsets) == len(out["token_ids"])
        pieces = [text[s:e] for s, e in offsets]
        assert "".join(pieces) in text and all(s <= e for s, e in offsets)
    assert [texts[0][s:e] for s, e in outs[0]["token_offsets"]] == [" upon", " a", " time"]
    # right truncation keeps the first tokens (the BOS the tokenizer adds has (0, 0))
    right = httpx.post(server.url + CMPL_RENDER, json=body | {"prompt": texts[0], "truncation_side": "right"})
    [out] = right.json()
    assert out["token_offsets"][0] == [0, 0] and len(out["token_ids"]) == 3
    # token ids have no text: no offsets
    ids = httpx.post(server.url + CMPL_RENDER, json={"prompt": [1, 2, 3], "return_token_offsets": True})
    assert ids.json()[0]["token_ids"] == [1, 2, 3] and ids.json()[0]["token_offsets"] is None


def test_chat_render_matches_the_chat_endpoint(server: Server) -> None:
    body: dict[str, Any] = {
        "messages": TALK,
        "chat_template": GEN_TEMPLATE,
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_prompt_text": True,
        "return_token_offsets": True,
    }
    r = httpx.post(server.url + CHAT_RENDER, json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert list(out) == [*GENERATE_REQUEST_KEYS, "prompt_text"]
    assert out["request_id"].startswith("chatcmpl-")
    assert out["stream"] is True and out["stream_options"]["include_usage"] is True
    assert out["assistant_tokens_mask"] is None, "not asked for"
    plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "return_token_offsets")}
    gen = httpx.post(
        server.url + "/v1/chat/completions", json=plain | {"return_token_ids": True}, timeout=60
    ).json()
    assert out["token_ids"] == gen["prompt_token_ids"]
    assert out["prompt_text"] == gen["prompt_text"] == "U: Hi there\nA: Once upon a timeU: More\nA:"
    text = out["prompt_text"]
    assert [text[s:e] for s, e in out["token_offsets"]][-2:] == ["A", ":"]


def test_chat_render_assistant_tokens_mask(server: Server) -> None:
    body: dict[str, Any] = {
        "messages": TALK,
        "chat_template": GEN_TEMPLATE,
        "return_assistant_tokens_mask": True,
    }
    out = httpx.post(server.url + CHAT_RENDER, json=body | {"return_token_offsets": True}).json()
    mask, offsets, text = (
        out["assistant_tokens_mask"],
        out["token_offsets"],
        "U: Hi there\nA: Once upon a timeU: More\nA:",
    )
    assert len(mask) == len(out["token_ids"]) == len(offsets)
    marked = "".join(text[s:e] for (s, e), m in zip(offsets, mask, strict=True) if m)
    assert marked.strip() == "Once upon a time", (marked, mask)
    # truncation cuts the mask as it cuts the ids
    cut = httpx.post(server.url + CHAT_RENDER, json=body | {"truncate_prompt_tokens": 8}).json()
    assert cut["assistant_tokens_mask"] == mask[-8:] and cut["token_ids"] == out["token_ids"][-8:]
    # a template without {% generation %} blocks, and continue_final_message: null (as vLLM)
    plain = httpx.post(server.url + CHAT_RENDER, json=body | {"chat_template": "{{ messages[0].content }}"})
    assert plain.status_code == 200 and plain.json()["assistant_tokens_mask"] is None
    cont = body | {"messages": TALK[:2], "add_generation_prompt": False, "continue_final_message": True}
    r = httpx.post(server.url + CHAT_RENDER, json=cont)
    assert r.status_code == 200 and r.json()["assistant_tokens_mask"] is None


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "Hi", "return_token_offsets": True}, "return_token_offsets"),
        ("/v1/chat/completions", {"messages": TALK, "return_token_offsets": True}, "return_token_offsets"),
        (
            "/v1/chat/completions",
            {"messages": TALK, "return_assistant_tokens_mask": True},
            "return_assistant_tokens_mask",
        ),
        (CMPL_RENDER, {"prompt": "Hi", "return_assistant_tokens_mask": True}, "return_assistant_tokens_mask"),
        (CMPL_RENDER, {"prompt": "Hi", "use_beam_search": True}, "use_beam_search"),
        (CHAT_RENDER, {"messages": TALK, "temperature": -1}, "temperature"),
        (CHAT_RENDER, {"messages": TALK, "truncate_prompt_tokens": 10**6}, "truncate_prompt_tokens"),
        (CHAT_RENDER, {"messages": []}, "messages"),
    ],
)
def test_render_only_fields_and_bad_requests(
    server: Server, path: str, body: dict[str, Any], param: str
) -> None:
    """The generation endpoints refuse what only the render endpoints return (vLLM ignores it
    there); the render endpoints refuse what their generation endpoint refuses."""
    r = httpx.post(server.url + path, json=body | {"max_tokens": 2}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    ok = httpx.post(
        server.url + path, json=body | {param: None if param != "messages" else TALK, "max_tokens": 2}
    )
    if param in ("return_token_offsets", "use_beam_search"):
        assert ok.status_code == 200, ok.text  # null is unset


def test_render_needs_the_key_and_no_engine() -> None:
    app = _app(ready=False, dead_reason="gone")
    for path in (CMPL_RENDER, CHAT_RENDER):
        r = app.post(path, json={"prompt": "x"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path


@pytest.fixture(scope="module")
def qwen3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve_tiny_qwen3(
        tmp_path_factory,
        "render",
        "--tool-call-parser",
        "hermes",
        "--enable-tokenizer-info-endpoint",
        "--enable-server-load-tracking",
    )


def test_chat_render_with_qwen3_template_and_tools(qwen3_server: Server) -> None:
    """Qwen3's own template (tools, enable_thinking), as the chat endpoint renders it; its
    byte-level tokenizer's offsets cover the templated text."""
    tool = {
        "type": "function",
        "function": {"name": "now", "parameters": {"type": "object", "properties": {}}},
    }
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "What time is it? Ünïcödé ✓"}],
        "tools": [tool],
        "chat_template_kwargs": {"enable_thinking": False},
        "return_prompt_text": True,
        "max_tokens": 2,
    }
    out = httpx.post(qwen3_server.url + CHAT_RENDER, json=body | {"return_token_offsets": True}).json()
    gen = httpx.post(
        qwen3_server.url + "/v1/chat/completions", json=body | {"return_token_ids": True}, timeout=120
    ).json()
    assert out["token_ids"] == gen["prompt_token_ids"]
    text = out["prompt_text"]
    assert text == gen["prompt_text"] and '"name": "now"' in text and "<think>\n\n</think>" in text
    assert "".join(text[s:e] for s, e in out["token_offsets"]) == text
    assert out["sampling_params"]["structured_outputs"] is None


# --- /tokenizer_info ----------------------------------------------------------------------------


def _stories_app(chat_template: str | None, *, tokenizer_info: bool = True) -> TestClient:
    tokenizer = load_tokenizer(str(STORIES))
    worker = TokenizerWorker(tokenizer, 512, chat_template)
    return _app(
        tokenizer=tokenizer,
        tokenizer_worker=worker,
        chat_template=chat_template,
        tokenizer_info=tokenizer_info,
    )


def test_tokenizer_info_needs_the_flag() -> None:
    assert _stories_app(None, tokenizer_info=False).get("/tokenizer_info").status_code == 404


def test_tokenizer_info_answers_the_tokenizer_config_without_the_key() -> None:
    info = _stories_app(None).get("/tokenizer_info")
    assert info.status_code == 200, info.text  # the stub server has --api-key: none needed (vLLM)
    body = info.json()
    assert body["tokenizer_class"] == "TokenizersBackend"
    assert body["bos_token"] == "<s>" and body["eos_token"] == "</s>" and body["model_max_length"] == 512
    assert body["added_tokens_decoder"]["0"] == "<unk>", "added tokens as their text"
    assert "vocab_file" not in body and "merges_file" not in body
    assert "chat_template" not in body, "the bundled tokenizer has no template"
    # the server's --chat-template is the template chat requests get: it is the one named
    assert _stories_app("{{ messages }}").get("/tokenizer_info").json()["chat_template"] == "{{ messages }}"


def test_tokenizer_info_of_qwen3(qwen3_server: Server) -> None:
    body = httpx.get(qwen3_server.url + "/tokenizer_info").json()
    assert body["tokenizer_class"] == "Qwen2Tokenizer" and body["eos_token"] == "<|im_end|>"
    assert "<|im_start|>" in body["chat_template"] and "tools" in body["chat_template"]
    assert "vocab_file" not in body and "merges_file" not in body
    assert body["added_tokens_decoder"]["151643"] == "<|endoftext|>"


# --- /load --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "counted"),
    [
        ("POST", "/v1/chat/completions", True),
        ("POST", "/v1/completions", True),
        ("POST", "/v1/responses", True),
        ("GET", "/v1/responses/resp_1", True),
        ("POST", "/v1/responses/resp_1/cancel", True),
        ("DELETE", "/v1/responses/resp_1", False),
        ("GET", "/v1/responses/", False),
        ("POST", "/v1/chat/completions/render", False),
        ("POST", "/tokenize", False),
        ("GET", "/v1/models", False),
    ],
)
def test_which_requests_count_as_load(method: str, path: str, counted: bool) -> None:
    """vLLM's load_aware_call routes, among those Surge serves."""
    assert counts_as_load(method, path) is counted


def test_load_counts_a_request_until_its_response_is_sent() -> None:
    async def scenario() -> list[int]:
        load = ServerLoad()
        release = asyncio.Event()
        seen: list[int] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:
            seen.append(load.count)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await release.wait()  # a stream still sending
            seen.append(load.count)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            if scope["path"] == "/v1/completions":
                raise RuntimeError("a failure after the answer")

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Any) -> None:
            pass

        mw = LoadTrackingMiddleware(app, load)
        chat = asyncio.create_task(
            mw({"type": "http", "method": "POST", "path": "/v1/chat/completions"}, receive, send)
        )
        cmpl = asyncio.create_task(
            mw({"type": "http", "method": "POST", "path": "/v1/completions"}, receive, send)
        )
        other = asyncio.create_task(
            mw({"type": "http", "method": "POST", "path": "/tokenize"}, receive, send)
        )
        while len(seen) < 3:
            await asyncio.sleep(0)
        during = load.count
        release.set()
        await chat
        with pytest.raises(RuntimeError):
            await cmpl
        await other
        return [during, load.count]

    during, after = asyncio.run(scenario())
    assert (during, after) == (2, 0), "the two generation requests, not /tokenize; none left after"


def test_load_without_tracking_is_zero_and_open(server: Server) -> None:
    """vLLM answers /load without its flag, with 0; no key is needed (outside /v1)."""
    assert httpx.get(server.url + "/load").json() == {"server_load": 0}
    assert _app().get("/load").json() == {"server_load": 0}  # the stub server has --api-key


def _wait_load(url: str, want: int) -> None:
    deadline = time.monotonic() + 60
    while (got := httpx.get(url + "/load").json()) != {"server_load": want}:
        assert time.monotonic() < deadline, got
        time.sleep(0.05)


def test_load_counts_the_requests_being_served(qwen3_server: Server) -> None:
    """With the engine stopped (SIGSTOP), a stream and a plain request wait for their tokens:
    both are counted until their responses are sent; a refused request is not left counted."""
    url = qwen3_server.url
    assert httpx.get(url + "/load").json() == {"server_load": 0}
    body = {"prompt": "Hi", "max_tokens": 8}
    results: list[int] = []

    def post(extra: dict[str, Any]) -> None:
        r = httpx.post(url + "/v1/completions", json=body | extra, timeout=120)
        results.append(r.status_code)

    os.kill(qwen3_server.engine_pid, signal.SIGSTOP)
    try:
        threads = [threading.Thread(target=post, args=(extra,)) for extra in ({}, {"stream": True})]
        for t in threads:
            t.start()
        _wait_load(url, 2)
        bad = httpx.post(url + "/v1/completions", json={"prompt": "Hi", "temperature": -1})
        assert bad.status_code == 400
        assert httpx.get(url + "/load").json() == {"server_load": 2}
    finally:
        os.kill(qwen3_server.engine_pid, signal.SIGCONT)
    for t in threads:
        t.join(120)
    assert results == [200, 200]
    _wait_load(url, 0)
