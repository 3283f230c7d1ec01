"""The limits of :mod:`surge.server.http_protocol` (header read timeout, connection cap, OpenAI 400
bodies), on a bare uvicorn (no engine), for both parsers: httptools (the server's) and h11 (its
fallback)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from surge.server.http_protocol import (
    MAX_HEAD_BYTES,
    MAX_PIPELINED,
    guarded_h11_protocol,
    guarded_http_protocol,
    guarded_httptools_protocol,
)

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.5


STREAM_GONE: dict[str, threading.Event] = {}
"""``/stream?KEY`` sets ``STREAM_GONE[KEY]`` once its ``receive()`` says the client disconnected."""


async def _stream(receive, send, gone: threading.Event) -> None:  # type: ignore[no-untyped-def]
    """Chunks every 50 ms until the client disconnects (at most 10 s), as an SSE stream runs."""

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.ensure_future(watch())
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for _ in range(200):
        if watcher.done():
            return
        await send({"type": "http.response.body", "body": b"chunk\n", "more_body": True})
        await asyncio.sleep(0.05)
    watcher.cancel()
    await send({"type": "http.response.body", "body": b""})


async def _ok(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    if scope["path"] == "/stream":
        await _stream(receive, send, STREAM_GONE[scope["query_string"].decode()])
        return
    if scope["path"] == "/slow":  # a response that takes a while, as a generation does
        await asyncio.sleep(0.5)
    if scope["path"] == "/stall":  # the event loop blocked, as a busy API process's: reads pile up
        time.sleep(0.5)
    if scope["path"] == "/echo":  # the body back, as the app read it
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    if scope["path"] == "/refuse":  # answered before the body is read, as the guard's 413
        await send({"type": "http.response.start", "status": 413, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"no"})
        return
    more = scope["method"] == "POST"
    while more:  # read the whole body, so that the connection stays usable for the next request
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


MAX_CONNECTIONS = 16
PROTOCOLS = {"httptools": guarded_httptools_protocol, "h11": guarded_h11_protocol}


@pytest.fixture(scope="module", params=sorted(PROTOCOLS))
def parser(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def port(parser: str) -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    config = uvicorn.Config(
        _ok,
        log_config=None,
        timeout_keep_alive=30,  # as surge serve: longer than the header timeout
        http=PROTOCOLS[parser](HEADER_TIMEOUT, MAX_CONNECTIONS, BODY_TIMEOUT),
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


def _read_ok(s: socket.socket) -> bytes:
    """One answer of ``_ok`` (its head and its 2-byte body)."""
    out = b""
    while not out.endswith(b"\r\n\r\nok"):
        chunk = s.recv(4096)
        assert chunk, out
        out += chunk
    return out


def _grow_past_the_cap(s: socket.socket) -> tuple[bytes, bytes]:
    """Send 4 KiB pieces until the server answers (at most twice MAX_HEAD_BYTES), check the
    answer is a 431 and return its head and body. A piece sent as the server closes resets the
    connection; the answer read before the reset is kept (the bytes counted in one read depend
    on how a loaded server's reads fall, so the last piece needed is not known in advance)."""
    for _ in range(2 * MAX_HEAD_BYTES // 4096):
        try:
            s.sendall(b"a" * 4096)
        except (BrokenPipeError, ConnectionResetError):
            break
        if select.select([s], [], [], 0.005)[0]:
            break
    answer = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := s.recv(4096):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431"), answer[:200]
    return head, body


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
        # a chunked body that turns malformed while the app waits for its end
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\nzz\r\n\r\n",
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


def test_the_server_parses_with_httptools() -> None:
    """httptools is a dependency, so the server runs its protocol, not the h11 fallback."""
    protocol, parser = guarded_http_protocol(HEADER_TIMEOUT, MAX_CONNECTIONS)
    assert parser == "httptools"
    assert protocol.__name__ == "GuardedHttpToolsProtocol"


def test_a_keep_alive_request_is_answered_and_the_next_partial_head_gets_408(port: int) -> None:
    """The next request's clock starts at its first byte, not when the connection opened."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        first = _read_ok(s)
        assert first.startswith(b"HTTP/1.1 200"), first
        time.sleep(HEADER_TIMEOUT * 1.5)  # idle past the header timeout: only keep-alive's clock runs
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        second = _read_ok(s)
        assert second.startswith(b"HTTP/1.1 200"), second
        t0 = time.monotonic()
        s.sendall(b"GET / HTTP/1.1\r\nHo")
        answer = _read_until_closed(s)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert HEADER_TIMEOUT * 0.5 < time.monotonic() - t0 < HEADER_TIMEOUT + 3


def test_a_silent_connection_is_closed_without_an_answer(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        t0 = time.monotonic()
        answer = _read_until_closed(s)
    assert answer == b""
    assert time.monotonic() - t0 < HEADER_TIMEOUT + 3


def test_a_connection_over_the_cap_gets_503(port: int) -> None:
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)  # every held connection is accepted before the next one
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            answer = _read_until_closed(s)
    finally:
        for h in held:
            h.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), answer
    assert "--max-connections" in json.loads(body)["error"]["message"]


def test_a_head_growing_past_the_cap_is_refused(port: int, parser: str) -> None:
    """A head still incomplete after MAX_HEAD_BYTES gets httptools' protocol's 431 (llhttp would
    buffer any size)."""
    if parser != "httptools":
        pytest.skip("h11 refuses an incomplete head over 16 KiB itself, before this test's cap")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
        _, body = _grow_past_the_cap(s)
    assert f"exceed {MAX_HEAD_BYTES} bytes" in json.loads(body)["error"]["message"]


def test_bodies_do_not_count_as_head_bytes(port: int) -> None:
    """Two pipelined requests with 1 MiB bodies, in one send: both answered."""
    body = b"x" * (1 << 20)
    request = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    last = request.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request + last)
        answer = _read_until_closed(s)
    assert answer.count(b"HTTP/1.1 200") == 2, answer[:300]


def test_a_keep_alive_connection_sending_only_blank_lines_is_closed_in_time(port: int) -> None:
    """llhttp skips blank lines before a request line without starting a message, and every read
    cancels uvicorn's keep-alive timer: the next request's clock starts at any byte, or a client
    sending "\\r\\n" would hold the connection under neither clock. (h11 answers a 400 at once.)"""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        _read_ok(s)
        t0 = time.monotonic()
        s.sendall(b"\r\n")
        answer = _read_until_closed(s)
    assert b"200" not in answer, answer
    assert time.monotonic() - t0 < HEADER_TIMEOUT + 3


def test_a_stream_learns_of_its_clients_disconnect_with_a_pipelined_request_queued(
    port: int, parser: str
) -> None:
    """A stream whose client pipelined a second request and then hung up gets ``http.disconnect``
    (Surge aborts the request in the engine on it). llhttp parses the queued request at once and
    uvicorn marks only the newest request's cycle as disconnected; h11 parses the second request
    only after the first one's response."""
    key = f"pipelined-{parser}"
    STREAM_GONE[key] = threading.Event()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            b"GET /stream?%s HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n" % key.encode()
        )
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
    assert STREAM_GONE[key].wait(5), "the stream never got http.disconnect"


def test_a_malformed_request_pipelined_behind_a_valid_one_is_answered_after_it(port: int) -> None:
    """As h11 answers pipelined requests in order: the valid request's 200, then the 400. llhttp
    parses both at once, and uvicorn's 400 went out (and closed the connection) first."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nBL\x01AH / HTTP/1.1\r\n\r\n")
        answer = _read_until_closed(s)
    first, _, rest = answer.partition(b"\r\n\r\nok")
    assert first.startswith(b"HTTP/1.1 200"), answer
    assert rest.startswith(b"HTTP/1.1 400"), answer


def test_a_head_past_the_cap_pipelined_behind_a_valid_request_is_answered_after_it(
    port: int, parser: str
) -> None:
    """The 431 of a head that grows past the cap while an earlier response is still being made
    goes out after that response, not in its place."""
    if parser != "httptools":
        pytest.skip("h11 reads a pipelined head only once the response before it is sent")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
        # twice the cap (the head's bytes read with the first request go uncounted), all read
        # well within /slow's 0.5 s, before the server closes
        for _ in range(2 * MAX_HEAD_BYTES // 4096):
            s.sendall(b"a" * 4096)
            time.sleep(0.002)
        answer = _read_until_closed(s)
    first, _, rest = answer.partition(b"\r\n\r\nok")
    assert first.startswith(b"HTTP/1.1 200"), answer[:300]
    assert rest.startswith(b"HTTP/1.1 431"), answer[:300]


def test_trailer_fields_growing_past_the_cap_are_refused(port: int, parser: str) -> None:
    """A chunked body's trailer fields are capped as a head is: httptools accumulates a trailer
    field of any size (and uvicorn appends it to the request's headers) while the app waits for
    the body's end."""
    if parser != "httptools":
        pytest.skip("h11 refuses trailers over 16 KiB itself (a 400), before this test's cap")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\nX-Big: ")
        time.sleep(0.05)  # a read of its own: bytes read with the head are not counted
        _, body = _grow_past_the_cap(s)
    assert "trailer" in json.loads(body)["error"]["message"]


def test_a_chunked_body_of_tiny_chunks_is_not_taken_for_trailers(port: int) -> None:
    """Chunk framing between body bytes does not add up: 64 Ki one-byte chunks (six bytes of
    framing each) are read as a body."""
    chunks = b"1\r\nx\r\n" * (1 << 16)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            + chunks
            + b"0\r\n\r\n"
        )
        answer = _read_until_closed(s)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_tiny_chunks_read_in_large_reads_are_not_taken_for_trailers(port: int) -> None:
    """As above, with the server's event loop stalled while the body is sent (a loaded machine),
    so that it reads the body in reads of up to 256 KiB: framing is counted from a read's last
    body byte, not over the whole read (a read with over 64 KiB of framing between its body
    bytes was refused as trailers too large, and the unread rest reset the connection)."""
    chunks = b"1\r\nx\r\n" * (1 << 16)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as stall,
        socket.create_connection(("127.0.0.1", port), timeout=10) as s,
    ):
        stall.sendall(b"GET /stall HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        time.sleep(0.1)  # the server is in /stall's sleep
        s.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            + chunks
            + b"0\r\n\r\n"
        )
        answer = _read_until_closed(s)
        assert _read_until_closed(stall).startswith(b"HTTP/1.1 200")
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_trailer_fields_over_the_cap_in_one_read_with_the_body_are_refused(port: int, parser: str) -> None:
    """Trailers that arrive in the same read as the body's end (the event loop stalled while
    they were sent) are not counted read by read: their whole size is checked once the body
    ends, so 120 KB of trailer fields is a 431, not 60,000 headers handed to the app."""
    if parser != "httptools":
        pytest.skip("h11 refuses trailers over 16 KiB itself (a 400), before this test's cap")
    trailers = b"".join(b"X-T%d: v\r\n" % i for i in range(12_000))
    assert MAX_HEAD_BYTES < len(trailers) < 200_000
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as stall,
        socket.create_connection(("127.0.0.1", port), timeout=10) as s,
    ):
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n")
        time.sleep(0.1)  # a read of its own
        stall.sendall(b"GET /stall HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        time.sleep(0.1)  # the server is in /stall's sleep: what follows comes in one read
        s.sendall(b"1\r\ny\r\n0\r\n" + trailers + b"\r\n")
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(4096):
                answer += chunk
        assert _read_until_closed(stall).startswith(b"HTTP/1.1 200")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431"), answer[:200]
    assert "trailer" in json.loads(body)["error"]["message"]


def _refused_with_body_to_come(s: socket.socket, size: int) -> None:
    """Send a request head declaring a ``size``-byte body to ``/refuse`` and read its 413."""
    s.sendall(b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
    answer = b""
    while not answer.endswith(b"\r\n\r\nno"):
        chunk = s.recv(4096)
        assert chunk, answer
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer


def test_a_body_trickled_after_its_answer_is_cut_off_in_time(port: int) -> None:
    """A request answered before its body was read (the guard's 413 keeps the connection to read
    and drop the body): the rest of the body must come within the body timeout. Every byte read
    stops uvicorn's keep-alive clock, so a client trickling it held the connection for ever."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        _refused_with_body_to_come(s, 10_000)
        t0 = time.monotonic()
        closed = False
        while time.monotonic() - t0 < BODY_TIMEOUT + 4:
            try:
                s.sendall(b"a")
            except OSError:  # reset: the server closed it
                closed = True
                break
            s.settimeout(0.2)
            try:
                if s.recv(4096) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except OSError:
                closed = True
                break
    assert closed, "the connection outlived the body timeout"
    assert time.monotonic() - t0 > BODY_TIMEOUT * 0.5


def test_a_connection_whose_answered_body_came_in_full_serves_the_next_request(port: int) -> None:
    """The rest of an answered request's body came in time, with the next request's head and the
    start of its body in the same packet: the connection carries on (the body clock of the answered
    request does not cut the next one's body, which this app gives all the time it takes), and a
    request after an idle spell longer than the body timeout is answered too."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        _refused_with_body_to_come(s, 10)
        s.sendall(b"0123456789" + b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
        time.sleep(BODY_TIMEOUT + 0.5)
        s.sendall(b"cd")
        assert _read_ok(s).startswith(b"HTTP/1.1 200")
        time.sleep(BODY_TIMEOUT + 0.5)
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_ok(s).startswith(b"HTTP/1.1 200")


H2C = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
"""What ``curl --http2`` adds to a plain-HTTP request: an upgrade to HTTP/2 the server may ignore."""


@pytest.mark.parametrize(
    "framing, body",
    [
        (b"Content-Length: 13\r\n", b'{"prompt":1}\n'),
        (b"Transfer-Encoding: chunked\r\n", b'5\r\n{"a":\r\n2\r\n1}\r\n0\r\n\r\n'),
    ],
)
def test_an_upgrade_to_h2c_is_ignored_and_the_body_read(port: int, framing: bytes, body: bytes) -> None:
    """``curl --http2`` against an http:// URL asks to upgrade to h2c. The server ignores the
    upgrade (RFC 9110 section 7.8) and reads the body as HTTP/1.1: llhttp took the body for the
    new protocol's bytes, so the app saw an empty body (a 400 "The request body is empty"); the
    connection then serves the next request."""
    expected = b'{"prompt":1}\n' if framing.startswith(b"Content-Length") else b'{"a":1}'
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\n" + H2C + framing + b"\r\n" + body)
        answer = b""
        while not answer.endswith(expected):
            chunk = s.recv(4096)
            assert chunk, answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert answer.endswith(b"\r\n\r\n" + expected), answer
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _read_until_closed(s).startswith(b"HTTP/1.1 200")


def test_a_plain_connection_parses_with_uvicorns_own_per_header_callbacks() -> None:
    """llhttp calls ``on_url`` and ``on_header`` for every request (``on_header`` once per header):
    the guarded protocol leaves them uvicorn's, so a plain connection pays no Python frame more per
    header (the h2c upgrade's skipped framing head has callbacks of its own on upgraded
    connections); overriding both cost each request about 1 us, 9 % of the protocol's intake."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    protocol = guarded_httptools_protocol(HEADER_TIMEOUT, MAX_CONNECTIONS, BODY_TIMEOUT)
    for callback in ("on_url", "on_header"):
        assert getattr(protocol, callback) is getattr(HttpToolsProtocol, callback), callback


def test_an_upgrade_to_h2c_without_a_body_keeps_the_connection_usable(port: int) -> None:
    """A GET that asks for h2c, with the next request in the same packet: both are answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            b"GET / HTTP/1.1\r\nHost: x\r\n" + H2C + b"\r\n"
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
        )
        answer = _read_until_closed(s)
    assert answer.count(b"HTTP/1.1 200") == 2, answer
    assert answer.endswith(b"\r\n\r\nhi"), answer


def test_a_malformed_body_after_its_answer_closes_the_connection_quietly(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A chunked body that turns malformed after its request was answered (the guard answers a
    401 before reading the body): the connection is closed. h11's fallback tried to send its 400
    after the complete response, and h11 raised (an asyncio "Fatal error" traceback in the log)."""
    with caplog.at_level(logging.ERROR):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /refuse HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            first = b""
            while not first.endswith(b"\r\n\r\nno"):
                chunk = s.recv(4096)
                assert chunk, first
                first += chunk
            s.sendall(b"zz\r\n\r\n")
            assert b"HTTP/1.1" not in _read_until_closed(s)  # no answer after the complete one
        time.sleep(0.2)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_requests_pipelined_past_the_cap_are_refused_after_the_rest(port: int, parser: str) -> None:
    """A client pipelining more requests than MAX_PIPELINED behind the one being served: the
    first MAX_PIPELINED + 1 are answered in order, then a 503 says the rest were not served and
    the connection closes. Without the cap, llhttp queued every request of every read (one
    connection pipelining without end grew the API process by 70 MiB/s while each response got
    slower)."""
    if parser != "httptools":
        pytest.skip("h11 parses a pipelined request only once the response before it is sent")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n" + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 200)
        answer = _read_until_closed(s)
    assert answer.count(b"HTTP/1.1 200") == MAX_PIPELINED + 1, answer[-300:]
    last = answer[answer.rindex(b"HTTP/1.1 ") :]
    head, _, body = last.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), last
    assert f"More than {MAX_PIPELINED} requests were pipelined" in json.loads(body)["error"]["message"]


def test_requests_pipelined_up_to_the_cap_are_all_answered(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        last = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        s.sendall(
            b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
            + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * (MAX_PIPELINED - 1)
            + last
        )
        answer = _read_until_closed(s)
    assert answer.count(b"HTTP/1.1 200") == MAX_PIPELINED + 1, answer[-300:]
    assert b"503" not in answer


def test_many_h2c_requests_in_one_read_are_parsed_without_recursion(
    port: int, parser: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Thousands of requests asking for h2c in one packet: each upgrade ignored in a loop (a
    recursion per request overflowed Python's stack, an asyncio traceback), the pipelining cap
    applying as to any request."""
    if parser != "httptools":
        pytest.skip("h11 parses a pipelined request only once the response before it is sent")
    with caplog.at_level(logging.ERROR):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(
                b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
                + (b"GET / HTTP/1.1\r\nHost: x\r\n" + H2C + b"\r\n") * 3000
            )
            answer = _read_until_closed(s)
        time.sleep(0.2)
    assert answer.count(b"HTTP/1.1 200") == MAX_PIPELINED + 1, answer[-300:]
    assert b"HTTP/1.1 503" in answer
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
