"""A scripted fake OpenAI-compatible SSE server (aiohttp) with known delays, for the benchmark tests.

Tokenizer: word level. ``encode(text) = [BOS] + one id per whitespace word`` (``w17`` -> 17, any other
word hashes into [10, 500)); ``decode(ids) = "w<id> w<id> ..."`` without BOS. The "chat template" adds
``CHAT_OVERHEAD`` tokens, and ``NO_THINK_OVERHEAD`` more with ``chat_template_kwargs: {"enable_thinking":
false}``; ``add_special_tokens: false`` drops a completions prompt's BOS (:func:`prompt_tokens`, for
``/tokenize`` and ``usage`` alike); ``/tokenize`` refuses ``tools`` and a prompt holding a lone surrogate with a 400, as Surge's does. Each
request takes the next behaviour of ``script`` (then ``default``):

- ``ok``: TTFT ``ttft`` s, then one chunk every ``itl`` s with ``tokens_per_chunk`` tokens (on a
  timeline fixed at the request's arrival: chunk k is due ``ttft + k * itl`` s after it, so a late
  wake-up on a loaded machine delays one chunk instead of every later one);
- ``short``: like ok but one token short of ``max_tokens``;
- ``http500``: a 500 with an OpenAI error body;
- ``stream_error``: a 200 stream that sends two tokens, then ``data: {"error": {...}}``;
- ``no_usage``: like ok but without the usage chunk;
- ``zero_usage``: like ok but its usage says ``completion_tokens: 0``.

Chat streams can also start with a role-only chunk ``{"role": "assistant", "content": ""}`` sent at
once (``role_chunk``) and end with a separate ``delta: {}`` finish chunk ``itl`` s after the last
token (``finish_chunk``), as some servers do. ``reset_route`` adds ``POST /reset_prefix_cache``
(counted in ``resets``).

Every SSE event is written in two pieces split mid-line, to exercise the client's parser. Runs in a
thread (:class:`FakeServer`) or as a script (``python fake_server.py --port P [--die-after N
[--die-delay S]]``: the N+1-th completion request drops its connection, and the process exits S
seconds later).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import ssl
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

BOS = 1
CHAT_OVERHEAD = 5  # tokens the fake "chat template" adds
NO_THINK_OVERHEAD = (
    4  # ... and with chat_template_kwargs {"enable_thinking": false} (Qwen3's empty think block)
)


def prompt_tokens(body: dict[str, Any], chat: bool, overhead: int = CHAT_OVERHEAD) -> list[int]:
    """The prompt's tokens as the fake server counts them, in /tokenize and in usage alike:
    the chat template (``overhead`` tokens) honours ``chat_template_kwargs.enable_thinking``, a
    completions prompt ``add_special_tokens`` (false: no BOS)."""
    if chat:
        kwargs = body.get("chat_template_kwargs") or {}
        extra = NO_THINK_OVERHEAD if kwargs.get("enable_thinking") is False else 0
        return encode(body["messages"][0]["content"]) + [2] * (overhead + extra)
    ids = encode(body["prompt"])
    return ids[1:] if body.get("add_special_tokens") is False else ids


def encode(text: str) -> list[int]:
    ids = [BOS]
    for w in text.split():
        if w.startswith("w") and w[1:].isdigit():
            ids.append(int(w[1:]))
        else:
            ids.append(10 + zlib.crc32(w.encode()) % 490)
    return ids


def decode(ids: list[int]) -> str:
    return " ".join(f"w{i}" for i in ids if i != BOS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Behaviour:
    ttft: float = 0.2
    itl: float = 0.05
    tokens_per_chunk: int = 1
    script: list[str] = field(default_factory=list)
    default: str = "ok"
    die_after: int | None = None  # exit the process after this many completion requests
    die_delay: float = 0.0  # ... this long after dropping the connection (a slow teardown)
    role_chunk: bool = False
    finish_chunk: bool = False
    reset_route: bool = False
    chat_overhead: int = CHAT_OVERHEAD  # tokens of the chat template (Llama 3.1's: 35)
    root: str | None = "/nonexistent"  # the /v1/models entry's root (None: no root field)
    resets: int = 0
    seen: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)
    # (path, headers by lower-case name) of the other calls (the completions' headers are in ``log``)
    calls: list[tuple[str, dict[str, str]]] = field(default_factory=list)


def make_app(b: Behaviour) -> web.Application:
    async def models(req: web.Request) -> web.Response:
        b.calls.append((req.path, {k.lower(): v for k, v in req.headers.items()}))
        entry: dict[str, Any] = {"id": "fake-model", "object": "model", "max_model_len": 4096}
        if b.root is not None:
            entry["root"] = b.root
        return web.json_response({"object": "list", "data": [entry]})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def tokenize(req: web.Request) -> web.Response:
        b.calls.append((req.path, {k.lower(): v for k, v in req.headers.items()}))
        body = await req.json()
        if "tools" in body:  # as Surge's /tokenize, which takes no tools (unknown fields: a 400)
            err = {"message": "tools: Extra inputs are not permitted", "type": "BadRequestError", "code": 400}
            return web.json_response({"error": err}, status=400)
        text = body["messages"][0]["content"] if "messages" in body else body.get("prompt", "")
        if any(0xD800 <= ord(c) <= 0xDFFF for c in text):  # as Surge's server: not valid Unicode text
            field = "messages" if "messages" in body else "prompt"
            err = {"message": f"{field}: a string holds a lone UTF-16 surrogate", "type": "BadRequestError"}
            return web.json_response({"error": {**err, "code": 400}}, status=400)
        toks = prompt_tokens(
            body, "messages" in body, b.chat_overhead
        )  # the chat template: text, then overhead
        return web.json_response({"tokens": toks, "count": len(toks), "max_model_len": 4096})

    async def detokenize(req: web.Request) -> web.Response:
        body = await req.json()
        return web.json_response({"prompt": decode(body["tokens"])})

    async def send(resp: web.StreamResponse, obj: Any) -> None:
        data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
        half = len(data) // 2
        await resp.write(data[:half])
        await asyncio.sleep(0.001)
        await resp.write(data[half:])

    async def completion(req: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        t_arrival = loop.time()
        arrived = time.perf_counter()  # the benchmark's clock when the server runs in its process

        async def until(offset_s: float) -> None:  # sleep until ``offset_s`` after the arrival
            await asyncio.sleep(max(0.0, t_arrival + offset_s - loop.time()))

        body = await req.json()
        chat = req.path.endswith("/chat/completions")
        mode = b.script[b.seen] if b.seen < len(b.script) else b.default
        b.seen += 1
        b.log.append(
            {
                "path": req.path,
                "body": body,
                "mode": mode,
                "auth": req.headers.get("Authorization"),
                "request_id": req.headers.get("X-Request-Id"),
                "headers": {k.lower(): v for k, v in req.headers.items()},
                "arrived": arrived,
            }
        )
        if b.die_after is not None and b.seen > b.die_after:
            if req.transport is not None:  # the client sees the drop before the process is gone
                req.transport.abort()
            await asyncio.sleep(b.die_delay)
            os._exit(3)
        if mode == "http500":
            err = {
                "error": {
                    "message": "internal boom",
                    "type": "InternalServerError",
                    "param": None,
                    "code": 500,
                }
            }
            return web.json_response(err, status=500)
        max_tokens = int(body.get("max_completion_tokens") or body["max_tokens"])
        n = max_tokens - 1 if mode == "short" else max_tokens
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        obj = "chat.completion.chunk" if chat else "text_completion"
        if chat and b.role_chunk:
            choice0 = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            await send(
                resp, {"id": "x", "object": obj, "created": 0, "model": "fake-model", "choices": [choice0]}
            )
        await until(b.ttft)
        sent = 0
        chunks = 0
        while sent < n:
            k = min(b.tokens_per_chunk, n - sent)
            text = "".join(f" w{100 + (sent + j) % 50}" for j in range(k))
            last = sent + k == n and not (chat and b.finish_chunk)
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
            if chat:
                choice["delta"] = {"content": text}
            else:
                choice["text"] = text
            await send(
                resp, {"id": "x", "object": obj, "created": 0, "model": "fake-model", "choices": [choice]}
            )
            sent += k
            chunks += 1
            if mode == "stream_error" and sent >= 2:
                await send(
                    resp, {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}
                )
                await resp.write_eof()
                return resp
            if sent < n:
                await until(b.ttft + chunks * b.itl)
        if chat and b.finish_chunk:
            await until(b.ttft + chunks * b.itl)
            fin = {"index": 0, "delta": {}, "finish_reason": "length"}
            await send(
                resp, {"id": "x", "object": obj, "created": 0, "model": "fake-model", "choices": [fin]}
            )
        if mode != "no_usage":
            p = len(prompt_tokens(body, chat, b.chat_overhead))
            done = 0 if mode == "zero_usage" else n
            usage = {"prompt_tokens": p, "completion_tokens": done, "total_tokens": p + done}
            await send(
                resp,
                {
                    "id": "x",
                    "object": obj,
                    "created": 0,
                    "model": "fake-model",
                    "choices": [],
                    "usage": usage,
                },
            )
        await send(resp, "[DONE]")
        await resp.write_eof()
        return resp

    async def reset(_: web.Request) -> web.Response:
        b.resets += 1
        return web.json_response({"success": True})

    app = web.Application()
    if b.reset_route:
        app.router.add_post("/reset_prefix_cache", reset)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    # the routes, also behind a proxy's prefix and without /v1 (bench serve's --endpoint)
    for prefix in ("/v1", "/proxy/v1", ""):
        app.router.add_post(f"{prefix}/completions", completion)
        app.router.add_post(f"{prefix}/chat/completions", completion)
    return app


class FakeServer:
    """The fake server on 127.0.0.1 in a background thread; ``url`` is its base URL."""

    def __init__(self, behaviour: Behaviour, ssl_context: ssl.SSLContext | None = None) -> None:
        self.behaviour = behaviour
        self.port = free_port()
        self.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{self.port}"
        self._ssl_context = ssl_context  # serve https with this context's certificate
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        self._runner = web.AppRunner(make_app(self.behaviour))
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self._ssl_context).start()

    def __exit__(self, *exc: object) -> None:
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ttft", type=float, default=0.02)
    ap.add_argument("--itl", type=float, default=0.005)
    ap.add_argument("--die-after", type=int, default=None)
    ap.add_argument("--die-delay", type=float, default=0.0)
    ap.add_argument("--startup-delay", type=float, default=0.3)
    args = ap.parse_args()
    time.sleep(args.startup_delay)
    b = Behaviour(ttft=args.ttft, itl=args.itl, die_after=args.die_after, die_delay=args.die_delay)
    web.run_app(make_app(b), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
