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
