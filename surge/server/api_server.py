"""The FastAPI app and the server's life: engine start, uvicorn, periodic stats, shutdown.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``
(and ``GET`` / ``DELETE /v1/responses/{id}`` for stored responses), ``POST /v1/messages`` and
``POST /v1/messages/count_tokens`` (Anthropic's Messages API), ``GET /v1/models``
(and ``GET /v1/models/{model}``, 404 ``model_not_found`` for a name not served),
``GET /health`` (200 only while the engine is ready; ``GET`` / ``POST /ping`` answers the
same, vLLM's SageMaker health check), ``GET /metrics`` (Prometheus),
``POST /tokenize``, ``POST /detokenize``, ``POST /v1/chat/completions/render`` and
``POST /v1/completions/render`` (vLLM's: the prompt rendered, nothing generated),
``POST /v1/chat/completions/batch`` (vLLM's: several conversations in one non-streamed answer),
``POST /invocations`` (vLLM's SageMaker route: a chat completions or completions body, keyed
like the ``/v1`` routes),
``GET /version``, ``GET /tokenizer_info`` (with ``--enable-tokenizer-info-endpoint``),
``GET /load`` (vLLM's count of requests being served, see :mod:`surge.server.load`), and the web UI (``GET /``,
``GET /dashboard``, ``/ui/*``; see ``surge.web``). Every error is an OpenAI error body
(Anthropic's on the Messages API's routes); a client mistake is a 4xx, never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.message
import gc
import json
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
import pydantic
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, RedirectResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from transformers import PreTrainedTokenizerBase

import surge
from surge.chat_content_format import describe_content_format
from surge.config import EngineConfig
from surge.engine.client import EngineAttachment, EngineDeadError, EngineStartError
from surge.engine.core_proc import EngineFactory
from surge.generation_defaults import describe_sampling_defaults
from surge.parallel.dp_client import DPEngineClient, make_engine_client
from surge.request import token_ids_in_range
from surge.server.chat_tools import check_tools
from surge.server.chunked_validation import prevalidate
from surge.server.cors import CorsOptions
from surge.server.drain import DrainMiddleware, ShutdownError
from surge.server.errors import (
    MAX_MESSAGE_CHARS,
    MAX_PARAM_CHARS,
    ApiError,
    bad_request,
    clip,
    error_body,
    error_body_for,
    log_text,
    route_path,
)
from surge.server.fast_json import INVALID_JSON, BodyFieldError, FastJSONRoute
from surge.server.guard import GuardConfig, RequestGuard
from surge.server.http_protocol import guarded_http_protocol
from surge.server.load import LoadTrackingMiddleware, ServerLoad
from surge.server.metrics import ServerMetrics
from surge.server.openapi import install_openapi
from surge.server.protocol import (
    BatchChatCompletionRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    check_continue_final_message,
)
from surge.server.protocol_messages import MessagesBody, MessagesRequest
from surge.server.protocol_responses import ResponsesRequest
from surge.server.request_id import RequestIdMiddleware, logged_request_id
from surge.server.serving_chat import create_batch_chat_completion, create_chat_completion
from surge.server.serving_common import ClientGone, ServerState, check_template_kwargs, render_chat
from surge.server.serving_completion import create_completion
from surge.server.serving_messages import count_tokens, create_message
from surge.server.serving_render import render_chat_completion, render_completion
from surge.server.serving_responses import (
    cancel_response,
    create_response,
    delete_response,
    retrieve_response,
)
from surge.server.tls import TlsOptions
from surge.tokenizer import described_chat_template, load_tokenizer
from surge.web.ui import mount_web_ui

logger = logging.getLogger("surge.server")


_NESTED_OBJECT_FIELDS = ("stream_options", "repetition_detection")
"""Request fields that are objects of named keys (no list, no union): a bad key's value is named
by its dotted path (``stream_options.include_obfuscation``, ``repetition_detection.min_count``);
other errors name the top field."""


_CONTENT_FORMS = "a string, a list of content parts or null"
_UNION_FORMS: dict[tuple[str, ...], str] = {
    ("stop",): "a string or a list of strings",
    ("prompt",): "a string, a list of strings, a list of token ids or a list of token-id lists",
    ("messages", "*", "content"): _CONTENT_FORMS,
    ("messages", "*", "*", "content"): _CONTENT_FORMS,  # /v1/chat/completions/batch's conversations
}
"""Request fields that take several JSON forms (by their location in the body, ``*`` for any list
index), and those forms in words: a value of the wrong type in such a field gets a 400 that lists
them (pydantic names only the member it tried, as in ``stop.str: Input should be a valid string``)."""

_JSON_TYPE_NAMES = {
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
    type(None): "null",
}


def _body_loc(error: Any) -> list[str]:
    """A pydantic error's location without FastAPI's leading ``"body"``, as strings."""
    return [str(x) for x in error.get("loc", ()) if x != "body"]


def _field_name(loc: Sequence[str]) -> str:
    """A body location as a client writes it: ``messages[0].content``, ``stop[1]``."""
    return "".join(f"[{x}]" if x.isdigit() else (f".{x}" if i else x) for i, x in enumerate(loc))


def _union_field(loc: Sequence[str]) -> tuple[int, str] | None:
    """The length of the :data:`_UNION_FORMS` location that ``loc`` lies in, followed by the union
    member pydantic tried (``["messages", "0", "content", "str"]``: 3), and that field's forms;
    None outside those fields."""
    for pattern, forms in _UNION_FORMS.items():
        k = len(pattern)
        if (
            len(loc) > k
            and not loc[k].isdigit()
            and all(x.isdigit() if p == "*" else x == p for p, x in zip(pattern, loc, strict=False))
        ):
            return k, forms
    return None


def _error_field(error: Any) -> tuple[str, ...]:
    """The field an error is about: a field of :data:`_UNION_FORMS` without the member pydantic
    tried (each member of a wrong union value gives an error of its own), else its location."""
    loc = _body_loc(error)
    union = _union_field(loc)
    return tuple(loc[: union[0]] if union is not None else loc)


def _union_form_message(errors: Sequence[Any], first: Any, loc: list[str]) -> str | None:
    """The 400's message for a type error in a field of :data:`_UNION_FORMS` (None for any other
    error): the forms the field takes and what came, or, for an element of a list form (the
    member whose error lies deepest: the form that matched the value's shape), which element was
    wrong."""
    union = _union_field(loc)
    if union is None:
        return None
    k, forms = union
    if not str(first.get("type", "")).endswith("_type"):  # a value out of range, not a type
        return None
    field = loc[:k]
    for e in errors:
        e_loc = _body_loc(e)
        if e_loc[:k] == field and len(e_loc) > len(loc) and str(e.get("type", "")).endswith("_type"):
            first, loc = e, e_loc
    name = _field_name(field)
    inside = loc[k + 1 :]  # positions within the member pydantic tried (a list's index)
    if inside:
        where = _field_name([*field, *inside])
        return f"{name}: expected {forms} ({where}: {first.get('msg', 'invalid value')})"
    got = _JSON_TYPE_NAMES.get(type(first.get("input")))
    return f"{name}: expected {forms}" + (f", got {got}" if got else "")


_ENDPOINT_OF_FIELD = {
    "prompt": "POST /v1/completions",
    "messages": "POST /v1/chat/completions",
    "input": "POST /v1/responses",
}
"""The field that marks a body as one endpoint's (and that endpoint): a body that lacks this
route's field and carries another endpoint's was sent to the wrong route, which the 400 says."""


def _wrong_endpoint_hint(errors: Sequence[Any]) -> tuple[str, str] | None:
    """``(missing, other)`` when ``errors`` say a required top-level field of :data:`_ENDPOINT_OF_FIELD`
    is missing and another of them is an unknown field (``prompt`` sent to the chat route), else None."""
    missing = [e["loc"][1] for e in errors if e.get("type") == "missing" and len(e.get("loc", ())) == 2]
    extra = [e["loc"][1] for e in errors if e.get("type") == "extra_forbidden" and len(e.get("loc", ())) == 2]
    for field in missing:
        for other in extra:
            if field in _ENDPOINT_OF_FIELD and other in _ENDPOINT_OF_FIELD:
                return str(field), str(other)
    return None


def _validation_message(exc: RequestValidationError, *, batch: bool = False) -> tuple[str, str | None]:
    """The 400's message and ``param`` for a body (or a query parameter) pydantic refused
    (``batch``: the body of ``/v1/chat/completions/batch``, whose errors inside a conversation
    name ``messages[i]``)."""
    errors = exc.errors()
    if not errors:
        return "Invalid request body", None
    first = errors[0]
    loc = _body_loc(first)
    if loc[:1] == ["query"]:  # a query parameter (/reset_prefix_cache's): named as it is
        loc = loc[1:]
    if first.get("type") == "missing" and tuple(first.get("loc", ())) == ("body",):
        return "The request body is empty: send a JSON object", None
    if first.get("type") == "json_invalid":  # what and where: FastJSONRequest.json's JSONDecodeError
        what = (first.get("ctx") or {}).get("error")
        return (f"{INVALID_JSON}: {what}" if what else INVALID_JSON), None
    wrong_endpoint = _wrong_endpoint_hint(errors)
    if wrong_endpoint is not None:
        field, other = wrong_endpoint
        return (
            f"{field}: Field required (a body with '{other}' goes to {_ENDPOINT_OF_FIELD[other]}; "
            f"this endpoint takes '{field}')",
            field,
        )
    if first.get("type") == "extra_forbidden" and loc:
        where = ".".join(loc)
        return (
            f"Unknown field '{where}': Surge does not know it, and refuses it rather than ignore it "
            "(docs/openai-api.md lists the fields of each endpoint)",
            where,
        )
    where = ".".join(loc)
    union = _union_form_message(errors, first, loc)
    # other fields at fault, each once (a wrong union value gives one error per member pydantic tried)
    others = len({_error_field(e) for e in errors} - {_error_field(first)})
    if union is not None:
        msg = union
    elif where:
        msg = f"{where}: {first.get('msg', 'invalid value')}"
    else:
        msg = str(first.get("msg", "invalid body"))
    if others:
        msg += f" (and {others} more error{'s' if others > 1 else ''})"
    if len(loc) > 1 and loc[0] in _NESTED_OBJECT_FIELDS:  # stream_options.include_usage, not stream_options
        return msg, f"{loc[0]}.{loc[1]}"
    if batch and len(loc) > 1 and loc[0] == "messages" and loc[1].isdigit():  # the conversation at fault
        return msg, f"messages[{loc[1]}]"
    return msg, (loc[0] if loc else None)


def log_rejection(request: Request, status: int, message: str, param: str | None) -> None:
    """Log a rejected request (4xx) at INFO, and a 5xx answer at WARNING: method, path, status,
    the request id that the response's ``X-Request-Id`` header carries (the client's or a fresh
    one), the field at fault and the reason, clipped as in the answer
    (:data:`~surge.server.errors.MAX_PARAM_CHARS`, :data:`~surge.server.errors.MAX_MESSAGE_CHARS`)."""
    level = logging.INFO if status < 500 else logging.WARNING
    logger.log(
        level,
        "%s %s -> %d (request id %s)%s: %s",
        log_text(request.method),
        log_text(request.url.path),
        status,
        logged_request_id(request.scope),
        f" [{log_text(clip(param, MAX_PARAM_CHARS))}]" if param else "",
        log_text(clip(message, MAX_MESSAGE_CHARS)),
    )


def build_app(
    state: ServerState,
    *,
    log_interval: float = 10.0,
    web_ui: bool = True,
    cors: CorsOptions | None = None,
    server_pid: int | None = None,
    tokenizer_info: bool = False,
    load_tracking: bool = False,
    api_docs: bool = True,
    root_path: str = "",
) -> FastAPI:
    """The FastAPI app serving ``state``; its lifespan logs stats and shuts the engine down.

    Args:
        state: engine client, tokenizer, metrics and server settings.
        log_interval: seconds between periodic stats log lines (INFO while busy, DEBUG when idle;
            none in one of several API processes, as vLLM).
        web_ui: serve the playground (``/``) and the dashboard (``/dashboard``), see ``surge.web``.
        cors: CORS settings (Starlette's ``CORSMiddleware``), or None for no CORS headers.
        server_pid: the pid ``/health`` names (default this process; one of several API
            processes names the ``surge serve`` process that started it).
        tokenizer_info: serve ``GET /tokenizer_info`` (``--enable-tokenizer-info-endpoint``).
        load_tracking: count the requests ``GET /load`` answers (``--enable-server-load-tracking``;
            else it answers 0, as vLLM's).
        api_docs: serve the OpenAPI schema (``/openapi.json``), Swagger UI (``/docs``, with
            ``/docs/oauth2-redirect``) and ReDoc (``/redoc``); ``--disable-fastapi-docs`` turns
            all of them off (404), as vLLM's flag does.
        root_path: the path prefix of ``--root-path`` (FastAPI's ``root_path``, as vLLM's flag):
            routes answer with it (``/api/v1/models``) and without it (what a proxy that strips it
            sends); the API docs' server URL carries it. "" for none.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = None
        if state.metrics.shared:  # each process sees its own requests only: no true throughput
            logger.warning(
                "several API processes: no periodic stats line (each sees only its own requests; "
                "vLLM disables it with --api-server-count above 1 too); /metrics counts them all"
            )
        else:
            task = asyncio.create_task(_log_loop(state.metrics, log_interval))
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
            await state.client.shutdown()
            state.tokenizer_worker.close()

    # no 307 to the path without its trailing slash (an empty body, which curl and httpx do not
    # follow): ``DELETE /v1/responses/`` is a 404 error body, as OpenAI answers an unknown URL
    docs: dict[str, Any] = {} if api_docs else {"openapi_url": None, "docs_url": None, "redoc_url": None}
    app = FastAPI(title="Surge", version=surge.__version__, lifespan=lifespan, redirect_slashes=False, **docs)
    app.root_path = root_path  # as vLLM sets it (FastAPI's constructor argument is deprecated)
    app.router.route_class = FastJSONRoute  # before any route: bodies parsed by msgspec
    # Added innermost first: the load count (only requests let through), the drain gate (503),
    # the API key and body limits (RequestGuard), CORS (a browser's preflight carries no key),
    # then the request id, which every response echoes.
    load = ServerLoad()
    if load_tracking:
        app.add_middleware(LoadTrackingMiddleware, load=load)
    app.add_middleware(DrainMiddleware, in_flight=state.in_flight)
    app.add_middleware(
        RequestGuard,
        config=GuardConfig(
            api_keys=state.api_keys,
            metrics_require_key=state.metrics_require_key,
            max_body_bytes=state.max_request_body_bytes,
            body_read_timeout=state.body_read_timeout,
            in_flight=state.in_flight,
        ),
    )
    if cors is not None:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors.allowed_origins),
            allow_methods=list(cors.allowed_methods),
            allow_headers=list(cors.allowed_headers),
            allow_credentials=cors.allow_credentials,
            expose_headers=["X-Request-Id"],
        )
    app.add_middleware(RequestIdMiddleware)

    def answer_error(
        request: Request, status: int, message: str, param: str | None = None, **kw: Any
    ) -> JSONResponse:
        """The error body of this route's API (Anthropic's on ``/v1/messages``, else OpenAI's)."""
        body = error_body_for(
            route_path(request.scope), status, message, param=param, code=kw.pop("code", None)
        )
        return JSONResponse(body, status_code=status, **kw)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        log_rejection(request, exc.status, exc.message, exc.param)
        return answer_error(request, exc.status, exc.message, exc.param, code=exc.code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc, batch=route_path(request.scope) == BATCH_CHAT_PATH)
        content_type = request.headers.get("content-type", "")
        errors = exc.errors()
        if not _parsed_as_json(content_type) and errors and tuple(errors[0].get("loc", ())) == ("body",):
            # FastAPI did not parse a body sent as a form, plain text or `text/json`: say so,
            # not "not a dict"
            message = _not_json_message(content_type)
            param = None
        log_rejection(request, 400, message, param)
        return answer_error(request, 400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if (
            web_ui
            and root_path
            and exc.status_code == 404
            and request.method in ("GET", "HEAD")
            and request.url.path == root_path
        ):
            # the playground at the prefix without its slash (/api), which Starlette routes as ""
            # (no route): to /api/, where its relative URLs stay under the prefix
            query = f"?{request.url.query}" if request.url.query else ""
            return RedirectResponse(f"{root_path}/{query}", status_code=307)
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":  # no route: say which, as OpenAI does
            message = f"Invalid URL ({request.method} {request.url.path})"
        param = exc.param if isinstance(exc, BodyFieldError) else None  # a body msgspec refused
        log_rejection(request, exc.status_code, message, param)
        # keep the exception's headers: a 405 names the allowed methods in ``Allow``
        return answer_error(request, exc.status_code, message, param, headers=exc.headers)

    @app.exception_handler(ClientGone)
    async def _client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error while serving %s", request.url.path)
        return answer_error(request, 500, "Internal server error")

    # The API key (when set) is checked by RequestGuard before the body is read; see
    # surge/server/auth.py for the routes that stay open.

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await create_chat_completion(state, body, request)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await create_completion(state, body, request)

    @app.post(BATCH_CHAT_PATH)
    async def chat_completions_batch(body: BatchChatCompletionRequest, request: Request) -> Response:
        return await create_batch_chat_completion(state, body, request)

    @app.post("/invocations", openapi_extra=_INVOCATIONS_OPENAPI)
    async def invocations(request: Request) -> Response:
        """vLLM's SageMaker route: a chat completions body (with ``messages``) is served as
        ``/v1/chat/completions`` serves it, a completions body (with ``prompt``) as
        ``/v1/completions``, streamed or not."""
        body = await _invocation_body(request)
        if isinstance(body, ChatCompletionRequest):
            return await create_chat_completion(state, body, request)
        return await create_completion(state, body, request)

    # vLLM's render API: the prompt as the generation endpoint would send it, nothing generated
    @app.post("/v1/chat/completions/render")
    async def chat_completions_render(body: ChatCompletionRequest, request: Request) -> Response:
        return await render_chat_completion(state, body, request)

    @app.post("/v1/completions/render")
    async def completions_render(body: CompletionRequest, request: Request) -> Response:
        return await render_completion(state, body, request)

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        return await create_response(state, body, request)

    @app.post("/v1/messages")
    async def messages(body: MessagesRequest, request: Request) -> Response:
        return await create_message(state, body, request)

    @app.post("/v1/messages/count_tokens")
    async def messages_count_tokens(body: MessagesBody) -> dict[str, int]:
        return await count_tokens(state, body)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> Response:
        return await retrieve_response(state, response_id, request.query_params)

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_stored_response(response_id: str) -> Response:
        return cancel_response(state, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def forget_response(response_id: str) -> dict[str, Any]:
        return delete_response(state, response_id)

    # One permission object per card, as vLLM's ``/v1/models`` answers (a legacy OpenAI field that
    # some clients still read as ``permission[0]``); the same id for every name and request.
    permission_id = f"modelperm-{uuid.uuid4().hex}"

    def model_card(name: str) -> dict[str, Any]:
        permission = {
            "id": permission_id,
            "object": "model_permission",
            "created": state.created,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        return {
            "id": name,
            "object": "model",
            "created": state.created,
            "owned_by": "surge",
            "root": state.model_path,
            "parent": None,
            "max_model_len": state.max_model_len,
            "permission": [permission],
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(name) for name in state.served_model_names]}

    # ``path``: served names may hold a slash (``Qwen/Qwen3-8B``), as the OpenAI SDK sends them
    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> dict[str, Any]:
        if not model:  # ``/v1/models/``: a trailing slash, no name: no route, as the other URLs
            raise StarletteHTTPException(status_code=404)
        state.check_model(model)
        return model_card(model)

    # The API process's pid on /health lets a launcher check that it polls the server it started.
    pid_header = {"X-Surge-Pid": str(server_pid or os.getpid())}

    def health_response() -> Response:
        """``/health``'s answer: 200 with an empty body while the engine is up and stepping,
        else a 503 error body that says why (draining, engine not ready or dead, stalled)."""
        if state.in_flight.draining:
            return JSONResponse(error_body(503, "The server is shutting down."), status_code=503)
        if not state.client.is_ready:
            reason = state.client.dead_reason or "the engine is not ready"
            return JSONResponse(error_body(503, reason), status_code=503, headers=pid_header)
        stalled = state.client.seconds_without_progress()
        if stalled > state.engine_stall_timeout:
            pending = state.client.num_inflight
            reason = (
                f"the engine has finished no step for {stalled:.0f} s while {pending} "
                f"request{'' if pending == 1 else 's'} of this API process {'is' if pending == 1 else 'are'} "
                f"pending (--engine-stall-timeout {state.engine_stall_timeout:g})"
            )
            return JSONResponse(error_body(503, reason), status_code=503, headers=pid_header)
        return Response(status_code=200, headers=pid_header)

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Response:
        return health_response()

    # vLLM's SageMaker health check: /health's answer (status, body, headers), GET or POST
    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:
        return health_response()

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(
        reset_running_requests: bool = False, reset_external: bool = False
    ) -> dict[str, Any]:
        """Evict the cached KV blocks no request holds (vLLM's dev route, with its query
        parameters): ``reset_external`` is taken (Surge has no external KV connector);
        ``reset_running_requests=true``, which would preempt running requests to free theirs,
        is a 400 naming it."""
        if reset_running_requests:
            raise bad_request(
                "reset_running_requests=true is not supported: Surge evicts the cached blocks no request "
                "holds and leaves running requests and their blocks alone (leave it out, or false)",
                param="reset_running_requests",
            )
        try:
            state.client.reset_prefix_cache()
        except EngineDeadError as e:
            raise ApiError(503, f"The engine is not available: {e}") from e
        return {"success": True}

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/load")
    async def server_load() -> dict[str, int]:
        return {"server_load": load.count}

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": surge.__version__}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> Response:
        state.check_model(body.model)
        body.check_unimplemented()
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("give exactly one of 'prompt' or 'messages'")
        if body.messages is not None:
            check_template_kwargs(body.chat_template_kwargs)
            state.check_chat_template(body.chat_template)
            check_continue_final_message(body.continue_final_message, body.add_generation_prompt)
            ids, _ = await render_chat(
                state,
                body.messages,
                body.add_generation_prompt,
                state.with_template_defaults(body.chat_template_kwargs),
                None if body.tools is None else check_tools(body.tools),
                bound=False,
                chat_template=body.chat_template,
                continue_final_message=body.continue_final_message,
                add_special_tokens=body.add_special_tokens,
            )
        else:
            assert body.prompt is not None
            asked = {  # their defaults (and null) ask for nothing, as vLLM accepts them
                "add_generation_prompt": body.add_generation_prompt is False,
                "continue_final_message": body.continue_final_message is True,
                "chat_template": body.chat_template is not None,
                "chat_template_kwargs": bool(body.chat_template_kwargs),
                "tools": body.tools is not None,
            }
            chat_only = sorted(name for name, on in asked.items() if on)
            if chat_only:  # they shape a chat prompt: with a plain prompt they would do nothing
                raise bad_request(
                    f"'{chat_only[0]}' applies to 'messages', not to 'prompt'", param=chat_only[0]
                )
            # no context bound here: /tokenize counts texts of any length (clients use it to
            # find the ones that fit); the body limit bounds the work, done off the event loop
            ids = await state.tokenizer_worker.encode(
                body.prompt, add_special_tokens=body.add_special_tokens is not False, param=None
            )
        # vLLM's token_strs: each id's vocabulary string (null unless asked, as vLLM answers)
        strs = await state.tokenizer_worker.token_strings(ids) if body.return_token_strs else None
        # encoded by msgspec: FastAPI's encoder would walk a long token list on the event loop
        return _json_response(
            {"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len, "token_strs": strs}
        )

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> Response:
        state.check_model(body.model)
        # every id a prompt may carry or the model may sample: the model's vocabulary, padding
        # included (Qwen3's ids 151,669-151,935 decode to "", as in vLLM), or the tokenizer's
        vocab = max(len(state.tokenizer), state.vocab_size)
        if not token_ids_in_range(body.tokens, vocab):
            raise bad_request(f"token ids must be in [0, {vocab})", param="tokens")
        return _json_response({"prompt": await state.tokenizer_worker.decode(body.tokens)})

    if tokenizer_info:  # vLLM's, behind its flag: the chat template and the tokenizer's settings

        @app.get("/tokenizer_info")
        async def get_tokenizer_info() -> Response:
            info = await state.tokenizer_worker.run(
                tokenizer_config, state.tokenizer, state.chat_template, utility=True
            )
            return _json_response(info)

    install_openapi(app)
    if web_ui:
        mount_web_ui(app)
    return app


def tokenizer_config(tokenizer: PreTrainedTokenizerBase, chat_template: str | None) -> dict[str, Any]:
    """``GET /tokenizer_info``'s answer, vLLM's: the tokenizer's ``init_kwargs`` (its
    ``tokenizer_config.json`` settings as loaded) without the ``vocab_file`` and ``merges_file``
    paths, each added token as its text, ``tokenizer_class`` (the loaded class's name) and
    ``chat_template``, the template chat requests are rendered with (``--chat-template``, else the
    tokenizer's; left out when there is none)."""

    def plain(obj: Any) -> Any:
        if isinstance(obj, (str, int, float, bool)) or obj is None:
            return obj
        if hasattr(obj, "content"):  # an AddedToken
            return obj.content
        if isinstance(obj, dict):
            return {str(k): plain(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [plain(v) for v in obj]
        return str(obj)  # a setting of another type: its text, rather than a failed answer

    config = dict(getattr(tokenizer, "init_kwargs", None) or {})
    config.pop("vocab_file", None)
    config.pop("merges_file", None)
    info = plain(config)
    info["tokenizer_class"] = type(tokenizer).__name__
    template = chat_template if chat_template is not None else tokenizer.chat_template
    if template:
        info["chat_template"] = template
    else:
        info.pop("chat_template", None)
    return info


BATCH_CHAT_PATH = "/v1/chat/completions/batch"
"""vLLM 0.26's batch chat completions (:func:`surge.server.serving_chat.create_batch_chat_completion`)."""

_INVOCATIONS_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [
                        {"$ref": "#/components/schemas/ChatCompletionRequest"},
                        {"$ref": "#/components/schemas/CompletionRequest"},
                    ]
                }
            }
        },
    }
}
"""``/invocations``' body in the OpenAPI schema: a chat completions or a completions body."""

