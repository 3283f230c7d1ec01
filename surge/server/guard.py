"""RequestGuard: the ASGI middleware that every HTTP request passes before the app sees it.

In order, before any byte of the body is parsed:

1. **API key** (when set): a route that needs it (:func:`surge.server.auth.needs_key`) without
   ``Authorization: Bearer KEY`` (or, on the Messages API's routes, Anthropic's ``x-api-key:
   KEY``) gets a 401, whatever its body.
2. **Body size**: a ``Content-Length`` above ``max_body_bytes`` gets a 413 at once; a chunked
   body is counted as it arrives and cut with a 413 at the limit.
3. **Content encoding**: a body sent with a content coding other than ``identity`` (``gzip``,
   ...; every ``Content-Encoding`` header and each of its comma-separated codings count) gets a
   415 that names it: the server reads bodies as sent, and a compressed one would otherwise fail
   later as invalid JSON. A request without a body is not checked. So does a transfer coding other
   than ``chunked`` (``Transfer-Encoding: gzip, chunked``: the HTTP parser undoes the chunking
   alone), and its connection is closed (the body is not read); RFC 9112 suggests a 501 there,
   but a 5xx tells clients (the OpenAI SDKs) to send the same request again.
4. **Body read time**: the whole body must arrive within ``body_read_timeout`` seconds, else a
   408 and the connection is closed (a client trickling its body cannot hold the handler).
5. **Lone surrogates**: a JSON string holding a lone UTF-16 surrogate (``"\ud800"``, or its
   raw bytes) has no UTF-8 form, so the tokenizer or an error message would fail on it later.
   A body that may hold one (a quick byte search) is parsed and checked; a 400 names the
   top-level field that holds it.

Every error here is the body of the route's API (Anthropic's on the Messages API's routes,
:func:`surge.server.errors.error_body_for`). The body is then handed to the app in one piece; later ``receive()`` calls (disconnect
detection) go to the server as usual. Header read time and the connection cap are enforced one
level lower, in :mod:`surge.server.http_protocol`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from surge.server.auth import is_authorized, is_key, needs_key
from surge.server.drain import DRAINED_PATHS_PREFIXES, SHUTDOWN_CODE, InFlight
from surge.server.errors import ANTHROPIC_PATHS, error_body_for, log_text, route_path
from surge.server.request_id import logged_request_id

logger = logging.getLogger("surge.server")

_DRAIN_FACTOR = 16
"""A body declared up to this many times the limit is read and dropped after the 413, so the
client sees the answer; a larger one closes the connection."""


_SURROGATE_HINT = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf]")
"""A ``\ud800``-``\udfff`` escape, or the UTF-8 form of a surrogate: the body may hold a lone one."""


def _has_lone_surrogate(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    except (RecursionError, ValueError):
        return False
    return False


def lone_surrogate_field(body: bytes) -> str | None:
    """The top-level field of a JSON body holding a lone surrogate ("body" if not an object), or None.
    A field whose name holds one is named with it written out (``\\ud800``): the error body
    must be valid UTF-8.

    Only a body that :data:`_SURROGATE_HINT` matches can hold one; a body that is not valid JSON
    gives None (the app answers it). Cost: one parse and one C-speed encode of the body.
    """
    if (b"\\u" not in body and b"\xed" not in body) or not _SURROGATE_HINT.search(body):
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return "body" if _has_lone_surrogate(data) else None
    for key, value in data.items():
        if _has_lone_surrogate(key):
            return key.encode("utf-8", "backslashreplace").decode("utf-8")
        if _has_lone_surrogate(value):
            return key
    return None


@dataclass(frozen=True)
class GuardConfig:
    """Limits applied by :class:`RequestGuard`.

    Attributes:
        api_keys: the accepted bearer tokens; empty = no check.
        metrics_require_key: ``/metrics`` needs the key too.
        max_body_bytes: largest request body, in bytes.
        body_read_timeout: seconds allowed to receive a whole body.
        in_flight: the server's drain state: while draining, a drained route's body is not
            waited for (the drain gate answers 503), and a body read under way when the drain
            starts is answered with a 503 at once.
    """

    api_keys: tuple[str, ...] = ()
    metrics_require_key: bool = False
    max_body_bytes: int = 4 * 1024 * 1024
    body_read_timeout: float = 60.0
    in_flight: InFlight | None = None


async def send_error(
    send: Send,
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | int | None = None,
    close: bool = False,
    scope: Scope | None = None,
) -> None:
    """Send a complete OpenAI error response (``connection: close`` when ``close``); with the
    request's ``scope``, log the rejection at INFO (method, path, status, the request id its
    ``X-Request-Id`` response header carries, reason)."""
    if scope is not None:
        rid = logged_request_id(scope)
        logger.info(
            "%s %s -> %d (request id %s)%s: %s",
            log_text(str(scope.get("method", "?"))),
            log_text(str(scope.get("path", "?"))),
            status,
            rid,
            f" [{log_text(param)}]" if param else "",
            log_text(message),
        )
    path = route_path(scope) if scope is not None else ""
    body = json.dumps(error_body_for(path, status, message, param=param, code=code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class RequestGuard:
    """ASGI middleware: API key, body size, content encoding and body read time, checked before
    the app parses anything.

    Args:
        app: the wrapped ASGI app.
        config: the limits.
    """

    def __init__(self, app: ASGIApp, config: GuardConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cfg = self.config
        authorization: bytes | None = None
        x_api_key: bytes | None = None
        content_length: int | None = None
        codings: list[bytes] = []  # every Content-Encoding header's codings, in order
        transfer: list[bytes] = []  # every Transfer-Encoding header's codings, in order
        chunked = False
        for name, value in scope["headers"]:
            if name == b"authorization" and authorization is None:
                authorization = value
            elif name == b"x-api-key" and x_api_key is None:
                x_api_key = value
            elif name == b"content-encoding":
                codings += [c.strip().lower() for c in value.split(b",")]
            elif name == b"transfer-encoding":
                chunked = True
                transfer += [c.strip().lower() for c in value.split(b",")]
            elif name == b"content-length":
                try:
                    content_length = int(value)
                except ValueError:
                    content_length = None
        if (
            cfg.api_keys
            and needs_key(route_path(scope), metrics_require_key=cfg.metrics_require_key)
            and not is_authorized(authorization, cfg.api_keys)
            and not (route_path(scope) in ANTHROPIC_PATHS and is_key(x_api_key, cfg.api_keys))
        ):
            # Say nothing about the body: an unauthenticated client learns nothing else.
            too_big = content_length is not None and content_length > _DRAIN_FACTOR * cfg.max_body_bytes
            await send_error(
                send, 401, "Invalid or missing API key.", code="invalid_api_key", close=too_big, scope=scope
            )
            return
        limit = cfg.max_body_bytes
        if content_length is not None and content_length > limit:
            await send_error(
                send,
                413,
                f"Request body of {content_length} bytes is over the limit of {limit} bytes "
                "(--max-request-body-bytes).",
                close=content_length > _DRAIN_FACTOR * limit,
                scope=scope,
            )
            return
        unsupported = [c for c in codings if c and c != b"identity"]
        has_body = bool(content_length) if content_length is not None else chunked
        if unsupported and has_body:
            shown = b", ".join(unsupported).decode("latin-1")[:64]
            await send_error(
                send,
                415,
                f"Content-Encoding {shown!r} is not supported: send the request body uncompressed.",
                close=content_length is None,  # a chunked body is not read: end the connection
                scope=scope,
            )
            return
        unknown = [c for c in transfer if c and c not in (b"chunked", b"identity")]
        if unknown:
            shown = b", ".join(unknown).decode("latin-1")[:64]
            await send_error(
                send,
                415,
                f"Transfer-Encoding {shown!r} is not supported: send the request body uncompressed, "
                "with Transfer-Encoding: chunked alone or a Content-Length.",
                close=True,  # the body is not read: end the connection
                scope=scope,
            )
            return
        in_flight = cfg.in_flight
        if (
            in_flight is not None
            and in_flight.draining
            and route_path(scope).startswith(DRAINED_PATHS_PREFIXES)
        ):
            await self.app(scope, receive, send)  # the drain gate answers 503, body unread
            return
        task = asyncio.current_task()
        readers = in_flight.body_readers if in_flight is not None and task is not None else None
        chunks: list[bytes] = []
        size = 0
        more = True
        try:
            async with asyncio.timeout(cfg.body_read_timeout):
                while more:
                    if readers is None:
                        message = await receive()
                    else:
                        readers.add(task)  # type: ignore[arg-type]
                        try:
                            message = await receive()
                        finally:
                            readers.discard(task)  # type: ignore[arg-type]
                    if message["type"] == "http.disconnect":
                        return
                    piece = message.get("body", b"")
                    size += len(piece)
                    if size > limit:
                        await send_error(
                            send,
                            413,
                            f"Request body is over the limit of {limit} bytes (--max-request-body-bytes).",
                            close=True,
                            scope=scope,
                        )
                        return
                    if piece:
                        chunks.append(piece)
                    more = bool(message.get("more_body", False))
        except TimeoutError:
            await send_error(
                send,
                408,
                f"The request body did not arrive within {cfg.body_read_timeout:g} s.",
                close=True,
                scope=scope,
            )
            return
        except asyncio.CancelledError:
            if in_flight is None or task is None or not in_flight.body_read_stopped(task):
                raise
            task.uncancel()  # the drain stopped the read: answer, do not die
            await send_error(
                send, 503, "The server is shutting down.", code=SHUTDOWN_CODE, close=True, scope=scope
            )
            return
        body = b"".join(chunks)
        field = lone_surrogate_field(body) if body else None
        if field is not None:
            await send_error(
                send,
                400,
                f"{field or repr(field)}: a string holds a lone UTF-16 surrogate (U+D800 to U+DFFF), which is not "
                "valid Unicode text.",
                param=field,
                scope=scope,
            )
            return
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
