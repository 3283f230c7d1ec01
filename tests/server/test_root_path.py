"""vLLM's ``--root-path`` (FastAPI's ``root_path``): the API answers under the prefix a proxy
serves it at (``/api/v1/models``) and without it (a proxy that strips it), and every check that
reads the path (API key, Anthropic error bodies, the drain gate, the load count) reads the path
without the prefix. It was refused as unknown, so a vLLM launch line with it did not start."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from surge.server.drain import InFlight
from surge.server.errors import route_path
from tests.server.conftest import Server, start_server
from tests.server.stub_app import stub_app, stub_state

KEY = "sk-root"


def _app(in_flight: InFlight | None = None, root_path: str = "/api", web_ui: bool = False) -> TestClient:
    """The app over a stub state (no engine) with ``--api-key sk-root --root-path /api``."""
    state = stub_state(api_keys=(KEY,), in_flight=in_flight)
    return stub_app(state, web_ui=web_ui, root_path=root_path)


@pytest.mark.parametrize(
    ("path", "root", "want"),
    [
        ("/api/v1/models", "/api", "/v1/models"),
        ("/v1/models", "/api", "/v1/models"),
        ("/api", "/api", "/"),
        ("/apix/v1/models", "/api", "/apix/v1/models"),
        ("/v1/models", "", "/v1/models"),
    ],
)
def test_route_path_drops_the_prefix_only_before_a_slash(path: str, root: str, want: str) -> None:
    assert route_path({"path": path, "root_path": root}) == want


@pytest.mark.parametrize("prefix", ["/api", ""])
def test_routes_answer_with_and_without_the_prefix_and_keep_their_key(prefix: str) -> None:
    app = _app()
    assert app.get(f"{prefix}/health").status_code == 200
    refused = app.get(f"{prefix}/v1/models")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key", refused.text
    # the Messages API's error body is Anthropic's under the prefix too (it is chosen by path)
    messages = app.post(f"{prefix}/v1/messages", json={})
    assert messages.status_code == 401 and messages.json()["type"] == "error", messages.text
    assert app.get(f"{prefix}/version").json()["version"]


@pytest.mark.parametrize("prefix", ["/api", ""])
def test_the_web_ui_and_its_files_answer_with_and_without_the_prefix(prefix: str) -> None:
    """The pages' files (``/ui/style.css``) were a 404 without the prefix (what a proxy that
    strips it sends): the mount read them as ``ui/style.css`` of its folder, so the playground
    came unstyled and dead. A path outside the folder stays a 404."""
    app = _app(web_ui=True)
    assert "<title>Surge playground</title>" in app.get(f"{prefix}/").text
    for name, kind in (("style.css", "text/css"), ("playground.js", "text/javascript")):
        r = app.get(f"{prefix}/ui/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind), (name, r.text[:200])
    for bad in ("/ui/%2e%2e/ui.py", "/ui/missing.js", "/ui/ui/style.css"):
        assert app.get(f"{prefix}{bad}").status_code == 404, bad


def test_the_playground_at_the_prefix_without_its_slash_moves_to_it() -> None:
    """``GET /api`` under ``--root-path /api`` (a proxy that keeps the prefix) was a 404: Starlette
    routes it as "", which no route matches. It goes to ``/api/`` (query kept), as the page
    itself reloads there when a proxy that strips the prefix serves it at ``/api``."""
    app = _app(web_ui=True)
    for path, where in (("/api", "/api/"), ("/api?model=m", "/api/?model=m")):
        r = app.get(path, follow_redirects=False)
        assert r.status_code == 307 and r.headers["location"] == where, r.text
    assert "<title>Surge playground</title>" in app.get("/api").text
    assert app.post("/api", json={}, follow_redirects=False).status_code == 404  # a page is only read
    assert _app().get("/api", follow_redirects=False).status_code == 404  # no web UI: nothing there


def test_the_api_docs_name_the_prefix() -> None:
    assert _app().get("/api/openapi.json").json()["servers"] == [{"url": "/api"}]


def test_draining_refuses_prefixed_generation_routes() -> None:
    in_flight = InFlight()
    app = _app(in_flight)
    in_flight.draining = True
    r = app.post("/api/v1/completions", json={}, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 503, r.text


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("root-path"), "--root-path", "/api/", "--served-model-name", "m")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def test_a_live_server_under_a_root_path(srv: Server) -> None:
    body = {"model": "m", "prompt": "Once", "max_tokens": 3}
    for prefix in ("/api", ""):
        r = httpx.post(f"{srv.url}{prefix}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
        assert httpx.get(f"{srv.url}{prefix}/v1/models", timeout=10).json()["data"][0]["id"] == "m"
    assert f"serving on http://127.0.0.1:{srv.port} (OpenAI API under /api/v1)" in srv.log()


def test_a_root_path_that_is_no_path_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from surge.cli import main

    for bad in ("api", "/a b", "/api?x=1", "//api"):
        assert main(["serve", "--root-path", bad, "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert (
            err.startswith("surge: error: --root-path must be a path such as /api") and err.count("\n") == 1
        ), err
