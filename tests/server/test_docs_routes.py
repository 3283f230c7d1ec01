"""Every route the server serves is in each route list of the docs: docs/openai-api.md's first
paragraph and README.md's "The server's endpoints" paragraph (``POST /reset_prefix_cache`` was in
neither). Swagger UI's own ``/docs/oauth2-redirect`` goes with ``/docs``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from surge.server.api_server import build_app
from tests.server.stub_app import stub_state

ROOT = Path(__file__).resolve().parents[2]
_PARAM = re.compile(r"\{[^}]*\}")


def _routes() -> set[str]:
    """The path of every route of an app with every optional route turned on."""
    app = build_app(stub_state(), web_ui=False, tokenizer_info=True, load_tracking=True)
    return {_PARAM.sub("{}", route.path) for route in app.routes if hasattr(route, "methods")}


def _paragraph(doc: str, start: str) -> str:
    """The paragraph of ``doc`` that begins with ``start``."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    return text[text.index(start) :].split("\n\n", 1)[0]


@pytest.mark.parametrize(
    ("doc", "start"), [("docs/openai-api.md", "Surge serves "), ("README.md", "The server's endpoints")]
)
def test_every_route_is_in_the_route_lists(doc: str, start: str) -> None:
    """Each list names every route on its own (README's lacked ``GET /v1/models/{model}`` and
    ``POST /v1/responses/{id}/cancel`` while the two lists together named them)."""
    text = _paragraph(doc, start)
    named = {_PARAM.sub("{}", m) for m in re.findall(r"(/[\w./{}-]*)", text)} | {"/docs/oauth2-redirect"}
    routes = _routes()
    assert "/v1/chat/completions" in routes and "/v1/responses/{}" in routes  # the app was built whole
    missing = sorted(routes - named)
    assert not missing, f"routes {doc}'s route list does not name: {missing}"
