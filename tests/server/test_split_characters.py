"""A character that byte-level BPE splits over several tokens, over HTTP (tiny Qwen3 with the
real Qwen3 tokenizer, dummy weights): a regex makes the model write ``𠀋`` (three tokens, none a
whole character: ``\\xf0``, ``\\xa0\\x80``, ``\\x8b``) and ``🦜`` (two tokens). Streamed text never
carries U+FFFD: the detokenizer holds the bytes back until the character is whole. Each logprobs
entry's ``token`` is the token decoded alone (U+FFFD for a piece of a character, as vLLM 0.26's
``tokenizer.decode([id])``) and its ``bytes`` the token's own bytes, so the entries' bytes join
to the text's UTF-8 (OpenAI's ``bytes``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server, serve_tiny_qwen3

TEXT = "a𠀋🦜b𠀋"
BODY: dict[str, Any] = {
    "max_tokens": 40,
    "temperature": 0,
    "structured_outputs": {"regex": "a𠀋🦜b𠀋"},
}


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve_tiny_qwen3(tmp_path_factory, "split-chars")


def _stream(srv: Server, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The streamed choices of ``body`` (one per chunk; chat's role chunk left out)."""
    r = httpx.post(srv.url + path, json=body | {"stream": True}, timeout=120)
    assert r.status_code == 200, r.text
    events = [e.removeprefix("data: ") for e in r.text.strip().split("\n\n") if not e.startswith(":")]
    assert events.pop() == "[DONE]"
    choices = [c for e in events for c in json.loads(e)["choices"]]
    return [c for c in choices if not c.get("delta", {}).get("role")]


def test_chat_stream_holds_back_a_split_character(qwen3: Server) -> None:
    body = BODY | {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 2}
    body |= {"chat_template_kwargs": {"enable_thinking": False}}
    full = httpx.post(qwen3.url + "/v1/chat/completions", json=body, timeout=120).json()
    choice = full["choices"][0]
    assert choice["message"]["content"] == TEXT, full
    entries = choice["logprobs"]["content"]
    assert choice["finish_reason"] == "stop" and entries[-1]["token"] == "<|endoftext|>"  # the EOS's entry
    assert bytes(b for e in entries[:-1] for b in e["bytes"]).decode("utf-8") == TEXT
    partial = [e for e in entries if "\ufffd" in e["token"]]
    assert len(partial) >= 4, entries  # 𠀋 and 🦜 are no token of their own: written in pieces
    for e in partial:  # a piece: its own bytes, not U+FFFD's (EF BF BD)
        assert e["bytes"] != list("\ufffd".encode()) and e["token"] == "\ufffd" * len(e["token"])
    chunks = _stream(qwen3, "/v1/chat/completions", body)
    texts = [c["delta"].get("content", "") for c in chunks]
    assert all("\ufffd" not in t for t in texts), texts
    assert "".join(texts) == TEXT
    streamed = [e for c in chunks for e in (c["logprobs"] or {}).get("content", [])]
    assert [(e["token"], e["bytes"]) for e in streamed] == [(e["token"], e["bytes"]) for e in entries]


def test_completion_stream_holds_back_a_split_character(qwen3: Server) -> None:
    body = BODY | {"prompt": "Say it:", "logprobs": 1}
    full = httpx.post(qwen3.url + "/v1/completions", json=body, timeout=120).json()
    choice = full["choices"][0]
    assert choice["text"] == TEXT, full
    tokens = choice["logprobs"]["tokens"]
    assert sum("\ufffd" in t for t in tokens) >= 4, tokens
    chunks = _stream(qwen3, "/v1/completions", body)
    texts = [c["text"] for c in chunks]
    assert all("\ufffd" not in t for t in texts), texts
    assert "".join(texts) == TEXT
    assert [t for c in chunks for t in (c["logprobs"] or {}).get("tokens", [])] == tokens
