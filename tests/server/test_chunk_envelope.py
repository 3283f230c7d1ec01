"""ChunkEnvelope.chunk: the head encoded once gives the bytes of encoding the whole object."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from surge.server.serving_common import ChunkEnvelope


class _Gen:
    """Two choices of one 7-token prompt, which generated 2 and 1 tokens."""

    prompt_tokens = 7
    completion_tokens = 3
    prompt_tokens_details = False  # no --enable-prompt-tokens-details
    prompts = [SimpleNamespace(token_ids=[1] * 7)]
    choices = [SimpleNamespace(prompt_index=0, num_tokens=2), SimpleNamespace(prompt_index=0, num_tokens=1)]


def _whole(env: ChunkEnvelope, choices: list[dict[str, Any]], extra: dict[str, Any]) -> bytes:
    obj = {"id": env.request_id, "object": env.object, "created": env.created, "model": env.model}
    return b"data: " + msgspec.json.encode(obj | {"choices": choices} | extra) + b"\n\n"


@pytest.mark.parametrize("usage", ["omit", "null", "running"])
def test_chunk_bytes(usage: str) -> None:
    env = ChunkEnvelope('chatcmpl-"q\\é日', "chat.completion.chunk", 1_700_000_000, "m/ü", _Gen(), usage)  # type: ignore[arg-type]
    choices = [
        {"index": 0, "delta": {"content": 'a "b"\n\u2028😀'}, "logprobs": None, "finish_reason": None},
    ]
    extra: dict[str, Any] = {}
    if usage != "omit":
        # continuous usage: the chunk's own choice (0), not the total of both
        extra["usage"] = (
            {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9} if usage == "running" else None
        )
    assert env.chunk([dict(c) for c in choices]) == _whole(env, choices, extra)
    final = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert env.usage_chunk(_Gen()) == _whole(env, [], {"usage": final})  # type: ignore[arg-type]
    assert env.chunk([], usage=None, prompt_logprobs=[None, {"1": 2}]) == _whole(
        env, [], {"usage": None, "prompt_logprobs": [None, {"1": 2}]}
    )


def test_full_response_is_encoded_piece_by_piece_with_pauses() -> None:
    """A large non-streamed answer is encoded one choice at a time, letting the event loop run
    between them (a 1 GB answer encoded in one call stopped every other stream for seconds); the
    body is the same JSON as the whole dict's, with ``extra`` fields after ``usage``."""
    import asyncio
    import json
    from types import SimpleNamespace

    from surge.server.serving_common import full_response

    gen = SimpleNamespace(prompt_tokens=3, completion_tokens=5, prompt_tokens_details=False)
    big = [
        {"index": i, "text": "x" * 200_000, "logprobs": {"tokens": [{"t": "a", "p": -0.5}] * 20_000}}
        for i in range(100)
    ]

    async def main() -> tuple[bytes, int]:
        ticks = 0
        done = False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        resp = await full_response("r", "text_completion", 7, "m", big, gen, prompt_logprobs=[None, {"1": 2}])  # type: ignore[arg-type]
        done = True
        await task
        return resp.body, ticks - before

    body, ticks = asyncio.run(main())
    assert ticks > 1, "the event loop ran while the answer was encoded"
    assert json.loads(body) == {
        "id": "r",
        "object": "text_completion",
        "created": 7,
        "model": "m",
        "choices": big,
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
        "prompt_logprobs": [None, {"1": 2}],
    }
    assert list(json.loads(body))[-2:] == ["usage", "prompt_logprobs"]
