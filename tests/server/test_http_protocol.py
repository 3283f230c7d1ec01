"""The header read timeout of :mod:`surge.server.http_protocol`, on a bare uvicorn (no engine)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from surge.server.http_protocol import guarded_h11_protocol

HEADER_TIMEOUT = 1.0


async def _ok(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    config = uvicorn.Config(
        _ok,
        log_config=None,
        timeout_keep_alive=30,  # as surge serve: longer than the header timeout
        http=guarded_h11_protocol(HEADER_TIMEOUT, 16),
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(10)
    sock.close()


def _read_until_closed(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(4096):
        out += chunk
    return out


def test_partial_head_sent_alone_gets_408(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        answer = _read_until_closed(s)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert time.monotonic() - t0 < HEADER_TIMEOUT + 3


def test_pipelined_partial_head_gets_408_in_time(port: int) -> None:
    """A complete request with the start of the next one in the same packet: the next head's
    clock starts once the first response is sent, not at the keep-alive timeout (30 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHo")
        answer = _read_until_closed(s)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert b"HTTP/1.1 408" in answer, answer
    assert time.monotonic() - t0 < HEADER_TIMEOUT + 3


def test_pipelined_complete_requests_are_both_answered(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = _read_until_closed(s)
    assert answer.count(b"HTTP/1.1 200") == 2, answer
    assert b"408" not in answer


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nab",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 64,  # a TLS ClientHello
    ],
)
def test_a_malformed_request_gets_an_openai_error_body(port: int, request_bytes: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request_bytes)
        answer = _read_until_closed(s)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer
    assert b"content-type: application/json" in head.lower(), head
    assert json.loads(body) == {
        "error": {
            "message": "Invalid HTTP request received.",
            "type": "invalid_request_error",
            "param": None,
            "code": 400,
        }
    }
