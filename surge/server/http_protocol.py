"""uvicorn's h11 protocol with the two limits it lacks: a header read timeout and a connection cap.

uvicorn times out idle keep-alive connections (``timeout_keep_alive``) but not a client that
opens a connection and sends its request line and headers a byte at a time (slowloris), and its
``limit_concurrency`` answers a plain-text 503 only once a whole request has been read. Here:

- **Header read timeout**: from the moment a connection opens, or a keep-alive connection gets
  the first byte of its next request, the request head must be complete within
  ``header_timeout`` seconds. Otherwise the connection gets a 408 (or, if the client sent
  nothing at all, is simply closed).
- **Connection cap**: a connection beyond ``max_connections`` open ones is answered at once with
  a 503 OpenAI error body naming ``--max-connections`` and closed, before anything is read.
- **Malformed requests**: a request h11 cannot parse gets uvicorn's 400 as an OpenAI error body
  (uvicorn's is plain text).

The body read timeout and size limit live in :mod:`surge.server.guard`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from surge.server.errors import error_body


def _raw_response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps(error_body(status, message)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def guarded_h11_protocol(header_timeout: float, max_connections: int) -> type[H11Protocol]:
    """An ``H11Protocol`` subclass enforcing ``header_timeout`` (seconds) and ``max_connections``.

    Pass it as ``uvicorn.Config(http=...)``.
    """
    refusal = _raw_response(
        503,
        "Service Unavailable",
        f"The server has reached its limit of {max_connections} open connections (--max-connections); "
        "retry later.",
    )
    timeout_answer = _raw_response(
        408, "Request Timeout", f"The request headers did not arrive within {header_timeout:g} s."
    )

    class GuardedH11Protocol(H11Protocol):
        """H11Protocol plus a header read deadline and a cap on open connections."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._header_timer: asyncio.TimerHandle | None = None
            self._head_bytes = 0
            self._refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                self._refused = True
                transport.write(refusal)
                transport.close()
                return
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_header_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            waiting_head = self.conn.their_state is h11.IDLE
            if waiting_head:
                self._head_bytes += len(data)
                if self._header_timer is None:  # first byte of a keep-alive connection's next request
                    self._arm_header_timer()
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the request head is complete
                self._cancel_header_timer()
                self._head_bytes = 0

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._head_bytes = 0
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
            of plain text."""
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

        def _arm_header_timer(self) -> None:
            self._cancel_header_timer()
            self._header_timer = self.loop.call_later(header_timeout, self._on_header_timeout)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

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
