"""Graceful drain: what the server does between SIGTERM / SIGINT and its exit.

1. The first signal starts draining: new requests to the API routes get a 503 error body and
   ``/health`` answers 503, so load balancers take the server out; ``/metrics`` still answers.
2. Requests in flight run on for up to ``--shutdown-timeout`` seconds.
3. Then each one still running is ended: a stream gets one ``data: {"error": ...}`` event
   (status 503, code ``"server_shutting_down"``) followed by ``data: [DONE]``; a non-streamed
   request gets that 503 error body. Uvicorn then closes the connections and the engine process
   is stopped; the exit code is 0.
4. A second SIGINT or SIGTERM ends every request at once the same way and exits.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections.abc import Container
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Receive, Scope, Send

from surge.server.errors import ApiError, error_body_for, route_path

if TYPE_CHECKING:
    from surge.server.generation import Generation

logger = logging.getLogger("surge.server")

SHUTDOWN_CODE = "server_shutting_down"
DRAINED_PATHS_PREFIXES = ("/v1/", "/tokenize", "/detokenize", "/invocations")
"""Routes that refuse new requests while draining."""


class ShutdownError(ApiError):
    """A request ended because the server shuts down (503); a stream ends with ``[DONE]``."""

    def __init__(self, message: str = "The server is shutting down.") -> None:
        super().__init__(503, message, code=SHUTDOWN_CODE)


class InFlight:
    """The generations in flight, and whether the server is draining.

    Attributes:
        draining: set by the first shutdown signal; new API requests are refused.
    """

    def __init__(self) -> None:
        self.draining = False
        self._gens: dict[str, Generation] = {}
        self._serials = itertools.count()
        self.body_readers: set[asyncio.Task[None]] = set()
        """Tasks waiting for a piece of a request body (:class:`surge.server.guard.RequestGuard`)."""
        self._stopped_readers: set[asyncio.Task[None]] = set()

    def stop_body_reads(self) -> None:
        """Cancel the tasks waiting for a request body: at shutdown a client trickling its body
        gets a 503 at once instead of holding the exit until uvicorn cancels it (with a traceback)."""
        for task in self.body_readers:
            self._stopped_readers.add(task)
            task.cancel()

    def body_read_stopped(self, task: asyncio.Task[None]) -> bool:
        """Whether :meth:`stop_body_reads` cancelled ``task`` (then forgotten)."""
        if task in self._stopped_readers:
            self._stopped_readers.discard(task)
            return True
        return False

    def next_serial(self) -> int:
        """A number no earlier call returned: makes a generation's engine request ids unique."""
        return next(self._serials)

    def __len__(self) -> int:
        return len(self._gens)

    def unique_id(self, base: str, reserved: Container[str] = ()) -> str:
        """``base``, or ``base`` plus a random suffix when a request in flight already has it
        (two clients may send the same ``X-Request-Id``; engine ids must be unique) or it is in
        ``reserved`` (e.g. the ids of stored Responses API responses, which a later request
        with the same ``X-Request-Id`` must not replace)."""
        if base not in self._gens and base not in reserved:
            return base
        return f"{base}-{uuid.uuid4().hex[:8]}"

    def add(self, request_id: str, gen: Generation) -> None:
        """Track ``gen`` until :meth:`remove`."""
        self._gens[request_id] = gen

    def remove(self, request_id: str) -> None:
        """Forgets ``request_id``'s generation (no error if it is not tracked)."""
        self._gens.pop(request_id, None)

    def fail_all(self, error: ApiError) -> int:
        """End every tracked generation with ``error``; returns how many there were."""
        gens = list(self._gens.values())
        for gen in gens:
            gen.fail(error)
        return len(gens)

    async def drain(self, timeout: float) -> int:
        """Refuse new requests, wait up to ``timeout`` seconds for those in flight, then end the
        rest with a :class:`ShutdownError`. Returns how many had to be ended."""
        self.draining = True
        self.stop_body_reads()
        if self._gens:
            logger.info(
                "shutting down: refusing new requests, waiting up to %gs for %d in flight",
                timeout,
                len(self._gens),
            )
        else:
            logger.info("shutting down: no request in flight")
        deadline = time.monotonic() + timeout
        while self._gens and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        ended = self.fail_all(ShutdownError())
        if ended:
            logger.warning("shutdown timeout (%gs): ended %d requests still in flight", timeout, ended)
        # Give the ended streams a moment to send their last events before uvicorn closes them.
        deadline = time.monotonic() + 2.0
        while self._gens and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return ended


class DrainMiddleware:
    """Answer 503 to new requests on the API routes while the server drains (pure ASGI)."""

    def __init__(self, app: ASGIApp, in_flight: InFlight) -> None:
        self.app = app
        self.in_flight = in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and self.in_flight.draining
            and route_path(scope).startswith(DRAINED_PATHS_PREFIXES)
        ):
            message = "The server is shutting down."
            body = json.dumps(error_body_for(route_path(scope), 503, message, code=SHUTDOWN_CODE)).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
