"""CORS settings of `surge serve` (off by default), applied with Starlette's ``CORSMiddleware``.

A module of its own so that the command line parses them without importing the server.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CorsOptions:
    """Cross-origin resource sharing (CORS) settings, as vLLM's flags.

    Attributes:
        allowed_origins: origins allowed to call the API ("*" = any).
        allowed_methods: HTTP methods allowed ("*" = any).
        allowed_headers: request headers allowed ("*" = any).
        allow_credentials: allow cookies and Authorization headers cross-origin.
    """

    allowed_origins: tuple[str, ...]
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
