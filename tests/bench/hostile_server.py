"""A raw-socket HTTP/1.1 server that misbehaves on purpose, for the benchmark client's tests.

It answers ``GET /v1/models``, ``POST /tokenize`` and ``POST /detokenize`` like :mod:`fake_server`
(same word-level tokenizer; the first two answers can be replaced), and each ``POST
/v1/chat/completions`` or ``/v1/completions`` with the next behaviour of ``script`` (then
``default``): a function ``(chat, body) -> list of pieces``, each written on its own after a short
pause (a float piece waits that many seconds instead), then the connection is closed. The byte
pieces are the raw HTTP response, so a behaviour can cut a stream, drop ``[DONE]``, send a bad
status line or close without answering; an answer without ``Connection: close`` keeps the
connection for the next request. Helpers build the usual parts: :func:`stream` (a chunked
or close-delimited ``text/event-stream``), :func:`event`, :func:`token`, :func:`usage`.

Runs on 127.0.0.1 at a free port in a background thread (:class:`HostileServer`).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

from fake_server import decode, prompt_tokens

Piece = bytes | float
Behaviour = Callable[[bool, dict[str, Any]], list[Piece]]


def event(obj: Any) -> bytes:
    """One SSE event: ``data: <JSON or text>`` and a blank line."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


def token(chat: bool, text: str, index: int = 0) -> dict[str, Any]:
    """A chunk of one choice carrying ``text`` (chat delta or completions text)."""
    choice: dict[str, Any] = {"index": index, "finish_reason": None}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    return {"id": "x", "object": "chunk", "created": 0, "model": "m", "choices": [choice]}


def usage(completion_tokens: Any, prompt_tokens: Any = 5) -> dict[str, Any]:
    """The usage chunk (no choices) with the given counts, as sent with ``include_usage``."""
    counts = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    return {"id": "x", "object": "chunk", "created": 0, "model": "m", "choices": [], "usage": counts}


def tokens(chat: bool, n: int) -> list[bytes]:
    """``n`` events of one token each."""
    return [event(token(chat, f" w{100 + i}")) for i in range(n)]


def stream(
    events: list[bytes], chunked: bool = True, end: bool = True, keep_alive: bool = False
) -> list[Piece]:
    """A 200 ``text/event-stream`` response carrying ``events``: HTTP chunked (ended by the
    zero-length chunk unless ``end`` is false: the connection then drops mid-body) or
    close-delimited (``chunked`` false: the body ends when the connection closes). With
    ``keep_alive`` (chunked only) the server keeps the connection for the next request."""
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    if not (keep_alive and chunked):
        head += "Connection: close\r\n"
    if not chunked:
        return [(head + "\r\n").encode(), *events]
    pieces: list[Piece] = [(head + "Transfer-Encoding: chunked\r\n\r\n").encode()]
    pieces += [f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events]
    if end:
        pieces.append(b"0\r\n\r\n")
    return pieces


def response(
    status: int, body: bytes, content_type: str = "application/json", reason: str = "X"
) -> list[Piece]:
    """A whole response with a ``Content-Length`` body."""
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return [head.encode() + body]


def ok(chat: bool, body: dict[str, Any]) -> list[Piece]:
    """A well-behaved stream of the asked length, with usage and ``[DONE]``."""
    n = int(body.get("max_completion_tokens") or body["max_tokens"])
    p = len(prompt_tokens(body, chat))
    return stream([*tokens(chat, n), event(usage(n, p)), event("[DONE]")])


class HostileServer:
    """The server in a background thread; ``url`` is its base URL, ``seen`` the completion
    requests it took, ``connections`` the TCP connections it accepted."""

    def __init__(
        self,
        script: list[Behaviour],
        default: Behaviour = ok,
        models: Any = None,
        tokenize: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        self.script = list(script)
        self.default = default
        self.models = models  # the /v1/models answer; None: fake-model
        self.tokenize = tokenize  # the /tokenize answer of a request body; None: fake_server's
        self.seen = 0
        self.connections = 0  # TCP connections accepted
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> HostileServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:  # the server, then the answers still being written
            assert self._server is not None
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            keep_alive = True
            while keep_alive:  # requests on this connection, until an answer closes it
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                method, path = head.split(" ", 2)[:2]
                length = 0
                for line in head.split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = json.loads(await reader.readexactly(length)) if length else {}
                pieces = self._answer(method, path, body)
                first = pieces[0] if pieces else None
                keep_alive = isinstance(first, bytes) and b"Connection: close" not in first
                for piece in pieces:
                    if isinstance(piece, float):
                        await asyncio.sleep(piece)
                        continue
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.002)  # pieces arrive in separate reads
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # the server stops (asyncio would log a cancelled handler)
            pass
        finally:
            writer.close()

    def _answer(self, method: str, path: str, body: dict[str, Any]) -> list[Piece]:
        if method == "GET" and path == "/v1/models":
            entry = {"id": "fake-model", "object": "model", "root": "/nonexistent", "max_model_len": 4096}
            models = {"object": "list", "data": [entry]} if self.models is None else self.models
            return response(200, json.dumps(models).encode())
        if method == "POST" and path == "/tokenize":
            if self.tokenize is not None:
                return response(200, json.dumps(self.tokenize(body)).encode())
            toks = prompt_tokens(body, "messages" in body)
            return response(
                200, json.dumps({"tokens": toks, "count": len(toks), "max_model_len": 4096}).encode()
            )
        if method == "POST" and path == "/detokenize":
            return response(200, json.dumps({"prompt": decode(body["tokens"])}).encode())
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            behaviour = self.script[self.seen] if self.seen < len(self.script) else self.default
            self.seen += 1
            return behaviour(path == "/v1/chat/completions", body)
        return response(404, b'{"error": {"message": "not found"}}')
