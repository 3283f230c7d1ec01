"""Request ids: a client's ``X-Request-Id`` (or a fresh one) for each HTTP request.

An ASGI middleware (pure ASGI, so streamed bodies pass untouched) puts the id in
``scope["state"]["request_id"]`` and echoes it in the ``X-Request-Id`` response header of every
response, errors included (a handler may replace it by the body's ``request_id`` before the
response starts). The chat and completions handlers name their response and engine
requests after it (``chatcmpl-<id>``, ``cmpl-<id>``, with ``-<i>`` per choice when ``n > 1``)
and log it; a refused request's log line names the id of its response header too
(:func:`logged_request_id`), generated or not.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from surge.server.errors import bad_request

MAX_REQUEST_ID_LEN = 256
_HEADER = b"x-request-id"


def fresh_request_id() -> str:
    """A new request id: 32 hex digits of a random version-4 UUID (``uuid.uuid4().hex``'s form).

    The bits come from Python's own generator, not ``os.urandom``: an id must be unique, not
    secret, and the system call behind ``os.urandom`` lets the tokenizer threads take the GIL
    from the event loop in the middle of a request burst.
    """
    return uuid.UUID(int=random.getrandbits(128), version=4).hex


def _valid(value: str) -> bool:
    # no leading or trailing space: h11 refuses such a header value (the connection dropped)
    return (
        0 < len(value) <= MAX_REQUEST_ID_LEN
        and value.isprintable()
        and value.isascii()
        and value == value.strip()
    )


class RequestIdMiddleware:
    """Assign each HTTP request its id and echo it in the response headers.

    A client id that is not printable ASCII of at most ``MAX_REQUEST_ID_LEN`` characters is
    replaced by a fresh one (it could not be echoed as a header safely).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = None
        for name, value in scope.get("headers", ()):
            if name == _HEADER:
                given = value.decode("latin-1").strip()
                break
        state = scope.setdefault("state", {})
        client_id = given is not None and _valid(given)
        state["request_id"] = given if client_id else fresh_request_id()
        state["request_id_from_client"] = client_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != _HEADER]
                headers.append((_HEADER, str(state["request_id"]).encode("latin-1")))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_id)


def logged_request_id(scope: Scope) -> str:
    """The id to name a request by in a log line: the one its response's ``X-Request-Id``
    header carries (the client's, the body's ``request_id`` once a handler took it, or the
    fresh one), read from the ``scope`` the middleware filled; ``-`` for a scope it never saw."""
    rid = scope.get("state", {}).get("request_id")
    return rid if isinstance(rid, str) else "-"


def check_path_segment_id(request: Any, body_request_id: str | None) -> None:
    """Refuse a client id with ``/`` for a request whose id becomes a URL path segment (the
    Responses API: ``resp_<id>`` is what ``GET`` / ``DELETE /v1/responses/{id}`` take, and no
    encoding of ``/`` reaches a path parameter, so the stored response could not be read back).
    The id is the one :func:`request_id_of` takes: ``X-Request-Id``, else the body's ``request_id``.

    Raises:
        ApiError: 400 naming ``X-Request-Id`` or ``request_id``, whichever holds the ``/``.
    """
    from_client = bool(getattr(request.state, "request_id_from_client", False))
    rid = getattr(request.state, "request_id", None) if from_client else body_request_id
    if isinstance(rid, str) and "/" in rid:
        param = "X-Request-Id" if from_client else "request_id"
        raise bad_request(
            f"{param} must not contain '/' here: the response id (resp_<id>) is a URL path segment "
            "of GET and DELETE /v1/responses/{response_id}",
            param=param,
        )


def request_id_of(request: Any, body_request_id: str | None = None) -> str:
    """The id of ``request``: its ``X-Request-Id``, else ``body_request_id`` (vLLM's body
    field; then echoed in the header too), else the fresh id the middleware gave it.

    Raises:
        ApiError: 400 naming ``request_id`` for a body id that is empty, longer than
            ``MAX_REQUEST_ID_LEN`` or not printable ASCII (a header id like that is replaced).
    """
    if body_request_id is not None and not _valid(body_request_id):
        raise bad_request(
            f"request_id must be 1 to {MAX_REQUEST_ID_LEN} printable ASCII characters, without leading or "
            "trailing spaces",
            param="request_id",
        )
    rid = getattr(request.state, "request_id", None)
    from_client = bool(getattr(request.state, "request_id_from_client", False))
    if not from_client and body_request_id is not None:
        request.state.request_id = rid = body_request_id
    return rid if isinstance(rid, str) else fresh_request_id()
