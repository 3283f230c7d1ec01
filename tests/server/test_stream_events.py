"""At --stream-interval 1 every SSE event stands for exactly one token, even under load.

A token whose text is held back (an unfinished UTF-8 character, or a possible stop-string
prefix) still gets its own event, with empty text, so a client's inter-token gaps are one
engine step each instead of two when text is held back.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from tests.server.conftest import Server

NUM_STREAMS = 64
MAX_TOKENS = 24
# " the" is a prefix of this stop string, so the text is held back after every " the" token;
# the whole string never occurs in the bundled model's stories.
HOLD_BACK_STOP = " the cat and the dog and the purple owl"


async def _stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[int, int, str]:
    """Return (content events, completion_tokens from usage, joined text)."""
    events = 0
    usage: dict[str, int] | None = None
    text = ""
    async with client.stream("POST", url, json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk["choices"]:
                events += 1
                text += chunk["choices"][0]["text"]
    assert usage is not None
    return events, usage["completion_tokens"], text


def test_one_token_per_event_under_load(server: Server) -> None:
    async def run() -> list[tuple[int, int, str]]:
        limits = httpx.Limits(max_connections=NUM_STREAMS)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            bodies = [
                {
                    "prompt": "Once upon a time, the",
                    "max_tokens": MAX_TOKENS,
                    "temperature": 1.0,
                    "seed": i,
                    "ignore_eos": True,
                    "stop": [HOLD_BACK_STOP],
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                for i in range(NUM_STREAMS)
            ]
            url = server.url + "/v1/completions"
            return await asyncio.gather(*(_stream(client, url, b) for b in bodies))

    results = asyncio.run(run())
    held = 0
    for events, tokens, text in results:
        assert tokens == MAX_TOKENS
        assert events == tokens, f"{events} events for {tokens} tokens"
        held += text.count(" the")
    assert held > 0, "the workload must hold text back at least once to test anything"
