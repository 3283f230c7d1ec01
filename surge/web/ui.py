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
from starlette.types import Scope

STATIC_DIR = Path(__file__).resolve().parent / "static"
"""The folder of the pages' files (package data)."""

ASSETS_PREFIX = "/ui"
"""URL prefix of the pages' CSS, JavaScript and icon files."""


PAGES: frozenset[str] = frozenset({"/", "/dashboard"})
"""The two pages' paths."""


class _Assets(StaticFiles):
    """The pages' files under ``/ui/``, also without ``--root-path``'s prefix (what a proxy that
    strips it sends): Starlette's mount sets the scope's ``root_path`` to the prefix plus ``/ui``,
    which such a path lacks, so :class:`StaticFiles` looked for ``ui/style.css`` in the folder
    (a 404 for every file: the pages came unstyled and dead)."""

    def get_path(self, scope: Scope) -> str:
        """The file's path in the folder (``style.css`` of ``/ui/style.css`` and of
        ``/api/ui/style.css`` under ``--root-path /api``)."""
        path, root = scope["path"], scope.get("root_path", "")
        if (
            root.endswith(ASSETS_PREFIX)
            and not path.startswith(root + "/")
            and path.startswith(ASSETS_PREFIX + "/")
        ):
            scope = {**scope, "root_path": ASSETS_PREFIX}
        return super().get_path(scope)


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

    app.mount(ASSETS_PREFIX, _Assets(directory=STATIC_DIR), name="web-ui")
