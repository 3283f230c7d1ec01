"""vLLM's server load (``GET /load``, counted with ``--enable-server-load-tracking``).

``/load`` answers ``{"server_load": N}``: N is the number of requests this API process is serving
on the routes vLLM counts that Surge has (``POST /v1/chat/completions``, ``POST /v1/completions``,
``POST /v1/chat/completions/batch``, ``POST /invocations`` (which vLLM counts as the route it
dispatches to), ``POST /v1/responses``, ``GET /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``), from the
moment their body has arrived and passed the API key and body checks until their response has been
sent in full (a stream's last event) or failed. Without the flag nothing is counted and ``/load``
answers 0, as in vLLM. With several API processes (``--api-server-count``) each counts its own
requests, as each of vLLM's does.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from surge.server.errors import route_path

_COUNTED_POSTS = (
    "/v1/chat/completions",
    "/v1/chat/completions/batch",
    "/v1/completions",
    "/v1/responses",
    "/invocations",
)
_RESPONSES = "/v1/responses/"


def counts_as_load(method: str, path: str) -> bool:
    """Whether vLLM's ``load_aware_call`` counts a request of ``method`` to ``path`` (among the
    routes Surge serves)."""
    if method == "POST" and path in _COUNTED_POSTS:
        return True
    if not path.startswith(_RESPONSES):
        return False
    rest = path[len(_RESPONSES) :]
    if method == "GET":  # a stored response
        return bool(rest) and "/" not in rest
    return method == "POST" and rest.endswith("/cancel") and rest.count("/") == 1


class ServerLoad:
    """The number of counted requests being served (:func:`counts_as_load`).

    Attributes:
        count: requests being served now.
    """

    def __init__(self) -> None:
        self.count = 0


class LoadTrackingMiddleware:
    """Count each counted request in ``load`` while the app serves it (pure ASGI: a streamed
    response is served until its last event has been sent)."""

    def __init__(self, app: ASGIApp, load: ServerLoad) -> None:
        self.app = app
        self.load = load

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not counts_as_load(scope.get("method", ""), route_path(scope)):
            await self.app(scope, receive, send)
            return
        self.load.count += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.load.count -= 1
