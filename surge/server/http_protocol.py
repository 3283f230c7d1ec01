"""uvicorn's HTTP protocols with the two limits they lack: a header read timeout and a connection cap.

The server parses HTTP with httptools (llhttp, in C; uvicorn's default when it is installed, as under
vLLM) and falls back to h11 (pure Python) where httptools is missing
(:func:`guarded_http_protocol`). Both get the same limits. httptools takes a burst in faster: on CPU
(``benchmarks/intake_burst.py``, 64 chat requests streaming 256 tokens each) the API process spent
18 % less CPU per burst and the burst's mean time to first token was 12 % shorter than with h11.

uvicorn times out idle keep-alive connections (``timeout_keep_alive``) but not a client that
opens a connection and sends its request line and headers a byte at a time (slowloris), and its
``limit_concurrency`` answers a plain-text 503 only once a whole request has been read. Here:

- **Header read timeout**: from the moment a connection opens, or a keep-alive connection gets
  the first byte of its next request, the request head must be complete within
  ``header_timeout`` seconds. Otherwise the connection gets a 408 (or, if the client sent
  nothing at all, is simply closed).
- **Head size cap** (httptools): a request whose line and headers are still incomplete after
  :data:`MAX_HEAD_BYTES` gets a 431 and the connection is closed. llhttp buffers a head of any
  size, so without it one client could fill the API process's memory for as long as the header
  read timeout lets it send; h11 refuses an incomplete head over 16 KiB by itself (a 400). The
  same cap holds a chunked body's trailer fields (and chunk framing) read after the read holding
  its last body byte, and the trailer fields' whole size once the body ends.
- **Body drain timeout**: a request answered before its body was read (a 413 for a declared
  body over the limit, a 401) keeps its connection open while the rest of the body is read and
  dropped, so that the client sees the answer; that rest must arrive within ``body_timeout``
  seconds of the answer, else the connection is closed (uvicorn's keep-alive clock stops at
  every byte read, so a client trickling the body would hold the connection for ever), and the
  connection is then idle under uvicorn's keep-alive clock, as after any response.
- **Connection cap**: a connection beyond ``max_connections`` open ones is answered at once with
  a 503 OpenAI error body naming ``--max-connections`` and closed, before anything is read.
- **Malformed requests**: a request the parser cannot parse gets uvicorn's 400 as an OpenAI error
  body (uvicorn's is plain text). Under httptools, that 400 and the 431 go out after the
  responses to the requests pipelined before it, as under h11 (llhttp parses everything it reads).
- **Upgrades** (httptools): a request asking to switch protocols (``curl --http2`` asks for
  ``Upgrade: h2c`` on an http:// URL) is served as HTTP/1.1, its upgrade ignored (RFC 9110
  section 7.8), as h11 serves it. llhttp ends such a request at its head and leaves the rest of
  the stream to the new protocol, so under uvicorn's own protocol (vLLM's server's) its body
  never reaches the app (a 400 "The request body is empty") and nothing after it is parsed; here
  the body is read and the next requests parsed.
- **Pipelining cap** (httptools): past :data:`MAX_PIPELINED` requests queued behind the one being
  served, the later ones are dropped unanswered and, after the responses to those kept, a 503
  says so and closes the connection (a client retries unanswered requests on a new one). One
  connection pipelining without end made the queue, the API process's memory (70 MiB/s) and each
  response's cost grow without bound. h11 parses a pipelined request only once the response
  before it is sent, so it holds the bytes of one read at most.
- **Disconnects** (httptools): a client that hangs up is reported (``http.disconnect``) to every
  request of the connection still running, not only to the newest one uvicorn tracks, so a stream
  with a pipelined request queued behind it is still aborted in the engine.

The body read timeout and size limit live in :mod:`surge.server.guard`.

Both classes lean on uvicorn's private internals (``_feed`` re-implements httptools'
``data_received``): pyproject.toml bounds uvicorn to the versions checked against this module, and
``tests/server/test_uvicorn_internals.py`` fails on a uvicorn whose methods it relies on changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from surge.server.errors import error_body

MAX_HEAD_BYTES = 64 * 1024
"""Bytes of a still incomplete request head (request line and headers) the httptools protocol
reads before it answers 431 (a whole head that arrives in one read is parsed, as h11 does);
browsers send under 16 KiB, nginx reads at most 32 KiB."""

MAX_PIPELINED = 64
"""Requests of one connection the httptools protocol queues behind the one being served (HTTP/1.1
pipelining; browsers and HTTP client libraries do not pipeline). llhttp parses every request a
read holds, and each response (each body read) lets another read in, so a client pipelining
without end grew the queue without bound; serving it, whose cost grew with the queue, slowed to
a few responses a second."""


def _raw_response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps(error_body(status, message)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def _limit_answers(header_timeout: float, max_connections: int) -> tuple[bytes, bytes]:
    """The raw 503 for a connection over ``max_connections`` and the raw 408 for a head that
    took longer than ``header_timeout`` seconds."""
    refusal = _raw_response(
        503,
        "Service Unavailable",
        f"The server has reached its limit of {max_connections} open connections (--max-connections); "
        "retry later.",
    )
    timeout_answer = _raw_response(
        408, "Request Timeout", f"The request headers did not arrive within {header_timeout:g} s."
    )
    return refusal, timeout_answer


class _ConnectionGuard:
    """The connection cap and the header clock that both guarded protocols share; mixed in before
    the uvicorn protocol class (``class P(_ConnectionGuard, H11Protocol)``). The subclass sets
    the class attributes and defines ``_on_header_timeout``, which the clock calls."""

    _max_connections: int
    _header_timeout: float  # seconds
    _refusal: bytes  # the raw 503 for a connection over the cap
    _body_timeout: float  # seconds for the rest of an answered request's body
    _header_timer: asyncio.TimerHandle | None = None
    _drain_timer: asyncio.TimerHandle | None = None  # the body of an answered request is being read
    _drained: Any = None  # that request's cycle
    _refused = False  # nothing more is read from the connection
    # the uvicorn protocol's own attributes
    connections: set[Any]
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    timeout_keep_alive: float
    timeout_keep_alive_task: asyncio.TimerHandle | None
    timeout_keep_alive_handler: Callable[[], None]
    _unset_keepalive_if_required: Callable[[], None]
    _on_header_timeout: Callable[[], None]

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        if len(self.connections) > self._max_connections:
            self._refused = True
            transport.write(self._refusal)
            transport.close()
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = self._drained = None
        super().connection_lost(exc)  # type: ignore[misc]

    def _start_drain(self, cycle: Any) -> None:
        """The response to ``cycle`` ended before its request's body was read: the rest of the
        body must come within ``_body_timeout`` seconds, else the connection is closed."""
        if self._drain_timer is None and not self.transport.is_closing():
            self._drained = cycle
            self._drain_timer = self.loop.call_later(self._body_timeout, self._on_drain_timeout)

    def _end_drain(self, idle: bool) -> None:
        """The answered request's body has all been read; ``idle``: no next request has begun,
        so the connection waits under uvicorn's keep-alive clock, as after any response."""
        if self._drain_timer is None:
            return
        self._drain_timer.cancel()
        self._drain_timer = self._drained = None
        if idle and not self.transport.is_closing():
            self._unset_keepalive_if_required()
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def _on_drain_timeout(self) -> None:
        self._drain_timer = self._drained = None
        if not self.transport.is_closing():
            self.transport.close()

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self._header_timeout, self._on_header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None


