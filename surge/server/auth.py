"""API keys: which keys the server accepts, which routes need one, and how a request shows it.

With ``--api-key`` (repeatable, each value a comma list; else the ``SURGE_API_KEY`` environment
variable, else vLLM's ``VLLM_API_KEY``) every route needs ``Authorization: Bearer KEY`` except the open ones: ``/health`` and
``/ping`` (load balancers), ``/load``, ``/version``, ``/tokenizer_info`` (with
``--enable-tokenizer-info-endpoint``, as vLLM's, outside its ``/v1`` key check), ``/metrics`` (unless ``--metrics-require-key``), the API
documentation (``/docs``, ``/redoc``, ``/openapi.json``) and the web UI's static pages (``/``,
``/dashboard``, ``/ui/*``: they hold no data and ask the user for the key themselves). The Messages API's routes
(``/v1/messages``, ``/v1/messages/count_tokens``) also take the key as Anthropic's clients send
it, ``x-api-key: KEY`` (vLLM 0.26 takes only the bearer token there). The scheme
name is case-insensitive and one or more spaces or tabs may follow it (RFC 7235). The check runs in
:class:`surge.server.guard.RequestGuard` before the body is read, so a client without the key
gets a 401 whatever it sends. Keys are compared in constant time and never appear in a log
line or an error body.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Sequence

from surge.web.ui import is_web_ui_path

OPEN_PATHS: frozenset[str] = frozenset(
    {
        "/health",
        "/ping",
        "/load",
        "/tokenizer_info",
        "/version",
        "/metrics",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
        "/openapi.json",
    }
)
"""Routes served without the API key (``/metrics`` only without ``--metrics-require-key``)."""

_BEARER = re.compile(rb"^[ \t]*bearer[ \t]+([^ \t]+)[ \t]*$", re.IGNORECASE)


def validate_api_key(key: str, source: str = "--api-key") -> None:
    """Check an API key at start-up.

    HTTP header values are bytes that clients send as ASCII, so a key outside printable ASCII
    could never be presented; it is refused instead of locking every client out.

    Args:
        key: the key.
        source: where it came from (``--api-key``, ``SURGE_API_KEY`` or ``VLLM_API_KEY``), for
            the message.

    Raises:
        ValueError: the key is empty or has a character outside printable ASCII (one line that
            never contains the key).
    """
    if not key:
        raise ValueError(f"{source}: an API key must not be empty")
    bad = [c for c in key if not " " < c <= "~"]
    if bad:
        raise ValueError(
            f"{source}: an API key must be printable ASCII without spaces (found {bad[0]!r}); "
            "clients send it in an HTTP header"
        )


def parse_api_keys(
    flag_values: Sequence[str] | None, env_value: str | None, vllm_env_value: str | None = None
) -> tuple[str, ...]:
    """The keys of ``--api-key`` (repeatable, each a comma-separated list), else of the
    ``SURGE_API_KEY`` environment variable's value (also a comma list), else vLLM's
    ``VLLM_API_KEY``, one key as vLLM reads it (so that a vLLM deployment's key keeps the server
    closed; set but empty, it asks for no key, as vLLM drops an empty key); empty = no auth.

    Args:
        flag_values: the ``--api-key`` values, or None when the flag was not given.
        env_value: the value of ``SURGE_API_KEY``, or None when it is not set.
        vllm_env_value: the value of ``VLLM_API_KEY``, or None when it is not set.

    Raises:
        ValueError: an empty key or one with a character outside printable ASCII
            (:func:`validate_api_key`): a server locked to an empty key is a mistake.
    """
    source = api_keys_source(flag_values, env_value, vllm_env_value)
    if source is None:
        return ()
    if source == "--api-key":
        values = list(flag_values or ())
    else:
        values = [(env_value if source == "SURGE_API_KEY" else vllm_env_value) or ""]
    keys: list[str] = []
    for value in values:
        # vLLM reads its variable as one key, commas and all (a key with a comma was split in two)
        for key in [value] if source == "VLLM_API_KEY" else value.split(","):
            validate_api_key(key, source)
            if key not in keys:
                keys.append(key)
    return tuple(keys)


def api_keys_source(
    flag_values: Sequence[str] | None, env_value: str | None, vllm_env_value: str | None = None
) -> str | None:
    """Where :func:`parse_api_keys` reads the keys from: ``--api-key``, ``SURGE_API_KEY`` or
    ``VLLM_API_KEY`` (the first of them given), or None: no key. An empty ``VLLM_API_KEY`` counts
    as unset, as in vLLM 0.26 (its ``[key for key in [VLLM_API_KEY] if key]`` drops it), so that
    ``VLLM_API_KEY=""`` runs without a key instead of stopping start-up."""
    if flag_values is not None:
        return "--api-key"
    if env_value is not None:
        return "SURGE_API_KEY"
    if vllm_env_value:
        return "VLLM_API_KEY"
    return None


def bearer_token(authorization: bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header value (raw bytes), or None."""
    if not authorization:
        return None
    m = _BEARER.match(authorization)
    return m.group(1) if m else None


def needs_key(path: str, *, metrics_require_key: bool) -> bool:
    """Whether a request to ``path`` must carry the API key (when one is set)."""
    if path == "/metrics":
        return metrics_require_key
    return path not in OPEN_PATHS and not is_web_ui_path(path)


def is_authorized(authorization: bytes | None, api_keys: Sequence[str]) -> bool:
    """Whether an ``Authorization`` header value (raw bytes) carries ``Bearer <key>`` for one of
    ``api_keys``. Each key is compared in constant time on bytes, so any header bytes are safe."""
    return is_key(bearer_token(authorization), api_keys)


def is_key(token: bytes | None, api_keys: Sequence[str]) -> bool:
    """Whether ``token`` (raw header bytes: a bearer token, or the Messages API's ``x-api-key``
    value) is one of ``api_keys``, each compared in constant time."""
    if token is None:
        return False
    ok = False
    for key in api_keys:
        ok |= hmac.compare_digest(token, key.encode("ascii"))
    return ok
