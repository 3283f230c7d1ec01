"""vLLM's ``--enable-prompt-tokens-details``: chat and completions usage, streamed or not, carries
``prompt_tokens_details.cached_tokens`` (the prompt tokens served from the prefix cache); without
the flag the usage has no such key. The flag was refused as an unknown argument."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server, start_server

# 36 tokens of the bundled model: two full 16-token KV blocks to find cached the second time
PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog."


@pytest.fixture(scope="module")
def details_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("serve-details"), "--enable-prompt-tokens-details")
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def _usage(srv: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(srv.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    if not body.get("stream"):
        return r.json()["usage"]
    chunks = [
        json.loads(e.removeprefix("data: ")) for e in r.text.strip().split("\n\n") if e.startswith("data: {")
    ]
    assert all(c["usage"] is None for c in chunks[:-1]), chunks
    return chunks[-1]["usage"]


def test_usage_counts_the_cached_prompt_tokens(details_server: Server, tmp_path: Path) -> None:
    salt = tmp_path.name  # a fresh prefix-cache namespace: nothing cached before the first request
    body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": 2, "cache_salt": salt}
    first = _usage(details_server, "/v1/completions", body)
    assert first["prompt_tokens"] > 32 and first["prompt_tokens_details"] == {"cached_tokens": 0}, first
    again = _usage(details_server, "/v1/completions", body)
    cached = again["prompt_tokens_details"]["cached_tokens"]
    assert 32 <= cached < again["prompt_tokens"] and cached % 16 == 0, again
    streamed = _usage(
        details_server, "/v1/completions", body | {"stream": True, "stream_options": {"include_usage": True}}
    )
    assert streamed["prompt_tokens_details"] == {"cached_tokens": cached}, streamed
    chat: dict[str, Any] = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 2,
        "cache_salt": salt,
    }
    assert _usage(details_server, "/v1/chat/completions", chat)["prompt_tokens_details"] == {
        "cached_tokens": 0
    }
    usage = _usage(
        details_server,
        "/v1/chat/completions",
        chat | {"stream": True, "stream_options": {"include_usage": True}},
    )
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 32, usage


def test_without_the_flag_the_usage_has_no_details(server: Server) -> None:
    usage = _usage(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}, usage