def guarded_h11_protocol(
    header_timeout: float, max_connections: int, body_timeout: float = 60.0
) -> type[H11Protocol]:
    """An ``H11Protocol`` subclass enforcing ``header_timeout`` (seconds), ``max_connections``
    and ``body_timeout`` (seconds for the rest of a body whose request was answered before it
    was read: the server's ``--body-read-timeout``).

    Pass it as ``uvicorn.Config(http=...)``.
    """
    refusal, timeout_answer = _limit_answers(header_timeout, max_connections)

    class GuardedH11Protocol(_ConnectionGuard, H11Protocol):
        """H11Protocol plus a header read deadline and a cap on open connections."""

        _max_connections, _header_timeout, _refusal = max_connections, header_timeout, refusal
        _body_timeout = body_timeout

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_bytes = 0

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            waiting_head = self.conn.their_state is h11.IDLE
            if waiting_head:
                self._head_bytes += len(data)
                if self._header_timer is None:  # first byte of a keep-alive connection's next request
                    self._arm_header_timer()
            super().data_received(data)
            if self._drain_timer is not None and (
                self.cycle is not self._drained or self.conn.their_state is not h11.SEND_BODY
            ):
                # the answered request's body ended (h11 started the next cycle)
                buffered = len(self.conn.trailing_data[0])
                idle = self.conn.their_state is h11.IDLE and not buffered
                self._end_drain(idle)
                if self.conn.their_state is h11.IDLE and buffered and self._header_timer is None:
                    self._head_bytes = buffered  # the next request's head began in this read
                    self._arm_header_timer()
            if self.conn.their_state is not h11.IDLE:  # the request head is complete
                self._cancel_header_timer()
                self._head_bytes = 0

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._head_bytes = 0
            if self.conn.our_state is h11.DONE and self.conn.their_state is h11.SEND_BODY:
                self._start_drain(self.cycle)  # answered before its body was read (a 413, a 401)
            # Bytes of the next request that came with the previous one (pipelined) are parsed
            # only now, and no data_received follows if the client sends nothing more: its
            # clock starts here, or a partial head would wait for the keep-alive timeout.
            buffered = len(self.conn.trailing_data[0])
            if buffered and self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self._head_bytes = buffered
                if self._header_timer is None:
                    self._arm_header_timer()

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to a request h11 cannot parse (a malformed request line or
            header, two Content-Lengths, a TLS handshake...), as an OpenAI error body instead
            of plain text; a request whose response has started (or ended: a body read after its
            answer) gets none, its connection is just closed (h11 refuses a second response, and
            uvicorn's call raised out of ``data_received``)."""
            if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
                self.transport.close()
                return
            body = json.dumps(error_body(400, msg)).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            for event in (
                h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                output = self.conn.send(event)
                if output:
                    self.transport.write(output)
            self.transport.close()

        def _on_header_timeout(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a response is still being sent; the next request's clock starts later
            if self._head_bytes:
                self.transport.write(timeout_answer)
            self.transport.close()

    return GuardedH11Protocol


class _AfterUpgradeCallbacks:
    """The parser callbacks of a connection whose upgrade request was served as HTTP/1.1 (the
    httptools protocol's ``_ignore_upgrade``): the protocol's own, except that those of the head
    the protocol writes to carry that request's body framing (``framing_head``) are skipped.

    Only such connections pay for this indirection: httptools binds a parser's callbacks when the
    parser is made, so a plain connection's parser calls uvicorn's per-header callbacks directly
    (overriding them in the protocol cost every request about 1 us, 9 % of its intake)."""

    def __init__(self, protocol: Any, framing_head: bool) -> None:
        self._protocol = protocol
        self.framing_head = framing_head
        self.on_body = protocol.on_body
        self.on_message_complete = protocol.on_message_complete

    def on_message_begin(self) -> None:
        if not self.framing_head:
            self._protocol.on_message_begin()

    def on_url(self, url: bytes) -> None:
        if not self.framing_head:
            self._protocol.on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.framing_head:
            self._protocol.on_header(name, value)

    def on_headers_complete(self) -> None:
        if self.framing_head:
            self.framing_head = False
            return
        self._protocol.on_headers_complete()


class _TrailersTooLarge(Exception):
    """Raised in the httptools parser's message-complete callback to stop the parse (httptools
    raises its ``HttpParserCallbackError`` from it) when a body's trailers exceed the cap."""


def guarded_httptools_protocol(
    header_timeout: float, max_connections: int, body_timeout: float = 60.0
) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol enforcing ``header_timeout`` (seconds), ``max_connections``
    and ``body_timeout`` (seconds), with the same answers as :func:`guarded_h11_protocol`'s.

    The head's clock starts at ``connection_made`` for a new connection, at the first byte read
    after a request's body for a keep-alive one (or at ``on_message_begin`` for a head that follows
    a body in the same read), and stops at ``on_headers_complete``. A pipelined request's head that is still partial when the previous response
    ends starts its clock then, as with h11.

    Pass it as ``uvicorn.Config(http=...)``.

    Raises:
        ImportError: httptools is not installed.
    """
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

    refusal, timeout_answer = _limit_answers(header_timeout, max_connections)
    too_large = _raw_response(
        431, "Request Header Fields Too Large", f"The request line and headers exceed {MAX_HEAD_BYTES} bytes."
    )
    trailers_too_large = _raw_response(
        431,
        "Request Header Fields Too Large",
        f"The chunked body's trailer fields (or chunk framing) exceed {MAX_HEAD_BYTES} bytes.",
    )
    too_many_pipelined = _raw_response(
        503,
        "Service Unavailable",
        f"More than {MAX_PIPELINED} requests were pipelined on this connection: the later ones were not "
        "served; send them again, on more connections or after their responses.",
    )

    class GuardedHttpToolsProtocol(_ConnectionGuard, HttpToolsProtocol):
        """HttpToolsProtocol plus a header read deadline, a head size cap and a cap on open
        connections."""

        _max_connections, _header_timeout, _refusal = max_connections, header_timeout, refusal
        _body_timeout = body_timeout

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_head = False  # a request's first byte came, its head is not complete
            self._awaiting_head = True  # bytes read now belong to a head (no body being read)
            self._head_bytes = 0
            # A body's bytes read since its last body byte (chunk framing, trailer fields), which
            # httptools would buffer without limit as it does a head.
            self._frame_bytes = 0
            self._body_bytes_read = 0  # body bytes given by the parser in the current read
            self._messages_done = 0
            self._refused = False  # nothing more is read: refused, or answered with an error
            self._last_answer: bytes | None = None  # an error answer waiting for earlier responses
            # Requests whose response is not complete, oldest first: llhttp parses a pipelined
            # request at once, so uvicorn's ``self.cycle`` is the newest one, not the one served.
            self._open_cycles: list[RequestResponseCycle] = []
            self._body_cycle: RequestResponseCycle | None = None  # the request whose body is being read
            self._head_fields = 0  # header fields of the current request's head (trailers follow)
            self._trailers_refused = False  # on_message_complete found the trailers over the cap

        def connection_lost(self, exc: Exception | None) -> None:
            # uvicorn tells only ``self.cycle`` (the newest request) that the client is gone: a
            # stream with a pipelined request queued behind it would never get http.disconnect
            # (and its request would never be aborted in the engine).
            for cycle in self._open_cycles:
                if not cycle.response_complete:
                    cycle.disconnected = True
                    cycle.message_event.set()
            self._open_cycles.clear()
            super().connection_lost(exc)  # the header clock's cancel, then uvicorn's

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            # A packet read while a head is awaited counts whole; a head completed while it is
            # parsed zeroes the count, so only a head still incomplete afterwards is checked (a
            # head's bytes that follow a body in the same packet go uncounted: at most one read).
            if self._awaiting_head:
                self._head_bytes += len(data)
                if self._header_timer is None:  # the next request's first byte on a keep-alive connection
                    # (llhttp skips blank lines before a request line without calling on_message_begin,
                    # and every read cancels uvicorn's keep-alive timer: a client sending "\r\n" would
                    # hold the connection under neither clock)
                    self._arm_header_timer()
            in_body, messages_done = not self._awaiting_head, self._messages_done
            self._body_bytes_read = 0
            self._feed(data)
            if self._refused:
                return
            if len(self.pipeline) > MAX_PIPELINED:
                self._drop_pipelined()
                return
            if self._drain_timer is not None and self._body_cycle is not self._drained:
                # the answered request's body ended in this read; idle unless a next request began
                idle = not self._in_head and (self.cycle is None or self.cycle.response_complete)
                self._end_drain(idle)
            if self._awaiting_head:
                if self._head_bytes > MAX_HEAD_BYTES:
                    self._answer_last(too_large)
            elif in_body and self._messages_done == messages_done and not self._body_bytes_read:
                # a read of framing or trailers only (a read holding a body byte restarted the
                # count in on_body; its bytes after that byte go uncounted: at most one read, as a
                # head's after a body). Counting a whole read's framing refused a body of one-byte
                # chunks whenever a read held over 64 KiB of it (a busy server reads 256 KiB).
                self._frame_bytes += len(data)
                if self._frame_bytes > MAX_HEAD_BYTES:
                    self._answer_last(trailers_too_large)

        def _feed(self, data: bytes) -> None:
            """uvicorn's ``data_received``, except that an upgrade to a protocol other than
            websocket is ignored (:meth:`_ignore_upgrade`) instead of ending the parse (a loop, not
            a recursion: one read may hold thousands of such requests)."""
            self._unset_keepalive_if_required()
            while data and len(self.pipeline) <= MAX_PIPELINED:
                try:
                    self.parser.feed_data(data)
                    return
                except httptools.HttpParserError:
                    if self._trailers_refused:
                        self._answer_last(trailers_too_large)
                        return
                    msg = "Invalid HTTP request received."
                    self.logger.warning(msg)
                    self.send_400_response(msg)
                    return
                except httptools.HttpParserUpgrade as e:
                    if self._should_upgrade():
                        self.handle_websocket_upgrade()
                        return
                    data = self._ignore_upgrade(data[e.args[0] :])

        def _ignore_upgrade(self, rest: bytes) -> bytes:
            """Serve a request that asked to upgrade (``Upgrade: h2c``) as HTTP/1.1 (RFC 9110
            section 7.8: a server may ignore the upgrade), as h11 does. llhttp ended the request
            at its head (its app has seen ``more_body`` false) and stopped, ``rest`` being the
            bytes it left to the new protocol: a new parser reads them, first the request's body
            (when its head declared one) through a head of this protocol's own that carries only
            the body's framing, whose callbacks are skipped (:class:`_AfterUpgradeCallbacks`), then
            the next requests.

            Returns:
                The bytes the new parser is to read.
            """
            cycle = self.cycle
            framing = b"".join(
                b"%s: %s\r\n" % (name, value)
                for name, value in cycle.scope["headers"]
                if name in (b"content-length", b"transfer-encoding")
            )
            framing_head = bool(framing) and not cycle.response_complete and not cycle.disconnected
            self.parser = httptools.HttpRequestParser(_AfterUpgradeCallbacks(self, framing_head))
            with contextlib.suppress(AttributeError):  # httptools < 0.6.3, as uvicorn
                self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
            if framing_head:
                cycle.more_body = True  # undo llhttp's end of the message at its head
                self._awaiting_head, self._body_cycle = False, cycle
                self._messages_done -= 1
                rest = b"POST / HTTP/1.1\r\n" + framing + b"\r\n" + rest
            return rest

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head = True
            if self._header_timer is None:  # first byte of a keep-alive connection's next request
                self._arm_header_timer()

        def on_headers_complete(self) -> None:
            self._in_head = self._awaiting_head = False
            self._head_bytes = 0
            self._head_fields = len(self.headers)  # uvicorn appends a chunked body's trailers after them
            self._cancel_header_timer()
            previous = self.cycle
            super().on_headers_complete()
            if self.cycle is not previous:
                self._open_cycles.append(self.cycle)
                self._body_cycle = self.cycle

        def on_body(self, body: bytes) -> None:
            self._body_bytes_read += len(body)
            self._frame_bytes = 0
            super().on_body(body)

        def on_message_complete(self) -> None:
            if len(self.headers) > self._head_fields and not self._refused:
                # the trailers' whole size (those read with a body byte went uncounted, as did
                # the read ending them): an error here stops the parse, and _feed answers 431
                trailers = self.headers[self._head_fields :]
                if sum(len(name) + len(value) for name, value in trailers) > MAX_HEAD_BYTES:
                    self._trailers_refused = True
                    raise _TrailersTooLarge
            super().on_message_complete()
            self._awaiting_head = True  # the next request's head
            self._messages_done += 1
            self._frame_bytes = 0
            self._body_cycle = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._open_cycles = [cycle for cycle in self._open_cycles if not cycle.response_complete]
            if self.transport.is_closing():
                return
            if self._body_cycle is not None and self._body_cycle.response_complete:
                self._start_drain(self._body_cycle)  # answered before its body was read (a 413, a 401)
            if self._last_answer is not None:
                if not self._responses_pending():
                    self.transport.write(self._last_answer)
                    self.transport.close()
                return
            # a pipelined request's partial head waited behind this response: its clock starts now
            if self._in_head and self._header_timer is None:
                self._arm_header_timer()

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to a request llhttp cannot parse (a malformed request line or
            header, two Content-Lengths, a TLS handshake...), as an OpenAI error body instead
            of plain text, after the responses to the requests before it."""
            self._answer_last(_raw_response(400, "Bad Request", msg))

        def _drop_pipelined(self) -> None:
            """Drop the requests queued past :data:`MAX_PIPELINED` (never started: the newest, at
            the left of uvicorn's queue) and answer the connection's last response with a 503."""
            dropped = set()
            while len(self.pipeline) > MAX_PIPELINED:
                cycle, _ = self.pipeline.popleft()
                dropped.add(id(cycle))
            self._open_cycles = [cycle for cycle in self._open_cycles if id(cycle) not in dropped]
            if self._body_cycle is not None and id(self._body_cycle) in dropped:
                self._body_cycle = None
            self._answer_last(too_many_pipelined)

        def _answer_last(self, answer: bytes) -> None:
            """Read nothing more; write ``answer`` and close once every earlier request is answered
            (at once if none is pending). h11 reads a pipelined request only after the response
            before it, so its errors come in that order; llhttp parses everything it is given,
            and an answer written at once would replace or cut into an earlier response.

            A request whose body was being read is the one answered: its app is told the client
            left (its body will not come), or, if its own response has started (or ended: a body
            read after its answer), the connection is just closed."""
            self._refused = True
            self._cancel_header_timer()
            offender = self._body_cycle
            if offender is not None:
                if offender.response_started:  # sent, or being sent (a drained body): nothing may follow
                    self.transport.close()
                    return
                offender.disconnected = True
                offender.message_event.set()
            if self._responses_pending():
                self._last_answer = answer
                return
            self.transport.write(answer)
            self.transport.close()

        def _responses_pending(self) -> bool:
            """Whether a request of this connection still waits for (the end of) its response."""
            return any(not cycle.response_complete and not cycle.disconnected for cycle in self._open_cycles)

        def _on_header_timeout(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a response is still being sent; the next request's clock starts later
            if self._in_head:
                self.transport.write(timeout_answer)
            self.transport.close()

    return GuardedHttpToolsProtocol


def guarded_http_protocol(
    header_timeout: float, max_connections: int, body_timeout: float = 60.0
) -> tuple[type[asyncio.Protocol], str]:
    """The guarded protocol the server runs: httptools' when httptools is installed, else h11's
    (``header_timeout`` and ``body_timeout`` in seconds).

    Returns:
        The protocol class (for ``uvicorn.Config(http=...)``) and the parser's name
        (``"httptools"`` or ``"h11"``) for the start-up log.
    """
    try:
        return guarded_httptools_protocol(header_timeout, max_connections, body_timeout), "httptools"
    except ImportError:
        return guarded_h11_protocol(header_timeout, max_connections, body_timeout), "h11"
