"""OpenAI-style error responses: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fastapi.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


MAX_MESSAGE_CHARS = 2048
"""Most characters of an error's ``message`` in an answer or a log line: a message may echo
what the client sent (an unknown field's name, a model name, a ``logit_bias`` key), and a 4 MiB
name made a 4 MiB error body and two such log lines per request."""
MAX_PARAM_CHARS = 256
"""Most characters of an error's ``param`` (a field name the client may have made up)."""


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in ``...`` when it was cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def log_text(text: str) -> str:
    """``text`` for a log line: control characters and Unicode line separators written as
    Python escapes (``\\n``, ``\\x00``, ``\\u2028``), so that a client's string (a model
    name, a field name, a percent-decoded path) cannot start a forged log line or make the log
    read as binary."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], text)


class ApiError(Exception):
    """An error answered with an OpenAI error body.

    Args:
        status: HTTP status code.
        message: human-readable message (never a traceback).
        param: the request field at fault, if any.
        code: OpenAI error code (e.g. "model_not_found"); defaults to the status code.
    """

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code if code is not None else status


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    """The OpenAI error object for ``status``; ``message`` and ``param`` clipped to
    :data:`MAX_MESSAGE_CHARS` and :data:`MAX_PARAM_CHARS` characters."""
    return {
        "error": {
            "message": clip(message, MAX_MESSAGE_CHARS),
            "type": _TYPES.get(status, "invalid_request_error" if status < 500 else "internal_server_error"),
            "param": None if param is None else clip(param, MAX_PARAM_CHARS),
            "code": code if code is not None else status,
        }
    }


def error_response(err: ApiError) -> JSONResponse:
    """A JSONResponse carrying ``err``."""
    return JSONResponse(
        error_body(err.status, err.message, param=err.param, code=err.code), status_code=err.status
    )


def bad_request(message: str, param: str | None = None) -> ApiError:
    """A 400 ApiError."""
    return ApiError(400, message, param=param)


def route_path(scope: Mapping[str, Any]) -> str:
    """The path a request is routed by: its ``path`` without the ``--root-path`` prefix
    (``scope["root_path"]``, which the app sets) when it starts with it (``/api/v1/models`` under
    ``--root-path /api`` is ``/v1/models``), else the path as sent (a proxy that strips the prefix
    sends ``/v1/models``), as Starlette routes it; "" when there is no path."""
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", ""))
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root) :] or "/"
    return path


ANTHROPIC_PATHS: frozenset[str] = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
"""The routes of Anthropic's Messages API: their errors are Anthropic's body
(:func:`anthropic_error_body`), and they take the API key in ``x-api-key`` too."""

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status (``api_error`` for other 5xx)."""
    return _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def anthropic_error_body(status: int, message: str, *, param: str | None = None) -> dict[str, Any]:
    """Anthropic's error object, ``{"type": "error", "error": {"type", "message"}}``. It has no
    ``param``: a message that does not name the field at fault starts with it
    (``"max_tokens: Field required"``); clipped as :func:`error_body` clips."""
    if param is not None and param not in message:
        message = f"{clip(param, MAX_PARAM_CHARS)}: {message}"
    return {
        "type": "error",
        "error": {"type": anthropic_error_type(status), "message": clip(message, MAX_MESSAGE_CHARS)},
    }


def error_body_for(
    path: str, status: int, message: str, *, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    """The error object a request to ``path`` gets: Anthropic's on :data:`ANTHROPIC_PATHS`,
    else OpenAI's (:func:`error_body`)."""
    if path in ANTHROPIC_PATHS:
        return anthropic_error_body(status, message, param=param)
    return error_body(status, message, param=param, code=code)
