"""Mounts the static playground and dashboard on the API's FastAPI app.

The pages are plain HTML, CSS and JavaScript files with no build step and no external URL, so they
work offline. They talk to the server only through its public endpoints (``/v1/models``,
``/v1/chat/completions``, ``/v1/completions``, ``/metrics``, ``/health``).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static"
"""The folder of the pages' files (package data)."""

ASSETS_PREFIX = "/ui"
"""URL prefix of the pages' CSS, JavaScript and icon files."""


PAGES: frozenset[str] = frozenset({"/", "/dashboard"})
"""The two pages' paths."""


def is_web_ui_path(path: str) -> bool:
    """Whether ``path`` is one of the web UI's static files (served without the API key)."""
    return path in PAGES or path.startswith(ASSETS_PREFIX + "/")


def mount_web_ui(app: FastAPI) -> None:
    """Serve the playground at ``GET /``, the dashboard at ``GET /dashboard`` and their files under ``/ui/``.

    Only these three paths are added, so routes registered before or after stay reachable.
    The HTML is served with ``Cache-Control: no-cache`` (revalidated through its ETag), so a
    browser picks up a new version of Surge at once.

    Raises:
        RuntimeError: the static folder is missing (a broken installation).
    """
    if not (STATIC_DIR / "index.html").is_file():
        raise RuntimeError(f"the web UI files are missing from {STATIC_DIR}")
    headers = {"Cache-Control": "no-cache"}

    @app.get("/", include_in_schema=False)
    async def playground() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=headers)

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(STATIC_DIR / "dashboard.html", media_type="text/html", headers=headers)

    app.mount(ASSETS_PREFIX, StaticFiles(directory=STATIC_DIR), name="web-ui")
