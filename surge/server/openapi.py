"""The OpenAPI schema of what the server really answers (served at ``/openapi.json``).

FastAPI's generated schema documents a 422 for every body, which Surge never sends (a bad body
is a 400 OpenAI error), and gives the GET and HEAD of one route (``/health``, ``/metrics``) the
same operation id, with a ``Duplicate Operation ID`` warning. Here the schema is generated from
one view of each route per method, each with its own operation id (``health_health_get``,
``health_health_head``), and post-processed once:

- every error response is the OpenAI error object (``ErrorResponse``), Anthropic's on the
  Messages API's routes (``AnthropicErrorResponse``);
- routes with a body document 400 (bad field), 408 (body too slow), 413 (body too large), 415
  (a compressed body), routes
  with query parameters (``/reset_prefix_cache``) 400;
- every route but the open ones documents 401 (``--api-key``); model routes 404 (unknown
  ``model``); generation routes 503 (engine gone) and their ``text/event-stream`` 200;
  ``/health`` and ``/ping`` their empty 200 and their 503, ``/reset_prefix_cache`` its 503;
  ``/metrics`` its Prometheus text.

Field constraints (bounds, strict types) come from the pydantic models in
:mod:`surge.server.protocol`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from fastapi.utils import generate_unique_id
from starlette.routing import BaseRoute

from surge.server.auth import OPEN_PATHS
from surge.server.errors import ANTHROPIC_PATHS

_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer", "null"]},
            },
        }
    },
}
_ANTHROPIC_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
_ERROR_REF = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
_ANTHROPIC_ERROR_REF = {
    "application/json": {"schema": {"$ref": "#/components/schemas/AnthropicErrorResponse"}}
}
_GENERATION_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/invocations"}
)
_UNSTREAMED_GENERATION_PATHS = frozenset({"/v1/chat/completions/batch"})
_MODEL_PATHS = (
    _GENERATION_PATHS
    | _UNSTREAMED_GENERATION_PATHS
    | {
        "/tokenize",
        "/detokenize",
        "/v1/models/{model}",
        "/v1/messages/count_tokens",
        "/v1/completions/render",
        "/v1/chat/completions/render",
    }
)
_SSE_DESCRIPTION = (
    "With `stream: true`: `data: {chunk}` events, `: queued` comments while waiting for the first "
    "token, then `data: [DONE]`."
)
_RESPONSES_SSE_DESCRIPTION = (
    "With `stream: true`: `event: <type>` / `data: {event}` Responses API events, from "
    "`response.created` to `response.completed` (`response.incomplete` when `max_output_tokens` cut "
    "it; or `error` and `response.failed`), with `: queued` comments while waiting for the first token."
)
_MESSAGES_SSE_DESCRIPTION = (
    "With `stream: true`: `event: <type>` / `data: {event}` Anthropic Messages API events, from "
    "`message_start` to `message_stop` (or an `error` event), with `: queued` comments while waiting "
    "for the first token."
)


_SSE_DESCRIPTIONS = {"/v1/responses": _RESPONSES_SSE_DESCRIPTION, "/v1/messages": _MESSAGES_SSE_DESCRIPTION}


def _openai_error(description: str) -> dict[str, Any]:
    return {"description": description, "content": _ERROR_REF}


def _anthropic_error(description: str) -> dict[str, Any]:
    return {"description": description, "content": _ANTHROPIC_ERROR_REF}


def _one_method_routes(routes: list[BaseRoute]) -> Iterator[BaseRoute]:
    """``routes``, with a route of several methods split into one copy per method, each with
    its own operation id (the schema only reads the copies; the app serves the originals)."""
    for route in routes:
        if not isinstance(route, APIRoute) or len(route.methods) < 2:
            yield route
            continue
        for method in sorted(route.methods):
            one = copy.copy(route)
            one.methods = {method}
            if route.operation_id:
                one.operation_id = f"{route.operation_id}_{method.lower()}"
            else:
                one.operation_id = generate_unique_id(one)
            yield one


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """The corrected OpenAPI schema of ``app`` (see the module docstring)."""
    routes = list(_one_method_routes(app.routes))
    schema = get_openapi(title=app.title, version=app.version, routes=routes)
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["ErrorResponse"] = _ERROR_SCHEMA
    schemas["AnthropicErrorResponse"] = _ANTHROPIC_ERROR_SCHEMA
    for path, operations in schema.get("paths", {}).items():
        for op in operations.values():
            _error = _anthropic_error if path in ANTHROPIC_PATHS else _openai_error
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            names = "the message names" if path in ANTHROPIC_PATHS else "the message and `param` name"
            if "requestBody" in op:
                responses["400"] = _error(f"Invalid request: {names} the field.")
                responses["408"] = _error("The body did not arrive within --body-read-timeout.")
                responses["413"] = _error("The body is larger than --max-request-body-bytes.")
                responses["415"] = _error(
                    "The body was sent with a Content-Encoding other than identity "
                    "(or a Transfer-Encoding other than chunked)."
                )
            elif any(p.get("in") == "query" for p in op.get("parameters", ())):
                responses["400"] = _error(f"Invalid query parameter: {names} the parameter.")
            if path == "/reset_prefix_cache":
                responses["503"] = _error("The engine is not running.")
            if path not in OPEN_PATHS:
                responses["401"] = _error("Missing or wrong API key (only when the server has --api-key).")
            if path in _MODEL_PATHS:
                responses["404"] = _error("The `model` is not served here.")
            if path in _GENERATION_PATHS | _UNSTREAMED_GENERATION_PATHS:
                responses["500"] = _error("A server fault ended the request (a grammar compile worker died).")
                responses["503"] = _error("The engine is not running.")
            if path in _GENERATION_PATHS:
                ok = responses.setdefault("200", {"description": "Successful Response"})
                ok.setdefault("content", {})["text/event-stream"] = {
                    "schema": {"type": "string"},
                    "description": _SSE_DESCRIPTIONS.get(path, _SSE_DESCRIPTION),
                }
            if path == "/v1/responses/{response_id}":
                responses["404"] = _openai_error("No stored response has this id.")
            if path == "/metrics":
                responses["200"] = {
                    "description": "Prometheus metrics in the text exposition format.",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }
            if path in ("/health", "/ping"):
                responses["200"] = {"description": "The engine is up and stepping (an empty body)."}
                responses["503"] = _openai_error("The engine is down, or stalled while requests are pending.")
    return schema


def install_openapi(app: FastAPI) -> None:
    """Serve :func:`build_openapi` (built once, on first use) as ``app``'s schema."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
