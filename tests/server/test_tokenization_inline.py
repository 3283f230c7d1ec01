"""Small prompts are tokenized on the event loop, larger ones (and tools, request templates,
unbounded counts) on worker threads; both give the same ids and the same 400s."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from surge.server.errors import ApiError
from surge.server.tokenization import TokenizerWorker
from surge.tokenizer import apply_chat_template, load_tokenizer
from tests.conftest import SHARED

QWEN3 = SHARED / "models" / "qwen3-8b"


@pytest.fixture(scope="module")
def tok():  # type: ignore[no-untyped-def]
    return load_tokenizer(QWEN3)


def _worker(tok, inline_chars: int, max_model_len: int = 4096) -> tuple[TokenizerWorker, list[str]]:  # type: ignore[no-untyped-def]
    """A worker whose thread trips are recorded (by the function name sent)."""
    w = TokenizerWorker(tok, max_model_len, None, inline_chars=inline_chars)
    trips: list[str] = []
    real = w.run

    async def spy(fn: Any, *args: Any, utility: bool = False) -> Any:
        trips.append(fn.__name__)
        return await real(fn, *args, utility=utility)

    w.run = spy  # type: ignore[method-assign]
    return w, trips


def test_small_inputs_stay_on_the_loop_large_ones_go_to_a_thread(tok) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        w, trips = _worker(tok, inline_chars=100)
        short, long = "Hello there, how are you?", "word " * 40
        assert await w.encode(short) == tok.encode(short)
        assert await w.encode_many([short, short]) == [tok.encode(short)] * 2
        msgs = [{"role": "user", "content": short}]
        assert await w.render_chat(msgs, True, None) == apply_chat_template(
            tok, msgs, add_generation_prompt=True
        )
        assert trips == []
        assert await w.encode(long) == tok.encode(long)
        assert await w.encode_many([short] * 5) == [tok.encode(short)] * 5  # 125 characters together
        long_msgs = [{"role": "user", "content": long}]
        assert await w.render_chat(long_msgs, True, None) == apply_chat_template(
            tok, long_msgs, add_generation_prompt=True
        )
        assert trips == ["_encode", "_encode_many", "_render_chat"]
        trips.clear()
        # tools, a request's own template and unbounded work (/tokenize) always take a thread
        tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}
        await w.render_chat(msgs, True, None, [tool])
        await w.render_chat(msgs, True, None, chat_template="{{ messages[0]['content'] }}")
        await w.render_chat(msgs, True, None, bound=False)
        await w.encode(short, param=None)
        assert trips == ["_render_chat", "_render_chat", "_render_chat", "_encode"]
        w.close()

    asyncio.run(main())


def test_inline_and_threaded_refuse_alike(tok) -> None:  # type: ignore[no-untyped-def]
    """The cheap context bound and a template that cannot render give the same 400, naming the
    same field, on the loop and on a thread."""

    async def main() -> None:
        text = "word " * 200  # 200 tokens, 1000 characters: past the bound of a 16-token context
        answers = []
        for chars in (10_000, 0):
            w, trips = _worker(tok, inline_chars=chars, max_model_len=16)
            got = []
            for call in (
                w.encode(text),
                w.encode_many(["a", text]),
                w.render_chat([{"role": "user", "content": text}], True, None),
                w.render_chat([{"role": "user", "content": "hi"}], True, {"tools": 3}),
            ):
                with pytest.raises(ApiError) as e:
                    await call
                got.append((e.value.status, e.value.param, e.value.message))
            answers.append(got)
            assert (trips == []) == (chars > 0)
            w.close()
        assert answers[0] == answers[1]
        assert [a[:2] for a in answers[0]] == [
            (400, "prompt"),
            (400, "prompt"),
            (400, "messages"),
            (400, "messages"),
        ]

    asyncio.run(main())


def test_many_small_pieces_and_template_kwargs_go_to_a_thread(tok) -> None:  # type: ignore[no-untyped-def]
    """The inline bound counts the number of prompts and messages and the template kwargs, not
    only characters: many empty prompts, many empty messages, or a large ``chat_template_kwargs``
    value take a thread (each would cost the loop milliseconds to seconds)."""

    async def main() -> None:
        w, trips = _worker(tok, inline_chars=2048)
        await w.encode_many([""] * 5)
        await w.encode_many([""] * 4)
        empty = {"role": "user", "content": ""}
        await w.render_chat([empty] * 17, True, None)
        await w.render_chat([empty] * 16, True, None)
        await w.render_chat([{"role": "user", "content": "hi"}], True, {"note": "x" * 3000})
        await w.render_chat([{"role": "user", "content": "hi"}], True, {"enable_thinking": False})
        big = {"role": "user", "content": [{"type": "text", "text": "y" * 3000}]}
        await w.render_chat([big], True, None)
        assert trips == ["_encode_many", "_render_chat", "_render_chat", "_render_chat"]
        w.close()

    asyncio.run(main())
