"""vLLM's ``--enable-force-include-usage`` and ``--disable-fastapi-docs`` on ``surge serve``.

vLLM 0.26's ``should_include_usage`` turns on both ``include_usage`` and
``continuous_usage_stats`` for every chat and completions stream when the flag is set, whatever
the request's ``stream_options`` say (non-streamed answers always carry the usage);
``--disable-fastapi-docs`` builds the app without ``/openapi.json``, ``/docs`` and ``/redoc``.
Both flags were refused as unknown arguments; with ``--api-server-count`` every API process
must honour them."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server, start_server

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
DOC_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")


@pytest.fixture(scope="module")
def flags_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("serve-flags"), "--enable-force-include-usage", "--disable-fastapi-docs"
    )
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def _body(path: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "Once upon a time"}]}
        if path == CHAT
        else {"prompt": "Once upon a time"}
    )
    return base | {"max_tokens": 5, "ignore_eos": True} | extra


def _events(url: str, path: str, body: dict[str, Any]) -> list[Any]:
    r = httpx.post(url + path, json=body | {"stream": True}, timeout=120)
    assert r.status_code == 200, r.text
    out: list[Any] = []
    for ev in r.text.strip().split("\n\n"):
        if ev.startswith(":"):  # ": queued" comments
            continue
        payload = ev.removeprefix("data: ")
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def _check_forced_usage(events: list[Any], path: str, prompt_tokens: int, n: int) -> None:
    """vLLM's forced usage: every choices chunk carries its own choice's usage so far (a chat
    role chunk none generated), then a usage-only chunk totals every choice, then ``[DONE]``."""
    *chunks, final, done = events
    assert done == "[DONE]"
    assert final["choices"] == [] and final["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 5 * n,
        "total_tokens": prompt_tokens + 5 * n,
    }, final
    seen: dict[int, list[int]] = {}
    for c in chunks:
        [choice] = c["choices"]
        usage = c["usage"]
        assert usage["prompt_tokens"] == prompt_tokens, c
        assert usage["total_tokens"] == prompt_tokens + usage["completion_tokens"], c
        seen.setdefault(choice["index"], []).append(usage["completion_tokens"])
    assert sorted(seen) == list(range(n)), seen
    for counts in seen.values():
        if path == CHAT:
            assert counts[0] == 0, seen  # the role chunk
            counts = counts[1:]
        assert counts == sorted(counts) and counts[0] >= 1 and counts[-1] == 5, seen


@pytest.mark.parametrize("path", [CHAT, CMPL])
def test_every_stream_carries_the_usage_whatever_it_asks(flags_server: Server, path: str) -> None:
    prompt_tokens = httpx.post(flags_server.url + path, json=_body(path), timeout=120).json()["usage"][
        "prompt_tokens"
    ]
    for opts in (
        None,  # no stream_options at all
        {"include_usage": False},
        {"include_usage": None, "continuous_usage_stats": False},
        {"continuous_usage_stats": True},  # a 400 without the flag: here the usage is there anyway
        {"include_usage": True},
    ):
        body = _body(path, n=2) | ({} if opts is None else {"stream_options": opts})
        _check_forced_usage(_events(flags_server.url, path, body), path, prompt_tokens, 2)


@pytest.mark.parametrize("path", [CHAT, CMPL])
def test_unstreamed_answers_and_stream_option_checks_are_unchanged(
    flags_server: Server, server: Server, path: str
) -> None:
    """A non-streamed answer carries the same usage as without the flag; stream options
    without ``stream: true`` are still a 400 naming ``stream_options``, as in vLLM."""
    usage = [
        httpx.post(s.url + path, json=_body(path), timeout=120).json()["usage"]
        for s in (flags_server, server)
    ]
    assert usage[0] == usage[1] and usage[0]["completion_tokens"] == 5, usage
    r = httpx.post(
        flags_server.url + path, json=_body(path, stream_options={"include_usage": True}), timeout=120
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options", r.text


@pytest.mark.parametrize("path", [CHAT, CMPL])
def test_without_the_flag_a_stream_has_usage_only_when_asked(server: Server, path: str) -> None:
    assert all("usage" not in e for e in _events(server.url, path, _body(path))[:-1])
    r = httpx.post(
        server.url + path,
        json=_body(path, stream=True, stream_options={"continuous_usage_stats": True}),
        timeout=120,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options.continuous_usage_stats"


def test_the_docs_routes_are_gone(flags_server: Server, server: Server) -> None:
    for path in DOC_PATHS:
        assert httpx.get(flags_server.url + path, timeout=30).status_code == 404, path
        assert httpx.get(server.url + path, timeout=30).status_code == 200, path
    assert httpx.get(flags_server.url + "/v1/models", timeout=30).status_code == 200


def test_every_api_process_honours_both_flags(tmp_path: Path) -> None:
    """With ``--api-server-count 2`` the flags reach both API processes: the kernel spreads
    connections over them (each request below opens its own), and the access log names the
    process that answered."""
    srv = start_server(
        tmp_path,
        "--api-server-count",
        "2",
        "--enable-force-include-usage",
        "--disable-fastapi-docs",
        "--access-log",
    )
    try:
        deadline = time.monotonic() + 120
        while srv.log().count(" serving on http://") < 2:
            assert time.monotonic() < deadline, srv.log()[-3000:]
            time.sleep(0.1)
        prompt_tokens = httpx.post(srv.url + CMPL, json=_body(CMPL), timeout=120).json()["usage"][
            "prompt_tokens"
        ]
        for _ in range(16):
            _check_forced_usage(_events(srv.url, CMPL, _body(CMPL)), CMPL, prompt_tokens, 1)
            assert httpx.get(srv.url + "/openapi.json", timeout=30).status_code == 404
        log = srv.log()
        for c in range(2):
            assert re.search(rf"api{c}\] request cmpl-\S+ done", log), log[-3000:]
            assert re.search(rf'api{c}\] .*"GET /openapi.json HTTP/1.1" 404', log), log[-3000:]
    finally:
        code = srv.stop()
    assert code == 0, srv.log()[-3000:]
