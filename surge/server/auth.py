"""API-key checks: which routes need the key, and the one function that checks a request's key.

With ``--api-key`` every route needs ``Authorization: Bearer KEY`` except the open ones:
``/health`` (load balancers), ``/version``, ``/metrics`` (unless ``--metrics-require-key``),
the API documentation (``/docs``, ``/redoc``, ``/openapi.json``) and the web UI's static pages
(``/``, ``/dashboard``, ``/ui/*``: they hold no data and ask the user for the key themselves). The check runs in
:class:`surge.server.guard.RequestGuard` before the body is read, so a client without the key
gets a 401 whatever it sends.
"""

from __future__ import annotations

import hmac

from surge.web.ui import is_web_ui_path

OPEN_PATHS: frozenset[str] = frozenset(
    {"/health", "/version", "/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
)
"""Routes served without the API key (``/metrics`` only without ``--metrics-require-key``)."""


def validate_api_key(key: str) -> None:
    """Check an ``--api-key`` value at start-up.

    HTTP header values are bytes that clients send as ASCII, so a key outside printable ASCII
    could never be presented; it is refused instead of locking every client out.

    Raises:
        ValueError: the key is empty or has a character outside printable ASCII (one line).
    """
    if not key:
        raise ValueError("--api-key must not be empty")
    bad = [c for c in key if not " " < c <= "~"]
    if bad:
        raise ValueError(
            f"--api-key must be printable ASCII without spaces (found {bad[0]!r}); clients send it in an HTTP header"
        )


def needs_key(path: str, *, metrics_require_key: bool) -> bool:
    """Whether a request to ``path`` must carry the API key (when one is set)."""
    if path == "/metrics":
        return metrics_require_key
    return path not in OPEN_PATHS and not is_web_ui_path(path)


def is_authorized(authorization: bytes | None, api_key: str) -> bool:
    """Whether an ``Authorization`` header value (raw bytes) carries ``Bearer <api_key>``.

    Compared in constant time on bytes, so any header bytes are safe to pass.
    """
    if authorization is None:
        return False
    return hmac.compare_digest(authorization, b"Bearer " + api_key.encode("ascii"))
