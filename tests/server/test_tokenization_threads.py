"""Every prompt is templated and tokenized on a worker thread, however short: generation
prompts on the generation threads, unbounded work (``/tokenize``, truncated prompts) on the
utility thread; the ids are the tokenizer's and a prompt that cannot fit is a 400 naming its
field."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from surge.server.errors import ApiError
from surge.server.tokenization import TokenizerWorker
from surge.tokenizer import apply_chat_template, load_tokenizer


@pytest.fixture(scope="module")
def tok(qwen3_8b_dir: Path):  # type: ignore[no-untyped-def]
    return load_tokenizer(qwen3_8b_dir)


_POOLS = {"surge-tokenizer": False, "surge-tokenize-route": True}
"""Thread-name prefix of each pool -> whether it is the utility pool."""


def _worker(tok, max_model_len: int = 4096) -> tuple[TokenizerWorker, list[tuple[str, bool]]]:  # type: ignore[no-untyped-def]
    """A worker whose work is recorded as (function name, utility pool) by the thread that ran
    it: work run on the event loop's thread records no pool and fails the test."""
    w = TokenizerWorker(tok, max_model_len, None)
    trips: list[tuple[str, bool]] = []
    real = w.run

    async def spy(fn: Any, *args: Any, utility: bool = False) -> Any:
        def traced(*a: Any) -> Any:
            name = threading.current_thread().name
            pools = [u for prefix, u in _POOLS.items() if name.startswith(prefix + "_")]
            assert pools == [utility], f"{fn.__name__} ran on thread {name!r}"
            trips.append((fn.__name__, pools[0]))
            return fn(*a)

        traced.__name__ = fn.__name__
        return await real(traced, *args, utility=utility)

    w.run = spy  # type: ignore[method-assign]
    return w, trips


def test_every_prompt_takes_a_thread(tok) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        w, trips = _worker(tok)
        short, long = "Hi", "word " * 400
        assert await w.encode(short) == tok.encode(short)
        assert await w.encode("") == tok.encode("")
        assert await w.encode(long) == tok.encode(long)
        assert await w.encode_many([short, short]) == [tok.encode(short)] * 2
        msgs = [{"role": "user", "content": short}]
        ids, text = await w.render_chat(msgs, True, None)
        assert ids == apply_chat_template(tok, msgs, add_generation_prompt=True)
        assert text == tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        gen = ("_encode", False)
        assert trips == [gen, gen, gen, ("_encode_many", False), ("_render_chat", False)]
        trips.clear()
        tool = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}
        await w.render_chat(msgs, True, None, [tool])
        await w.render_chat(msgs, True, None, chat_template="{{ messages[0]['content'] }}")
        # unbounded work (/tokenize, truncate_prompt_tokens) goes to the utility thread
        await w.render_chat(msgs, True, None, bound=False)
        await w.encode(short, param=None)
        await w.encode_many([short], param=None)
        assert await w.decode(tok.encode(short)) == short
        assert trips == [
            ("_render_chat", False),
            ("_render_chat", False),
            ("_render_chat", True),
            ("_encode", True),
            ("_encode_many", True),
            ("decode", True),
        ]
        w.close()

    asyncio.run(main())


def test_refusals_name_the_field(tok) -> None:  # type: ignore[no-untyped-def]
    """The cheap context bound and a template that cannot render are 400s naming the field,
    raised from the worker thread."""

    async def main() -> None:
        text = "word " * 200  # 200 tokens, 1000 characters: past the bound of a 16-token context
        w, trips = _worker(tok, max_model_len=16)
        got = []
        for call in (
            w.encode(text),
            w.encode_many(["a", text]),
            w.render_chat([{"role": "user", "content": text}], True, None),
            w.render_chat([{"role": "user", "content": "hi"}], True, {"tools": 3}),
        ):
            with pytest.raises(ApiError) as e:
                await call
            got.append((e.value.status, e.value.param))
        assert got == [(400, "prompt"), (400, "prompt"), (400, "messages"), (400, "messages")]
        assert len(trips) == 4
        w.close()

    asyncio.run(main())
