"""The server's app over a state with no engine behind it, for tests of what is answered before
a handler reaches the engine (the API key, the drain gate, ``/health``, routes, the schema).

Kept out of ``conftest.py``: building the app imports the whole server, which the tests of a
live ``surge serve`` process do not need."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from fastapi.testclient import TestClient

from surge.server.api_server import build_app
from surge.server.drain import InFlight
from surge.server.serving_common import ServerState


def stub_state(
    *,
    api_keys: tuple[str, ...] = (),
    ready: bool = True,
    dead_reason: str | None = None,
    in_flight: InFlight | None = None,
    **fields: Any,
) -> ServerState:
    """A server state with no engine (an app over it must not run its lifespan): enough for the
    routes and middleware that read only the engine client's health (``ready``, ``dead_reason``;
    never stalled) and the server's settings (``api_keys``, a 1 MiB body limit, the drain gate
    ``in_flight``); ``fields``: more of the state's attributes (a tokenizer, its worker)."""
    client = SimpleNamespace(
        is_ready=ready, dead_reason=dead_reason, seconds_without_progress=lambda: 0.0, num_inflight=0
    )
    state = SimpleNamespace(
        client=client,
        api_keys=api_keys,
        in_flight=InFlight() if in_flight is None else in_flight,
        metrics_require_key=False,
        max_request_body_bytes=1 << 20,
        body_read_timeout=10.0,
        engine_stall_timeout=60.0,
        **fields,
    )
    return cast(ServerState, state)


def stub_app(state: ServerState, *, web_ui: bool = False, **options: Any) -> TestClient:
    """A test client of the app serving ``state`` (:func:`stub_state`), built with ``web_ui``
    and ``options`` (more of ``build_app``'s keywords); no lifespan runs."""
    return TestClient(build_app(state, web_ui=web_ui, **options))