SAGEMAKER_ADAPTER_HEADER = "X-Amzn-SageMaker-Adapter-Identifier"
"""The header SageMaker names a request's LoRA adapter in (``/invocations``)."""

_NO_HANDLER = (
    "Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest', "
    "'CompletionRequest'] (/invocations serves a chat completions body, with 'messages', or a "
    "completions body, with 'prompt')"
)


async def _invocation_body(request: Request) -> ChatCompletionRequest | CompletionRequest:
    """``/invocations``' body as the request it is, picked as vLLM picks it: a chat completions
    body when it has ``messages`` (vLLM tries chat first), else a completions body when it has
    ``prompt``. Unlike vLLM, which tries the next kind when a body does not validate (and
    answers "Cannot find suitable handler" when none does), a body of one kind with a bad field
    gets that endpoint's 400 naming the field. SageMaker's LoRA adapter header
    (:data:`SAGEMAKER_ADAPTER_HEADER`) replaces the body's ``model``, as vLLM's SageMaker layer
    does: Surge serves no adapter, so any name but a served model's is the usual 404.

    Raises:
        ApiError: 400 for a body that is not a JSON object of either kind (vLLM's message).
        BodyFieldError: a top-level field's value cannot be parsed (a 400 naming it).
        RequestValidationError: a field of the chosen kind is wrong (the usual 400 naming it).
    """
    content_type = request.headers.get("content-type", "")
    if not _parsed_as_json(content_type):
        raise bad_request(_not_json_message(content_type))
    if not await request.body():
        raise bad_request("The request body is empty: send a JSON object")
    try:
        data = await request.json()
    except json.JSONDecodeError as e:
        raise bad_request(f"{INVALID_JSON}: {e.msg}") from None  # the other routes' words
    adapter = request.headers.get(SAGEMAKER_ADAPTER_HEADER)
    if adapter is not None and isinstance(data, dict):  # vLLM's: the header's adapter is the model
        data["model"] = adapter
    kind: type[ChatCompletionRequest] | type[CompletionRequest]
    if isinstance(data, dict) and "messages" in data:
        kind = ChatCompletionRequest
    elif isinstance(data, dict) and "prompt" in data:
        kind = CompletionRequest
    else:
        raise bad_request(_NO_HANDLER)
    await prevalidate(data, kind)  # long lists of messages in chunks, yielding to the event loop
    try:
        return kind.model_validate(data)
    except pydantic.ValidationError as e:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)]
        raise RequestValidationError(errors) from None


