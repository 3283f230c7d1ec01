"""vLLM 0.26's small serving routes: ``/ping`` (its SageMaker health check)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from fastapi.testclient import TestClient

from surge.server.api_server import build_app
from surge.server.drain import InFlight
from surge.server.serving_common import ServerState
from tests.server.conftest import Server

KEY = "sk-test"


def _app(
    *, ready: bool = True, dead_reason: str | None = None, in_flight: InFlight | None = None, **extra: Any
) -> TestClient:
    """The app over a stub state (no engine, no lifespan): enough for the routes that only read
    the engine client's health and the server's settings. The server has ``--api-key sk-test``."""
    client = SimpleNamespace(
        is_ready=ready,
        dead_reason=dead_reason,
        seconds_without_progress=lambda: 0.0,
        num_inflight=0,
    )
    state = SimpleNamespace(
        client=client,
        api_keys=(KEY,),
        in_flight=InFlight() if in_flight is None else in_flight,
        metrics_require_key=False,
        max_request_body_bytes=1 << 20,
        body_read_timeout=10.0,
        engine_stall_timeout=60.0,
        **extra,
    )
    return TestClient(build_app(cast(ServerState, state), web_ui=False))


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_ping_answers_as_health_without_the_key(method: str) -> None:
    app = _app()
    r = app.request(method, "/ping")
    health = app.get("/health")
    assert r.status_code == health.status_code == 200
    assert r.content == health.content == b""
    assert r.headers["x-surge-pid"] == health.headers["x-surge-pid"]
    # a SageMaker client may POST a body: it is not read, nor is a key asked for
    assert (
        app.post("/ping", content=b'{"x": 1}', headers={"content-type": "application/json"}).status_code
        == 200
    )
    assert app.get("/v1/models").status_code == 401, "the stub server does have a key"


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_ping_fails_as_health_when_the_engine_is_dead(method: str) -> None:
    app = _app(ready=False, dead_reason="the engine process died (exit code -9)")
    r = app.request(method, "/ping")
    health = app.get("/health")
    assert r.status_code == health.status_code == 503
    assert r.json() == health.json()
    assert "exit code -9" in r.json()["error"]["message"]


def test_ping_while_draining_is_503() -> None:
    in_flight = InFlight()
    app = _app(in_flight=in_flight)
    in_flight.draining = True
    assert app.get("/ping").status_code == app.get("/health").status_code == 503


def test_ping_on_a_live_server_and_its_schema(server: Server) -> None:
    assert httpx.get(server.url + "/ping").status_code == 200
    assert httpx.post(server.url + "/ping").status_code == 200
    r = httpx.head(server.url + "/ping")  # vLLM serves GET and POST only
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"GET", "POST"}
    paths = httpx.get(server.url + "/openapi.json").json()["paths"]
    assert set(paths["/ping"]) == {"get", "post"}
    assert "503" in paths["/ping"]["post"]["responses"]
    assert "401" not in paths["/ping"]["get"]["responses"]
