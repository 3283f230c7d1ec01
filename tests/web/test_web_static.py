"""The web UI's static routes, content types, self-containment and the --disable-web-ui switch."""

from __future__ import annotations

import re
import tomllib
from concurrent.futures import ThreadPoolExecutor
from fnmatch import fnmatch
from pathlib import Path
from types import SimpleNamespace
from typing import cast
from urllib.parse import urljoin

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from surge.server.api_server import ServeOptions, build_app
from surge.server.drain import InFlight
from surge.server.serving_common import ServerState
from surge.web.ui import STATIC_DIR, mount_web_ui
from tests.server.conftest import Server

REPO = Path(__file__).resolve().parents[2]
FILES = sorted(p for p in STATIC_DIR.iterdir() if p.is_file())
SVG_NAMESPACE = "http://www.w3.org/2000/svg"  # an XML namespace name, never fetched
SLASH_REDIRECT = """
    // Under a proxy's path prefix the playground is also reached without its trailing slash
    // (/surge for /surge/), where the relative URLs below resolve outside the prefix: reload at /surge/.
    if (!location.pathname.endsWith("/")) location.replace(location.pathname + "/" + location.search + location.hash);
  """
"""The playground's one inline script, which carries no model text."""


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    mount_web_ui(app)
    return TestClient(app)


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/", "text/html"),
        ("/dashboard", "text/html"),
        ("/ui/style.css", "text/css"),
        ("/ui/common.js", "text/javascript"),
        ("/ui/playground.js", "text/javascript"),
        ("/ui/dashboard.js", "text/javascript"),
        ("/ui/favicon.svg", "image/svg+xml"),
    ],
)
def test_routes_and_content_types(client: TestClient, path: str, content_type: str) -> None:
    r = client.get(path)
    assert r.status_code == 200, path
    assert r.headers["content-type"].split(";")[0] == content_type
    assert r.content


def test_pages_are_the_playground_and_the_dashboard(client: TestClient) -> None:
    assert "<title>Surge playground</title>" in client.get("/").text
    assert "<title>Surge dashboard</title>" in client.get("/dashboard").text
    assert client.get("/").headers["cache-control"] == "no-cache"


@pytest.mark.parametrize(
    "path", ["/ui/missing.js", "/ui/", "/ui/../ui.py", "/ui/%2e%2e/ui.py", "/index.html"]
)
def test_unknown_paths_are_404(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 404


def test_every_referenced_file_is_served(client: TestClient) -> None:
    """Each page's files and links are relative (``ui/style.css``, ``dashboard``, ``./``) and
    resolve, from the page's own path, to what the server serves."""
    for page, path in (("index.html", "/"), ("dashboard.html", "/dashboard")):
        html = (STATIC_DIR / page).read_text()
        refs = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert refs
        for ref in refs:
            assert not ref.startswith("/"), ref
            url = urljoin(f"http://testserver{path}", ref)
            assert client.get(url).status_code == 200, (page, ref)


def test_pages_work_under_a_path_prefix() -> None:
    """Behind a proxy that serves Surge under a prefix (``/surge/`` -> ``/``) the pages load their
    files and call the API through the prefix: no root-relative URL in the pages or scripts
    (``/ui/style.css``, ``fetch("/v1/models")`` went to the proxy's root, 404)."""
    for path in FILES:
        if path.suffix not in (".html", ".js"):
            continue
        text = path.read_text()
        assert not re.findall(r"""(?:src|href)\s*=\s*["']/""", text), path.name
        assert not re.findall(r"""fetch\(\s*["'`]/""", text), path.name
        assert not re.findall(r"""url\s*=\s*["'`]/""", text), path.name


def test_playground_reloads_itself_at_its_slash_form() -> None:
    """Behind a proxy that strips ``/surge``, ``/surge`` serves the playground as ``/surge/`` does,
    but the browser resolves its relative URLs from ``/``, outside the prefix: the server cannot
    tell the two apart, so the page's first script reloads it at the slash form (query kept),
    before any relative URL."""
    html = (STATIC_DIR / "index.html").read_text()
    script = html.index("<script>")
    assert re.findall(r"<script>(.*?)</script>", html, re.S)[0] == SLASH_REDIRECT
    assert script < min(html.index('href="'), html.index('src="'))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_external_urls(path: Path) -> None:
    """Works offline: no CDN, font, image or script from another origin."""
    text = path.read_text().replace(SVG_NAMESPACE, "")
    assert not re.search(r"https?://", text), f"{path.name} names an external URL"
    assert not re.search(r"""(?:src|href)\s*=\s*["']//""", text), f"{path.name} has a protocol-relative URL"
    assert not re.search(r"url\(", text), f"{path.name} loads something through url()"
    assert "@import" not in text and "@font-face" not in text


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_html_sinks(path: Path) -> None:
    """Model output can only reach the page as text: no API that parses a string as HTML or code."""
    text = path.read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in text, f"{path.name} uses {sink}"
    if path.suffix == ".html":
        assert not re.search(r"\son[a-z]+\s*=", text), f"{path.name} has an inline event handler"
        inline = re.findall(r"<script>(.*?)</script>", text, re.S)
        assert inline in ([], [SLASH_REDIRECT]), f"{path.name} has an inline script"


def test_static_files_are_package_data() -> None:
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "surge"
    ]
    for path in FILES:
        rel = path.relative_to(REPO / "surge").as_posix()
        assert any(fnmatch(rel, p) for p in patterns), f"{rel} is not package data"