def _not_json_message(content_type: str) -> str:
    """The 400's message for a body not sent as JSON: vLLM 0.26's words first (its
    ``validate_json_request``, whose error its handler answers with a 400, not the 415 its
    OpenAPI schema lists), then what this request sent and what to send."""
    return (
        "Unsupported Media Type: Only 'application/json' is allowed (this request's Content-Type: "
        f"{content_type or 'none'!r}); send the body as a JSON object with "
        "'Content-Type: application/json'"
    )


def _parsed_as_json(content_type: str) -> bool:
    """Whether FastAPI parses a body of this ``Content-Type`` as JSON: its own rule,
    ``application/json`` or ``application/*+json`` (parameters allowed; a body without the
    header is not parsed, FastAPI's strict content type)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def _json_response(obj: Any) -> Response:
    """A JSON response encoded by msgspec (fast for long lists)."""
    return Response(msgspec.json.encode(obj), media_type="application/json")


async def _log_loop(metrics: ServerMetrics, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        metrics.log_stats()  # at DEBUG when idle, as vLLM's


@dataclass(frozen=True)
class ServeOptions:
    """Settings of `surge serve` beyond the engine configuration.

    Attributes:
        host, port: where to listen (port 0 picks a free port).
        served_model_names: names accepted in ``model``; default the model folder path.
        api_keys: bearer tokens accepted on /v1 routes; empty = no key needed.
        stream_interval: tokens per SSE event after the first (>= 1).
        chat_template: a Jinja template overriding the tokenizer's, or None.
        trust_request_chat_template: accept a request's own ``chat_template`` (else a 400).
        chat_template_content_format: how message content reaches the chat template: ``auto``
            (each template's own, :mod:`surge.chat_content_format`), ``string`` or ``openai``.
        tool_call_parser: ``hermes``, ``llama3_json`` or ``pythonic`` (tool calls of chat completions), or None.
        reasoning_parser: ``qwen3`` or ``deepseek_r1`` (``reasoning`` / ``reasoning_content``), or None.
        log_interval: seconds between stats log lines.
        access_log: log every HTTP request.
        engine_log_level: ``logging`` level of the engine process.
        uvicorn_log_level: ``logging`` level of uvicorn's loggers (vLLM's ``--uvicorn-log-level``), or
            None (the server's level).
        metrics_require_key: ``/metrics`` needs the API key too.
        metrics_prefix: the metric names' prefix, ``surge`` or ``vllm`` (vLLM's names of the
            metrics vLLM has too; Surge-only ones keep ``surge:``).
        keep_alive_on_engine_death: after the engine dies, stay up answering 503 instead of
            exiting with code 1 (vLLM's ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``).
        max_request_body_bytes: largest request body (bytes); larger ones get a 413.
        header_read_timeout: seconds to receive a request's line and headers (else 408).
        body_read_timeout: seconds to receive a request's body (else 408).
        max_connections: most open HTTP connections; more are refused with a 503.
        engine_stall_timeout: seconds without a finished engine step while requests are
            pending before ``/health`` answers 503.
        sse_queued_interval: seconds between ``: queued`` comments of a stream waiting for its
            first token.
        max_stop_strings: most ``stop`` strings per request.
        max_stop_string_length: longest ``stop`` string (characters).
        max_choices_per_request: most choices (prompts times ``n``) of one completion request.
        web_ui: serve the playground and the dashboard (``--disable-web-ui`` turns them off).
        cors: CORS settings, or None (no CORS headers; the default).
        tls: HTTPS settings (vLLM's ``--ssl-*`` flags, :mod:`surge.server.tls`), or None (plain HTTP).
        shutdown_timeout: seconds requests in flight may run on after SIGTERM / SIGINT.
        log_requests: log one line when each request starts and one when it ends.
        api_server_count: API server processes sharing the engine(s) (see
            :mod:`surge.server.api_workers`).
        return_tokens_as_token_ids: logprob tokens are ``"token_id:<id>"`` for requests that
            leave ``return_tokens_as_token_ids`` unset (vLLM's flag).
        enable_prompt_tokens_details: chat and completions usage carries
            ``prompt_tokens_details.cached_tokens`` (vLLM's flag).
        enable_tokenizer_info_endpoint: serve ``GET /tokenizer_info`` (vLLM's flag).
        enable_server_load_tracking: count the requests ``GET /load`` answers (vLLM's flag).
        enable_force_include_usage: every chat and completions stream carries the usage, as
            with ``stream_options`` ``include_usage`` and ``continuous_usage_stats`` (vLLM's flag).
        disable_fastapi_docs: no ``/openapi.json``, ``/docs`` or ``/redoc`` (vLLM's flag).
        response_role: the ``role`` of chat completions answers under ``add_generation_prompt``
            (vLLM's ``--response-role``).
        default_chat_template_kwargs: chat template variables under every chat request's own
            (vLLM's ``--default-chat-template-kwargs``), or None.
        exclude_tools_when_tool_choice_none: a chat request with ``tool_choice: "none"`` does
            not render its tools into the prompt (vLLM's ``--exclude-tools-when-tool-choice-none``).
        root_path: vLLM's ``--root-path``, the path prefix of a proxy that serves the API under
            it ("" for none; see :func:`build_app`).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    served_model_names: tuple[str, ...] = ()
    api_keys: tuple[str, ...] = ()
    stream_interval: int = 1
    chat_template: str | None = None
    trust_request_chat_template: bool = False
    chat_template_content_format: str = "auto"
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    log_interval: float = 10.0
    access_log: bool = False
    engine_log_level: int = logging.INFO
    uvicorn_log_level: int | None = None
    metrics_require_key: bool = False
    metrics_prefix: str = "surge"
    keep_alive_on_engine_death: bool = False
    max_request_body_bytes: int = 4 * 1024 * 1024
    header_read_timeout: float = 10.0
    body_read_timeout: float = 60.0
    max_connections: int = 4096
    engine_stall_timeout: float = 60.0
    sse_queued_interval: float = 5.0
    max_stop_strings: int = 64
    max_stop_string_length: int = 256
    max_choices_per_request: int = 1024
    web_ui: bool = True
    cors: CorsOptions | None = None
    tls: TlsOptions | None = None
    shutdown_timeout: float = 30.0
    log_requests: bool = True
    api_server_count: int = 1
    return_tokens_as_token_ids: bool = False
    enable_prompt_tokens_details: bool = False
    enable_tokenizer_info_endpoint: bool = False
    enable_server_load_tracking: bool = False
    enable_force_include_usage: bool = False
    disable_fastapi_docs: bool = False
    response_role: str = "assistant"
    default_chat_template_kwargs: dict[str, Any] | None = None
    exclude_tools_when_tool_choice_none: bool = False
    root_path: str = ""


async def run_server(
    config: EngineConfig,
    options: ServeOptions,
    sock: socket.socket,
    engine_factory: EngineFactory | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    attach: list[EngineAttachment] | None = None,
    server_pid: int | None = None,
    metrics_dir: str | None = None,
) -> int:
    """Start the engine process, then serve HTTP on ``sock`` until SIGINT / SIGTERM.

    Args:
        config: the engine configuration (the engine process builds its engine from it).
        options: HTTP-side options.
        sock: a bound listening socket.
        engine_factory: builds the engine in the engine process (tests pass a fake).
        tokenizer: the model's tokenizer if the caller already loaded it, else it is loaded here.
        attach, server_pid, metrics_dir: one of several API processes
            (:mod:`surge.server.api_workers`): the engines it attaches to (one per replica),
            the supervisor's pid (on ``/health``) and the shared prometheus folder.

    Returns:
        The exit code: 0 after a clean shutdown, 2 when the engine refused the configuration or
        the model folder (with ``attach``; else ValueError), 1 when it failed to start otherwise, or died while serving (unless
        ``options.keep_alive_on_engine_death``).

    Raises:
        ValueError: the model folder has no loadable tokenizer, or (without ``attach``) the
            engine refused the model folder or the configuration, or ran out of memory at
            start-up: its one-line message, which the engine process left to this caller to show.
    """
    if tokenizer is None:  # the CLI passes the one it loaded to fail fast
        tokenizer = load_tokenizer(config.model.model)
    loop = asyncio.get_running_loop()
    this_task = asyncio.current_task()
    assert this_task is not None
    client = make_engine_client(
        config, engine_factory=engine_factory, log_level=options.engine_log_level, attach=attach
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, this_task.cancel)
    # a stop signal between the engine's start and the drain handler below is kept and acted on
    # then (it used to kill the process: one of several API processes stopped while it started
    # made the whole server exit with code 1)
    pending_signals: list[signal.Signals] = []
    started = False
    try:
        if attach is None:
            logger.info(
                "starting the engine process (model %s, device %s)", config.model.model, config.device
            )
        else:
            logger.info(
                "attaching to the engine process(es) (pids %s)", ", ".join(str(a.engine_pid) for a in attach)
            )
        info = await client.start()
        started = True
    except EngineStartError as e:
        if e.user_error and attach is None:  # the CLI's one line (the engine process logged none)
            raise ValueError(str(e)) from None  # as `surge generate` says it
        # under several API processes the supervisor reports an engine's refusal or its exit
        # once: each API process's own line would repeat it
        quiet = attach is not None and (e.user_error or e.engine_exited)
        logger.log(logging.DEBUG if quiet else logging.ERROR, "the engine failed to start: %s", e)
        return 2 if e.user_error else 1
    except asyncio.CancelledError:
        logger.info("interrupted during start-up")
        await client.shutdown()
        return 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            if started:
                loop.add_signal_handler(sig, pending_signals.append, sig)
            else:
                loop.remove_signal_handler(sig)
    names = options.served_model_names or (config.model.model,)
    state = ServerState(
        client=client,
        tokenizer=tokenizer,
        # the label is the served model name (the first), as in vLLM: what /v1/models lists
        metrics=ServerMetrics(
            names[0],
            lambda: client.stats,
            client.get_replica_stats if isinstance(client, DPEngineClient) else None,
            lambda: client.is_ready,
            multiprocess_dir=metrics_dir,
            prefix=options.metrics_prefix,
            max_model_len=info.max_model_len,
        ),
        served_model_names=tuple(names),
        model_path=config.model.model,
        max_model_len=info.max_model_len,
        num_kv_blocks=info.num_kv_blocks,
        block_size=info.block_size,
        vocab_size=info.vocab_size,
        stream_interval=options.stream_interval,
        chat_template=options.chat_template,
        trust_request_chat_template=options.trust_request_chat_template,
        chat_template_content_format=options.chat_template_content_format,
        tool_call_parser=options.tool_call_parser,
        reasoning_parser=options.reasoning_parser,
        reasoning_tokens=config.reasoning_tokens,
        api_keys=options.api_keys,
        created=int(time.time()),
        metrics_require_key=options.metrics_require_key,
        max_request_body_bytes=options.max_request_body_bytes,
        body_read_timeout=options.body_read_timeout,
        engine_stall_timeout=options.engine_stall_timeout,
        sse_queued_interval=options.sse_queued_interval,
        max_stop_strings=options.max_stop_strings,
        max_stop_string_length=options.max_stop_string_length,
        max_choices_per_request=options.max_choices_per_request,
        log_requests=options.log_requests,
        return_tokens_as_token_ids=options.return_tokens_as_token_ids,
        prompt_tokens_details=options.enable_prompt_tokens_details,
        force_include_usage=options.enable_force_include_usage,
        response_role=options.response_role,
        default_chat_template_kwargs=options.default_chat_template_kwargs,
        exclude_tools_when_tool_choice_none=options.exclude_tools_when_tool_choice_none,
        scheduling_policy=config.scheduler.scheduling_policy,
        eos_token_ids=config.model.eos_token_ids,
        sampling_defaults=dict(config.model.sampling_defaults),
        max_tokens_cap=config.model.max_tokens_cap,
    )
    for d, engine_client in enumerate(client.replicas if isinstance(client, DPEngineClient) else [client]):
        engine_client.on_grammar_compile_time = state.metrics.grammar_compile_time.observe
        engine_client.on_iteration_tokens = state.metrics.engine(d).iteration_tokens.observe
    scheme = "https" if options.tls is not None else "http"
    if sock.family == socket.AF_UNIX:  # vLLM's --uds
        where = f"unix:{sock.getsockname()}"  # the path
    else:
        host, port = sock.getsockname()[:2]
        where = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"
    logger.info(
        "engine ready (pid %d): model %s (served as %s), device %s, dtype %s%s, max_model_len %d, "
        "KV cache %d block%s x %d tokens = %d tokens, scheduling policy %s",
        info.pid,
        config.model.model,
        ", ".join(names),
        info.device,
        config.model.dtype,
        f", quantization {config.model.quantization}" if config.model.quantization else "",
        info.max_model_len,
        info.num_kv_blocks,
        "" if info.num_kv_blocks == 1 else "s",
        info.block_size,
        info.num_kv_blocks * info.block_size,
        config.scheduler.scheduling_policy,
    )
    content_format = describe_content_format(
        options.chat_template_content_format,
        described_chat_template(tokenizer, options.chat_template),  # named templates: the default
        "the --chat-template" if options.chat_template is not None else "the model's chat template",
    )
    if content_format is not None:
        logger.log(*content_format)
    logger.info(
        describe_sampling_defaults(
            config.model.sampling_defaults,
            config.model.generation_config,
            config.model.max_tokens_cap,
            overridden=bool(config.model.override_generation_config),
        )
    )
    app = build_app(
        state,
        log_interval=options.log_interval,
        web_ui=options.web_ui,
        cors=options.cors,
        server_pid=server_pid,
        tokenizer_info=options.enable_tokenizer_info_endpoint,
        load_tracking=options.enable_server_load_tracking,
        api_docs=not options.disable_fastapi_docs,
        root_path=options.root_path,
    )
    # The tokenizer's vocabulary and the app are long-lived: keep them out of the garbage
    # collector's generations so full collections, which stall every open stream, stay short.
    gc.collect()
    gc.freeze()
    protocol, parser = guarded_http_protocol(
        options.header_read_timeout, options.max_connections, options.body_read_timeout
    )
    if parser != "httptools":
        logger.warning(
            "httptools is not installed: HTTP is parsed by h11 (pure Python), which takes bursts in slower"
        )
    server = _Server(
        uvicorn.Config(
            app,
            loop="none",
            log_config=None,
            access_log=options.access_log,
            log_level=options.uvicorn_log_level,  # None: uvicorn's loggers keep the server's level
            timeout_graceful_shutdown=3,
            timeout_keep_alive=30,
            http=protocol,
            **(options.tls.uvicorn_kwargs() if options.tls is not None else {}),
        )
    )
    drain_task: asyncio.Task[int] | None = None

    engine_died = False

    def on_engine_dead(reason: str) -> None:
        """vLLM's behaviour: a server whose engine died exits (code 1) so that a restart policy
        brings it back, once its in-flight requests have their 503; with
        ``--keep-alive-on-engine-death`` it stays up, answering 503 (``/health`` too)."""
        nonlocal engine_died
        if options.keep_alive_on_engine_death or engine_died:
            return
        engine_died = True
        if drain_task is not None:  # stopping already: the drain ends; the exit code says it died
            return
        logger.error(
            "%s: the server exits (exit code 1; --keep-alive-on-engine-death keeps it up, answering 503)",
            reason,
        )
        state.in_flight.draining = True  # new requests get a 503 while the server stops
        # requests on other (healthy) data-parallel replicas end now, with an error event, not
        # cut off by the server's stop
        state.in_flight.fail_all(ShutdownError(f"The engine is not available: {reason}; the server exits."))
        server.should_exit = True

    # a data-parallel replica's reason names it ("replica 1: ..."): the log line and every 503 say which died
    for engine_client in client.replicas if isinstance(client, DPEngineClient) else [client]:
        engine_client.on_dead = on_engine_dead
    if not client.is_ready:  # it died between its start and here
        on_engine_dead("the engine is gone")

    async def drain_then_exit() -> int:
        try:
            return await state.in_flight.drain(options.shutdown_timeout)
        finally:
            server.should_exit = True

    def on_signal(sig: signal.Signals) -> None:
        nonlocal drain_task
        if drain_task is None:
            logger.info("received %s: draining (--shutdown-timeout %gs)", sig.name, options.shutdown_timeout)
            drain_task = asyncio.ensure_future(drain_then_exit())
            return
        logger.warning("received %s again: ending every request now", sig.name)
        state.in_flight.draining = True
        state.in_flight.fail_all(ShutdownError())
        drain_task.cancel()
        # Not force_exit: uvicorn then skips the lifespan shutdown and its task is cancelled
        # with a traceback; the ended streams close within a moment anyway.
        server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    for sig in pending_signals:
        on_signal(sig)
    logger.info(
        "Surge %s serving on %s (OpenAI API under %s/v1)", surge.__version__, where, options.root_path
    )
    if options.web_ui:
        if sock.family == socket.AF_UNIX:
            logger.info("playground at / and dashboard at /dashboard on %s", where)
        else:
            logger.info("playground at %s/, dashboard at %s/dashboard", where, where)
    try:
        await server.serve(sockets=[sock])
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if drain_task is not None and not drain_task.done():
            drain_task.cancel()
        await client.shutdown()
    logger.info("shut down")
    return 1 if engine_died else 0


class _Server(uvicorn.Server):
    """Uvicorn without its own signal handling: :func:`run_server` drains on SIGINT / SIGTERM
    (see :mod:`surge.server.drain`) and then sets ``should_exit``."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
