"""Fixtures of the web UI tests: a live `surge serve` and a headless system Chromium driven by Playwright.

The browser tests (``@pytest.mark.browser``) need the ``playwright`` package (test extras) and a
Chromium from the system's package manager (``apt-get install chromium``); Playwright's own browser
download is never used. Without either they are skipped with a message saying what is missing.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import Server, start_server

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The path of a system Chromium (or Chrome) binary, or None."""
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip(
            "browser tests need a system Chromium: `apt-get install chromium` (looked for "
            + ", ".join(CHROMIUM_NAMES)
            + " on PATH)"
        )
    return path


@pytest.fixture(scope="session")
def browser(chromium_path: str) -> Iterator[Any]:
    """A headless system Chromium (one for the session)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("browser tests need the `playwright` package (pip install -e '.[test]')")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium_path, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def web_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`surge serve` with the bundled model and the web UI, shared by the web tests."""
    srv = start_server(tmp_path_factory.mktemp("web"))
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    """A fresh page (own context: own session storage) that fails the test on a JavaScript error."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(30_000)
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def static_dir() -> Path:
    """The folder of the web UI's files."""
    from surge.web.ui import STATIC_DIR

    return STATIC_DIR