def _app(web_ui: bool, api_key: str | None = None) -> FastAPI:
    # The web routes never touch the engine; the lifespan (which would) does not run without `with`.
    state = SimpleNamespace(
        client=SimpleNamespace(is_ready=True),
        api_keys=(api_key,) if api_key else (),
        in_flight=InFlight(),
        metrics_require_key=False,
        max_request_body_bytes=1 << 20,
        body_read_timeout=10.0,
        served_model_names=("m",),
        model_path="m",
        created=0,
        max_model_len=16,
    )
    return build_app(cast(ServerState, state), web_ui=web_ui)


def test_build_app_mounts_the_ui_without_hiding_the_api() -> None:
    c = TestClient(_app(web_ui=True))
    assert c.get("/").status_code == 200
    assert c.get("/dashboard").status_code == 200
    assert c.get("/version").json()["version"]
    assert "/" not in c.get("/openapi.json").json()["paths"]


def test_build_app_without_the_ui() -> None:
    c = TestClient(_app(web_ui=False))
    for path in ("/", "/dashboard", "/ui/style.css"):
        r = c.get(path)
        assert r.status_code == 404, path
        assert r.json()["error"]["message"]
    assert c.get("/version").status_code == 200


def test_pages_need_no_api_key_but_the_api_does() -> None:
    """With --api-key the static pages load (they ask for the key); the API still refuses."""
    c = TestClient(_app(web_ui=True, api_key="k"))
    for path in ("/", "/dashboard", "/ui/playground.js"):
        assert c.get(path).status_code == 200, path
    assert c.get("/ui/missing.js").status_code == 404
    assert c.get("/v1/models").status_code == 401
    assert c.get("/v1/models", headers={"Authorization": "Bearer k"}).status_code == 200


@pytest.mark.parametrize(("flags", "web_ui"), [((), True), (("--disable-web-ui",), False)])
def test_disable_web_ui_flag(monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], web_ui: bool) -> None:
    """`surge serve --disable-web-ui` reaches the server options (build_app's switch is tested above)."""
    import surge.server.api_server as api_server
    from surge.cli import build_parser

    seen: list[ServeOptions] = []

    async def fake_run_server(config: object, options: ServeOptions, sock: object, **kw: object) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr(api_server, "run_server", fake_run_server)
    args = build_parser().parse_args(["serve", "--device", "cpu", "--port", "0", *flags])
    # In a thread of its own: Playwright's sync API (the browser tests) keeps an event loop on this one.
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(args.func, args).result() == 0
    assert [o.web_ui for o in seen] == [web_ui]


def test_served_by_default(web_server: Server) -> None:
    """The default `surge serve` serves the playground and logs where it is."""
    srv = web_server
    r = httpx.get(srv.url + "/")
    assert r.status_code == 200 and "Surge playground" in r.text
    assert "playground at http://127.0.0.1:" in srv.log()
