"""A choice's text is gathered in pieces and joined once, not grown by ``+=`` at every token:
``+=`` on an attribute copies all the text so far, so a long output cost the API process CPU
quadratic in its length (for every choice of an ``n`` request). Each test hands out text pieces
whose ``+`` counts the characters it copies; joining the pieces copies none that way."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import pytest
from transformers import AutoTokenizer

from surge.core.outputs import EngineOutput, SchedulerStats
from surge.engine.client import EngineClient
from surge.sampling_params import SamplingParams
from surge.server import serving_messages, serving_responses
from surge.server.generation import Generation
from surge.server.metrics import ServerMetrics
from surge.server.parsers.forced import NamedToolParser
from surge.server.serving_messages import _Blocks
from surge.server.serving_responses import _StreamEvents
from tests.conftest import STORIES


class _Copies:
    """Counts the characters that ``text + piece`` copies."""

    def __init__(self) -> None:
        self.chars = 0

    def piece(self, text: str) -> str:
        """``text`` as a str whose ``left + it`` is counted (Python tries a subclass's ``__radd__``
        before ``str.__add__``)."""
        copies = self

        class Piece(str):
            def __radd__(self, left: str) -> str:
                copies.chars += len(left) + len(self)
                return str.__add__(left, self)

        return Piece(text)


class _SilentClient:
    def add_request(self, *_: Any, **__: Any) -> int:
        return 0

    def abort_requests(self, ids: list[str]) -> None:
        pass


def test_a_choice_text_held_for_its_final_delta_is_joined_once() -> None:
    """Under the non-streamed path's ``stream_interval`` a choice's text waits for the final
    delta: 2,000 tokens' pieces reach it whole, joined once."""
    copies = _Copies()

    async def main() -> str:
        metrics = ServerMetrics("m", lambda: SchedulerStats(0, 0, 0.0, 10, 10, 0), max_model_len=4096)
        tok = AutoTokenizer.from_pretrained(STORIES)
        gen = Generation(cast(EngineClient, _SilentClient()), tok, metrics, 2**31, 0.0, eos_token_ids=(2,))
        gen.add_prompt("r", [1, 5], SamplingParams(max_tokens=2000))
        choice = gen.choices[0]
        pieces = iter(copies.piece(f"w{i} ") for i in range(2000))
        choice.detokenizer = cast(
            Any, SimpleNamespace(update=lambda *_: next(pieces), flush=lambda: "", stop_matched=None)
        )
        for i in range(2000):
            finish = "length" if i == 1999 else None
            gen._queue.put_nowait((0, EngineOutput(choice.request_id, [7], finish)))
        text = ""
        async for deltas in gen.deltas():
            text += "".join(d.text for d in deltas)
        return text

    text = asyncio.run(main())
    assert text == "".join(f"w{i} " for i in range(2000))
    assert copies.chars <= 2 * len(text), f"{copies.chars} characters copied for {len(text)}"


def test_a_streamed_response_item_and_message_block_join_their_text_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Responses API's open item and the Messages API's open block keep their text for their
    ``done`` / ``stop`` event: 2,000 deltas' pieces, joined once."""
    encode = msgspec.json.Encoder(enc_hook=str).encode  # the pieces are str subclasses
    monkeypatch.setattr(serving_responses, "_json_encode", encode)
    monkeypatch.setattr(serving_messages, "_json_encode", encode)
    for kind in ("content", "reasoning"):
        copies = _Copies()
        shape = SimpleNamespace(prepared=SimpleNamespace(lp=SimpleNamespace(logprobs=None)))
        events = _StreamEvents(cast(Any, shape))
        blocks = _Blocks()
        for i in range(2000):
            events.feed({kind: copies.piece(f"w{i} ")}, None)
            blocks.feed({kind: copies.piece(f"w{i} ")})
        events.close_item()
        blocks.close()
        text = "".join(f"w{i} " for i in range(2000))
        assert events.items[0]["content"][0]["text"] == text
        assert copies.chars <= 2 * len(text), f"{kind}: {copies.chars} characters copied for {len(text)}"


def test_a_named_tool_choice_answer_is_joined_once() -> None:
    """A named ``tool_choice``'s answer (white space held until the call opens, then its
    arguments) is kept in pieces: grown by ``+=`` and stripped whole at every piece, 128,000
    characters of white space took 0.68 s of the API process's CPU."""
    copies = _Copies()
    parser = NamedToolParser("f")
    space = [copies.piece(" \n") for _ in range(2000)]
    args = [copies.piece('{"a": "'), *(copies.piece("xy") for _ in range(2000)), copies.piece('"}')]
    released = [parser.feed(p) for p in space + args] + [parser.finish()]
    text = "".join(space + args)
    assert "".join(t.arguments for d in released for t in d.tool_calls) == text
    assert parser.calls_complete()
    assert copies.chars <= 2 * len(text), f"{copies.chars} characters copied for {len(text)}"
