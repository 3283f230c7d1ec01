"""``POST /v1/responses`` (OpenAI's Responses API), served by the chat path, and the stored
responses (``GET`` / ``DELETE /v1/responses/{id}``).

The request becomes a chat completion request
(:func:`surge.server.protocol_responses.chat_body`), which :func:`~surge.server.serving_chat.start_chat`
checks, renders and sends to the engine; its text goes through the chat plan's parsers
(reasoning, tool calls) and comes back as Responses output items: a ``reasoning`` item, a
``message`` with one ``output_text`` part, and ``function_call`` items, in that order.
Streamed, the events are those vLLM and OpenAI send (``response.created``,
``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``, the
text, reasoning and function-call argument deltas and their ``done`` events,
``response.output_item.done``, then ``response.completed``, or ``response.incomplete`` when the
status is ``incomplete`` as OpenAI sends it, where vLLM sends ``response.completed`` either way;
its response is the one a non-streamed request gets), each with its ``sequence_number``; an
error after the stream started is an ``error`` event followed by ``response.failed``.

An output cut by ``max_output_tokens`` marks the item it was writing (the last) ``incomplete``,
as OpenAI does. A call cut short (forced by ``tool_choice``, or found by the
``--tool-call-parser``) is its ``function_call`` items (the last with the arguments written so
far), streamed or not: the stream has sent them as items, and the unstreamed answer is the
stream's items (where chat's unstreamed answer to an ``auto`` call that does not parse is the raw
text, as vLLM's). A ``function_call`` whose arguments are not JSON (a stop string
cut them) is never ``completed``: it and the response are ``incomplete``
(``incomplete_details.reason`` null: OpenAI names no reason for a stop string), so a client that
runs the calls of a completed response (the OpenAI Agents SDK) never gets arguments it cannot
parse.

With ``background: true`` (and ``store``) the answer is the ``queued`` response, at once; a task
of its own generates it and stores the finished response under the same id, which
``GET /v1/responses/{id}`` returns and ``POST /v1/responses/{id}/cancel`` stops (``cancelled``).
Streamed, the task records the events, which the creating request streams and
``GET /v1/responses/{id}?stream=true`` replays while it runs. A running one is pinned in the
store (never forgotten as finished responses fill it); when the running ones alone fill the store,
another background request is a 429 naming ``background``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any

import msgspec
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from surge.core.logprobs import LogprobsLists
from surge.server.errors import ApiError, bad_request
from surge.server.generation import ChoiceDelta
from surge.server.logprobs import chat_content
from surge.server.parsers.reasoning import THINK_END
from surge.server.protocol import ChatCompletionRequest
from surge.server.protocol_responses import (
    ResponsesRequest,
    chat_body,
    responses_message,
    responses_messages_error,
    responses_param,
    responses_tools_message,
)
from surge.server.request_id import check_path_segment_id
from surge.server.response_store import StoredResponse
from surge.server.serving_chat import PreparedChat, note_prompt_part, start_chat
from surge.server.serving_common import ServerState, collect, stream_response

_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode
_log = logging.getLogger(__name__)


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _chat_request(body: dict[str, Any]) -> ChatCompletionRequest:
    """Validate the chat body built from a Responses request.

    Raises:
        ApiError: 400 naming the (Responses) field whose value chat refuses.
    """
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        loc = [str(x) for x in first.get("loc", ())]
        param = responses_param(loc[0] if loc else None)
        where = ".".join([param or "", *loc[1:]]) if loc else ""
        raise bad_request(f"{where}: {first.get('msg', 'invalid value')}", param=param) from None


async def create_response(state: ServerState, body: ResponsesRequest, request: Request) -> Response:
    """Serve one Responses API request, streamed (SSE) or not, and store it when ``store``;
    with ``background`` answer the ``queued`` response (or its event stream) and generate it
    in a task of its own.

    Raises:
        ApiError: 400 for a bad request (``param`` names the Responses field), 404 for an
            unknown model or ``previous_response_id``, 429 naming ``background`` when the
            background responses still running fill the store (:func:`_check_background_room`),
            503 when the engine is gone.
        ClientGone: the client disconnected before a non-streamed answer was ready.
    """
    arrival = time.monotonic()
    if body.background:
        _check_background_room(state)  # again when it starts: others may start meanwhile
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        if body.previous_response_id in state.background:
            raise bad_request(
                f"Previous response with id '{body.previous_response_id}' is a background response "
                "still running: wait until GET /v1/responses/{id} reports it finished",
                param="previous_response_id",
            )
        previous = state.responses.get(body.previous_response_id)
        if previous is None:
            raise ApiError(
                404,
                f"Previous response with id '{body.previous_response_id}' not found (Surge keeps "
                "responses stored with store: true in memory, the newest ones only).",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        history = previous.messages()
    chat_dict, conversation = chat_body(body, history, body.model)
    if state.reasoning_parser is not None:
        chat_dict["return_token_ids"] = True  # to count the reasoning's tokens exactly
    chat = _chat_request(chat_dict)
    check_path_segment_id(request, chat.request_id)  # resp_<id> is a path segment of GET/DELETE
    try:
        prepared = await start_chat(
            state,
            chat,
            request,
            "resp",
            arrival,
            separator="_",
            prompt_param="input",
            reserved_ids=state.responses,  # a stored response is never replaced by a later id
            none_excludes_tools=True,  # vLLM 0.26 renders no tools under tool_choice "none" here
        )
    except ApiError as e:
        name = responses_param(e.param)
        if e.param is not None and name is not None and name != e.param and e.param != "messages":
            e.message = e.message.replace(e.param, name)  # "max_completion_tokens must be..."
        e.message = responses_message(e.message)  # "... got response_format and structured_outputs"
        if name == "tools":
            e.message = responses_tools_message(e.message)
        if e.param == "messages":  # "messages[2].tool_calls: ...": the stored conversation's, or the input's
            e.message, name = responses_messages_error(e.message, body.instructions is not None, len(history))
        e.param = name
        if body.instructions:
            note_prompt_part(e, "input", "'instructions'")
        raise
    shape = _ResponseShape(state, body, chat, prepared)
    if body.background and not body.stream:
        return _start_background(state, body, shape, conversation)
    if not body.stream:
        try:
            results = await collect(request, prepared.gen)
        except ApiError as e:  # a grammar the engine refused: named as the Responses field
            e.param = responses_param(e.param)
            raise
        text, finish, _ = results.get(0, ("", None, None))
        message, finish = prepared.plan.message(text, finish, as_streamed=True)
        output = _output_items(message, shape.all_logprobs())
        response = shape.final(output, finish, message)
        encoded = _json_encode(response)
        _store(state, body, response, conversation, message, encoded)
        return Response(encoded, media_type="application/json")

    events = _StreamEvents(shape)
    parser = prepared.plan.new_parser()

    def make_events(deltas: list[ChoiceDelta]) -> list[bytes]:
        out: list[bytes] = []
        for d in deltas:
            delta, finish = prepared.plan.delta(parser, d.text, d.finish_reason)
            out.extend(events.feed(delta, shape.logprobs_of(d.logprobs)))
            if finish is not None:
                events.finish_reason = finish
        return out

    def closing() -> list[bytes]:
        cut = _cut_short(events.finish_reason) or events.open_call_cut()
        status = "incomplete" if cut else "completed"
        out = events.close_item(status)  # the item open at the end is the one cut
        if not events.items:  # nothing generated: one empty message, as the non-streamed answer
            out.extend(events.empty_message(status))
        message = events.message()
        response = shape.final(events.items, events.finish_reason, message)
        _store(state, body, response, conversation, message)
        out.append(events.event(f"response.{response['status']}", response=response))
        return out

    def on_error(error: ApiError) -> list[bytes]:
        failed = shape.base("failed", events.items)
        failed["error"] = {"code": str(error.code), "message": error.message}
        if body.background:  # GET reads it failed, not queued for ever
            state.responses.put(shape.id, StoredResponse(_json_encode(failed), _json_encode(conversation)))
        return [
            events.event(
                "error", code=str(error.code), message=error.message, param=responses_param(error.param)
            ),
            events.event("response.failed", response=failed),
        ]

    opening = [
        events.event(
            "response.created", response=shape.base("queued" if body.background else "in_progress", [])
        ),
        events.event("response.in_progress", response=shape.base("in_progress", [])),
    ]
    streamed = await stream_response(
        request,
        prepared.gen,
        make_events,
        None,
        state.sse_queued_interval,
        opening=opening,
        closing=closing,
        on_error=on_error,
    )
    if body.background:
        return _start_background_stream(state, shape, conversation, streamed.body_iterator)
    return streamed


def _check_background_room(state: ServerState, shape: _ResponseShape | None = None) -> None:
    """Refuse another background response while those still running fill the store: each is
    pinned there until its task ends (never forgotten, so that ``GET`` and ``cancel`` reach
    it), and more would hold the store past its bounds. ``shape``: the request's, whose engine
    request is aborted on refusal.

    Raises:
        ApiError: 429 naming ``background``.
    """
    if not state.responses.pinned_full:
        return
    if shape is not None:
        shape.prepared.gen.abort()
    store = state.responses
    raise ApiError(
        429,
        f"Too many background responses running: the {len(state.background):,} still running fill the "
        f"response store (at most {store.capacity:,} responses, {store.max_bytes // 2**20:,} MiB), which "
        "keeps every running one; retry once one finishes (or cancel one), or send the request without "
        "background",
        param="background",
    )


def _start_background(
    state: ServerState, body: ResponsesRequest, shape: _ResponseShape, conversation: list[dict[str, Any]]
) -> Response:
    """Answer a ``background: true`` request at once with its ``queued`` response (also stored,
    for ``GET /v1/responses/{id}``, and pinned there until its task ends), and generate it in a
    task of its own that stores the finished response (``completed``, ``incomplete`` or
    ``failed``) under the same id.

    Raises:
        ApiError: 429 naming ``background`` (:func:`_check_background_room`).
    """
    _check_background_room(state, shape)
    queued = shape.base("queued", [])
    encoded = _json_encode(queued)
    response_id = shape.id
    state.responses.put(response_id, StoredResponse(encoded, _json_encode(conversation)))
    state.responses.pin(response_id)
    _run_in_background(state, shape, _run_background(state, body, shape, conversation))
    return Response(encoded, media_type="application/json")


def _run_in_background(
    state: ServerState,
    shape: _ResponseShape,
    work: Coroutine[Any, Any, None],
    log: _EventLog | None = None,
) -> None:
    """Run ``work``, a background response's generation, in a task of its own, kept in
    ``state.background`` under the response's id (and ``log``, a streamed one's events, in
    ``state.background_streams``) until it ends; its end, however it comes, drops both, unpins the
    stored response and aborts the engine request (a task cancelled before it ran has not aborted
    it)."""
    response_id = shape.id
    task = asyncio.create_task(work, name=f"background {response_id}")
    state.background[response_id] = task
    if log is not None:
        state.background_streams[response_id] = log

    def done(_: asyncio.Task[None]) -> None:
        state.background.pop(response_id, None)
        if log is not None:
            state.background_streams.pop(response_id, None)
        state.responses.unpin(response_id)
        shape.prepared.gen.abort()

    task.add_done_callback(done)


class _EventLog:
    """The SSE events of a streamed background response, as its task produces them, for any
    number of readers (the creating request's stream, ``GET /v1/responses/{id}?stream=true``);
    event ``i`` has ``sequence_number`` ``i``."""

    def __init__(self) -> None:
        self.events: list[bytes] = []
        self.finished = False
        self._changed = asyncio.Event()

    async def fill(self, body: AsyncIterator[Any], on_first_output: Callable[[], None]) -> None:
        """Read the stream ``body`` to its end (its ``: queued`` comments left out), calling
        ``on_first_output`` with the first event after the two opening ones."""
        try:
            async for chunk in body:
                data = chunk if isinstance(chunk, bytes) else str(chunk).encode()
                if data.startswith(b":"):
                    continue
                self.events.append(data)
                if len(self.events) == 3:
                    on_first_output()
                self._changed.set()
        finally:
            self.finished = True
            self._changed.set()

    async def replay(self, start: int) -> AsyncIterator[bytes]:
        """The events from number ``start`` on, waiting for each until the stream ends (a
        cancelled response's stream ends where it was cancelled)."""
        i = start
        while True:
            if i < len(self.events):
                yield self.events[i]
                i += 1
                continue
            if self.finished:
                return
            self._changed.clear()
            await self._changed.wait()


def _start_background_stream(
    state: ServerState, shape: _ResponseShape, conversation: list[dict[str, Any]], body: AsyncIterator[Any]
) -> Response:
    """Run a streamed background response in a task of its own, which records its events
    (:class:`_EventLog`) and stores the response (``queued``, ``in_progress`` from the first
    output, then finished), and stream its events to this request: hanging up does not stop
    it (``POST /v1/responses/{id}/cancel`` does), and ``GET /v1/responses/{id}?stream=true``
    replays them while it runs. The response is pinned in the store until the task ends.

    Raises:
        ApiError: 429 naming ``background`` (:func:`_check_background_room`).
    """
    _check_background_room(state, shape)
    response_id = shape.id
    history = _json_encode(conversation)  # its input, which a previous_response_id continues
    state.responses.put(response_id, StoredResponse(_json_encode(shape.base("queued", [])), history))
    state.responses.pin(response_id)
    log = _EventLog()

    def running() -> None:
        stored = state.responses.get(response_id)  # queued; not when cancelled or finished
        if stored is not None and _json_decode(stored.response)["status"] == "queued":
            state.responses.put(
                response_id, StoredResponse(_json_encode(shape.base("in_progress", [])), history)
            )

    _run_in_background(state, shape, log.fill(body, running), log)
    return StreamingResponse(
        log.replay(0), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def _run_background(
    state: ServerState, body: ResponsesRequest, shape: _ResponseShape, conversation: list[dict[str, Any]]
) -> None:
    """Generate a background response to the end and store it (``in_progress`` from the
    engine's first output until then); an engine error stores it ``failed`` with the error.
    Cancelled (``POST /v1/responses/{id}/cancel``, ``DELETE``), the engine request is aborted
    and nothing more is stored."""
    gen = shape.prepared.gen
    try:
        text: list[str] = []
        finish: str | None = None
        async for deltas in gen.deltas():
            if not text:  # the engine has started on it: queued -> in_progress, as OpenAI's
                running = _json_encode(shape.base("in_progress", []))
                state.responses.put(shape.id, StoredResponse(running, _json_encode(conversation)))
            for d in deltas:
                text.append(d.text)
                finish = d.finish_reason or finish
        message, finish = shape.prepared.plan.message("".join(text), finish, as_streamed=True)
        response = shape.final(_output_items(message, shape.all_logprobs()), finish, message)
        _store(state, body, response, conversation, message)
    except ApiError as e:  # the engine refused it (a grammar) or went away
        _store_failed(state, shape, conversation, str(e.code), e.message)
    except Exception:  # a bug: the response fails rather than stay queued for ever
        _log.exception("background response %s failed", shape.id)
        _store_failed(
            state, shape, conversation, "server_error", "The server failed while generating the response."
        )
    finally:
        gen.abort()


def _store_failed(
    state: ServerState, shape: _ResponseShape, conversation: list[dict[str, Any]], code: str, message: str
) -> None:
    """Store a background response as ``failed`` with this error (and its input's
    ``conversation``, which a ``previous_response_id`` continues, as vLLM keeps it)."""
    failed = shape.base("failed", [])
    failed["error"] = {"code": code, "message": message}
    state.responses.put(shape.id, StoredResponse(_json_encode(failed), _json_encode(conversation)))


def _cut_short(finish_reason: str | None) -> bool:
    """Whether an output with this finish reason is ``incomplete`` (its length limit cut it:
    ``max_output_tokens`` or the context)."""
    return finish_reason == "length"


def _arguments_cut(arguments: str) -> bool:
    """Whether a ``function_call``'s arguments are not one JSON value (a stop string or the
    length limit cut them; a forced call's grammar allows nothing else that does not parse)."""
    try:
        json.loads(arguments)
    except (ValueError, RecursionError):  # nested past the parser's depth: as JSON cut short
        return True
    return False


def _ends_in_cut_call(output: list[dict[str, Any]]) -> bool:
    """Whether the last output item is a ``function_call`` whose arguments were cut (only the
    last item can be: a call's item is closed when the next one opens, its JSON complete)."""
    return bool(output) and output[-1]["type"] == "function_call" and _arguments_cut(output[-1]["arguments"])


def _store(
    state: ServerState,
    body: ResponsesRequest,
    response: dict[str, Any],
    conversation: list[dict[str, Any]],
    message: dict[str, Any],
    encoded: bytes | None = None,
) -> None:
    """Keep a finished response (``store: true``) with its conversation, the output turn last
    (``encoded``: the response's JSON when already encoded)."""
    if not body.store:
        return
    turn: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("reasoning"):
        turn["reasoning"] = message["reasoning"]
    if message.get("tool_calls"):
        turn["tool_calls"] = message["tool_calls"]
    if encoded is None:
        encoded = _json_encode(response)
    state.responses.put(response["id"], StoredResponse(encoded, _json_encode([*conversation, turn])))


class _ResponseShape:
    """The parts of one request's Response object that do not depend on its output."""

    def __init__(
        self, state: ServerState, body: ResponsesRequest, chat: ChatCompletionRequest, prepared: PreparedChat
    ) -> None:
        self.state = state
        self.body = body
        self.prepared = prepared
        self.names = state.logprob_tokens(chat)
        self.created_at = prepared.created

    @property
    def id(self) -> str:
        return self.prepared.request_id

    def logprobs_of(self, rows: LogprobsLists | None) -> list[dict[str, Any]] | None:
        """``output_text`` logprobs entries of these rows (None when not asked for)."""
        top = self.prepared.lp.logprobs
        if top is None:
            return None
        return chat_content(rows or LogprobsLists(), top, self.names)

    def all_logprobs(self) -> list[dict[str, Any]] | None:
        tracker = self.prepared.gen.choices[0].logprobs
        return self.logprobs_of(None if tracker is None else tracker.rows)

    def base(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        """The Response object with this status and output (usage null until the end)."""
        b = self.body
        text = (
            b.text
            if b.text is not None and b.text.get("format") is not None
            else {"format": {"type": "text"}}
        )
        reasoning = None if b.reasoning is None else {"effort": b.reasoning.get("effort"), "summary": None}
        # the sampling values in force (the model's defaults where the request sent none), as
        # vLLM's ResponsesResponse.from_request reports its sampling parameters'
        in_force = self.prepared.params.with_model_defaults(self.state.sampling_defaults)
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": b.background,
            "error": None,
            "incomplete_details": None,
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "max_tool_calls": None,
            "metadata": b.metadata,
            "model": self.state.model_name,
            "output": output,
            "parallel_tool_calls": b.parallel_tool_calls is not False,
            "previous_response_id": b.previous_response_id,
            "reasoning": reasoning,
            "service_tier": "default",  # the tier that served it: the only one
            "store": b.store,
            "temperature": in_force.temperature,
            "text": text,
            "tool_choice": b.tool_choice if b.tool_choice is not None else "auto",
            "tools": b.tools or [],
            "top_logprobs": b.top_logprobs,
            "top_p": in_force.top_p,
            "truncation": b.truncation,
            "usage": None,
            "user": b.user,
        }

    def final(
        self, output: list[dict[str, Any]], finish_reason: str | None, message: dict[str, Any]
    ) -> dict[str, Any]:
        """The finished Response: ``incomplete`` (reason ``max_output_tokens``) when the output
        was cut by its length limit, its last item (the one cut) ``incomplete`` too, as OpenAI
        marks it; also ``incomplete`` (reason null) when it ends in a ``function_call`` whose
        arguments a stop string cut (not JSON); else ``completed``; with the exact usage."""
        length = _cut_short(finish_reason)
        incomplete = length or _ends_in_cut_call(output)
        response = self.base("incomplete" if incomplete else "completed", output)
        if incomplete:
            response["incomplete_details"] = {"reason": "max_output_tokens" if length else None}
            if output:
                output[-1]["status"] = "incomplete"
        gen = self.prepared.gen
        choice = gen.choices[0]
        p, c = gen.prompt_tokens, gen.completion_tokens
        response["usage"] = {
            "input_tokens": p,
            "input_tokens_details": {"cached_tokens": choice.num_cached_tokens},
            "output_tokens": c,
            "output_tokens_details": {"reasoning_tokens": self._reasoning_tokens(message)},
            "total_tokens": p + c,
        }
        return response

    def _reasoning_tokens(self, message: dict[str, Any]) -> int:
        """Generated tokens up to and including the one that ended the reasoning (all of them
        when it never ended; the ``</think>`` alone when the reasoning was empty), 0 without a
        reasoning parser or reasoning."""
        ids = self.prepared.gen.choices[0].token_ids
        if self.state.reasoning_parser is None or ids is None:
            return 0
        end_id = self.state.tokenizer.convert_tokens_to_ids(THINK_END)
        if end_id in ids:
            return ids.index(end_id) + 1
        return len(ids) if message.get("reasoning") else 0


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if text or status != "in_progress" else []
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def _text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def _message_item(item_id: str, content: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _output_items(message: dict[str, Any], logprobs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A chat message (the chat plan's parse of the whole text) as Responses output items."""
    items: list[dict[str, Any]] = []
    if message.get("reasoning"):
        items.append(_reasoning_item(_new_id("rs"), message["reasoning"], "completed"))
    if message.get("content") or not message.get("tool_calls"):
        text = message.get("content") or ""
        if text or not items:
            items.append(_message_item(_new_id("msg"), [_text_part(text, logprobs)], "completed"))
    for call in message.get("tool_calls") or ():
        fn = call["function"]
        items.append(_call_item(_new_id("fc"), call["id"], fn["name"], fn["arguments"], "completed"))
    return items


class _StreamEvents:
    """Chat deltas (the chat plan's streamed parse) as Responses SSE events.

    One output item is open at a time: text of another kind (reasoning, answer text, a new
    tool call) closes it and opens the next. :attr:`items` are the closed items, as the final
    response lists them.
    """

    def __init__(self, shape: _ResponseShape) -> None:
        self.shape = shape
        self.sequence = 0
        self.items: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self._kind: str | None = None  # "reasoning", "message", "call" or None
        self._id = ""
        self._text: list[str] = []  # the open item's text, in pieces (joined when it closes)
        self._call: tuple[str, str] = ("", "")  # call_id, name
        self._call_index = -1
        self._logprobs: list[dict[str, Any]] | None = None
        self._pending: list[dict[str, Any]] = []

    def event(self, kind: str, **fields: Any) -> bytes:
        """One SSE event (``event: <type>`` and its JSON, with the next ``sequence_number``)."""
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + _json_encode(payload) + b"\n\n"

    def _item_event(self, kind: str, index: int, **fields: Any) -> bytes:
        """:meth:`event` of the open item: its ``item_id``, ``output_index`` ``index``, then
        ``fields``."""
        return self.event(kind, item_id=self._id, output_index=index, **fields)

    @property
    def _index(self) -> int:
        return len(self.items)

    def feed(self, delta: dict[str, Any], logprobs: list[dict[str, Any]] | None) -> list[bytes]:
        """The events of one chat delta (reasoning, then content, then tool calls)."""
        out: list[bytes] = []
        if logprobs:
            self._pending.extend(logprobs)
        if delta.get("reasoning"):
            out.extend(self._open("reasoning"))
            self._text.append(delta["reasoning"])
            out.append(
                self._item_event(
                    "response.reasoning_text.delta",
                    self._index,
                    content_index=0,
                    delta=delta["reasoning"],
                )
            )
        if delta.get("content"):
            out.extend(self._open("message"))
            self._text.append(delta["content"])
            entries, self._pending = self._pending, []
            if self._logprobs is not None:
                self._logprobs.extend(entries)
            out.append(
                self._item_event(
                    "response.output_text.delta",
                    self._index,
                    content_index=0,
                    delta=delta["content"],
                    logprobs=entries,
                )
            )
        for call in delta.get("tool_calls") or ():
            fn = call.get("function", {})
            if self._kind != "call" or call["index"] != self._call_index:
                out.extend(self.close_item())
                self._call_index = call["index"]
                self._call = (call.get("id") or _new_id("call"), fn.get("name") or "")
                out.extend(self._open("call"))
            if fn.get("arguments"):
                self._text.append(fn["arguments"])
                out.append(
                    self._item_event(
                        "response.function_call_arguments.delta",
                        self._index,
                        delta=fn["arguments"],
                    )
                )
        return out

    def _open(self, kind: str) -> list[bytes]:
        """Close the open item unless it is of ``kind`` (a call is opened by its caller after
        closing), then open a new one."""
        if self._kind == kind and kind != "call":
            return []
        out = self.close_item() if kind != "call" else []
        self._kind, self._text = kind, []
        index = self._index
        if kind == "reasoning":
            self._id = _new_id("rs")
            out.append(
                self.event(
                    "response.output_item.added",
                    output_index=index,
                    item=_reasoning_item(self._id, "", "in_progress"),
                )
            )
            part = {"type": "reasoning_text", "text": ""}
            out.append(
                self._item_event(
                    "response.content_part.added",
                    index,
                    content_index=0,
                    part=part,
                )
            )
        elif kind == "message":
            self._id = _new_id("msg")
            self._logprobs = [] if self.shape.prepared.lp.logprobs is not None else None
            out.append(
                self.event(
                    "response.output_item.added",
                    output_index=index,
                    item=_message_item(self._id, [], "in_progress"),
                )
            )
            out.append(
                self._item_event(
                    "response.content_part.added",
                    index,
                    content_index=0,
                    part=_text_part("", None if self._logprobs is None else []),
                )
            )
        else:
            self._id = _new_id("fc")
            call_id, name = self._call
            out.append(
                self.event(
                    "response.output_item.added",
                    output_index=index,
                    item=_call_item(self._id, call_id, name, "", "in_progress"),
                )
            )
        return out

    def close_item(self, status: str = "completed") -> list[bytes]:
        """The ``done`` events of the open item (none open: none), which joins :attr:`items`
        with this ``status`` (``incomplete``: the output was cut in it)."""
        kind, index, text = self._kind, self._index, "".join(self._text)
        if kind is None:
            return []
        self._kind = None
        out: list[bytes] = []
        if kind == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            out.append(
                self._item_event(
                    "response.reasoning_text.done",
                    index,
                    content_index=0,
                    text=text,
                )
            )
            out.append(
                self._item_event(
                    "response.content_part.done",
                    index,
                    content_index=0,
                    part=part,
                )
            )
            item = _reasoning_item(self._id, text, status)
        elif kind == "message":
            if self._logprobs is not None:
                self._logprobs.extend(self._pending)
                self._pending = []
            part = _text_part(text, self._logprobs)
            out.append(
                self._item_event(
                    "response.output_text.done",
                    index,
                    content_index=0,
                    text=text,
                    logprobs=self._logprobs or [],
                )
            )
            out.append(
                self._item_event(
                    "response.content_part.done",
                    index,
                    content_index=0,
                    part=part,
                )
            )
            item = _message_item(self._id, [part], status)
        else:
            call_id, name = self._call
            out.append(
                self._item_event(
                    "response.function_call_arguments.done",
                    index,
                    name=name,
                    arguments=text,
                )
            )
            item = _call_item(self._id, call_id, name, text, status)
        self.items.append(item)
        out.append(self.event("response.output_item.done", output_index=index, item=item))
        return out

    def open_call_cut(self) -> bool:
        """Whether the open item is a ``function_call`` whose arguments so far are not JSON
        (the output ends in it: they were cut)."""
        return self._kind == "call" and _arguments_cut("".join(self._text))

    def empty_message(self, status: str = "completed") -> list[bytes]:
        """The events of an empty ``message`` item (an output with no text at all)."""
        return self._open("message") + self.close_item(status)

    def message(self) -> dict[str, Any]:
        """The closed items as one chat assistant message (what the store keeps)."""
        message: dict[str, Any] = {"content": None}
        calls = []
        for item in self.items:
            if item["type"] == "reasoning":
                message["reasoning"] = (message.get("reasoning") or "") + item["content"][0]["text"]
            elif item["type"] == "message":
                message["content"] = (message["content"] or "") + item["content"][0]["text"]
            else:
                fn = {"name": item["name"], "arguments": item["arguments"]}
                calls.append({"id": item["call_id"], "type": "function", "function": fn})
        if calls:
            message["tool_calls"] = calls
        return message


async def retrieve_response(state: ServerState, response_id: str, query: Mapping[str, str]) -> Response:
    """``GET /v1/responses/{id}``: a stored response, as it was returned.

    A background response is stored ``queued`` until the engine's first output, then
    ``in_progress`` until it finishes, then as it finished (``cancelled`` once cancelled).
    ``stream=true`` replays the events of a streamed background response while it runs, from
    the first or from the one after ``starting_after`` (a ``sequence_number``), then follows
    it to its end. ``include_obfuscation`` is inert (Surge never pads events); ``include`` is
    refused (the stored response is the one its request's ``include`` shaped).

    Raises:
        ApiError: 400 naming ``stream`` (the response is not a streamed background response
            still running), ``starting_after`` (not an integer of -1 or more, or without
            ``stream=true``) or ``include``; 404 when no response of that id is stored (never
            stored, ``store: false``, forgotten as the store filled, or from before a restart).
    """
    stream = _check_retrieve_query(query)
    stored = state.responses.get(response_id)
    if stored is None:
        raise _not_found(response_id)
    if not stream:
        return Response(stored.response, media_type="application/json")
    log = state.background_streams.get(response_id)
    if log is None:
        raise bad_request(
            "stream=true replays the events of a streamed background response (background and "
            "stream both true) while it runs, and this response is not one or has finished: "
            "retrieve it without stream",
            param="stream",
        )
    after = query.get("starting_after")
    start = 0 if after is None else int(after) + 1
    return StreamingResponse(
        log.replay(start), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def _check_retrieve_query(query: Mapping[str, str]) -> bool:
    """Check the query parameters of ``GET /v1/responses/{id}``; whether ``stream`` is true.

    Raises:
        ApiError: 400 naming ``stream`` (not a boolean), ``starting_after`` (not an integer of
            -1 or more, or without ``stream=true``) or ``include``.
    """
    value = query.get("stream", "false").lower()
    if value not in ("true", "1", "false", "0"):
        raise bad_request(f"stream must be true or false, got {query.get('stream')!r}", param="stream")
    stream = value in ("true", "1")
    after = query.get("starting_after")
    if after is not None:
        if not stream:
            raise bad_request(
                "starting_after needs stream=true (it picks the events to replay)", param="starting_after"
            )
        try:
            number = int(after)
        except ValueError:
            number = -2
        if number < -1:
            raise bad_request(
                f"starting_after must be an integer (a sequence_number) of -1 or more, got {after!r}",
                param="starting_after",
            )
    for name in ("include", "include[]"):
        if name in query:
            raise bad_request(
                "include is not supported when retrieving: the stored response is returned as it "
                "was created (send include with the request that creates it)",
                param="include",
            )
    return stream


def cancel_response(state: ServerState, response_id: str) -> Response:
    """``POST /v1/responses/{id}/cancel``: stop a background response still running (its engine
    request is aborted); it is stored, and returned, with status ``cancelled``. A background
    response that has finished (or was cancelled) is returned as stored, as OpenAI answers a
    repeated cancel.

    Raises:
        ApiError: 400 for a response created without ``background`` (as vLLM answers), 404
            when none of that id is stored.
    """
    stored = state.responses.get(response_id)
    if stored is None:
        raise _not_found(response_id)
    response = _json_decode(stored.response)
    if not response.get("background"):
        raise bad_request(
            "Cannot cancel a synchronous response: only a response created with background: true "
            "can be cancelled",
            param="response_id",
        )
    task = state.background.get(response_id)
    if task is None or task.done():  # finished: cancelling again changes nothing
        return Response(stored.response, media_type="application/json")
    task.cancel()
    response["status"] = "cancelled"
    encoded = _json_encode(response)
    state.responses.put(response_id, StoredResponse(encoded, stored.conversation))
    return Response(encoded, media_type="application/json")


def delete_response(state: ServerState, response_id: str) -> dict[str, Any]:
    """``DELETE /v1/responses/{id}``: forget a stored response (a background response still
    running is cancelled first).

    Raises:
        ApiError: 404 when no response of that id is stored.
    """
    task = state.background.get(response_id)
    if task is not None:
        task.cancel()
    if not state.responses.delete(response_id):
        raise _not_found(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


def _not_found(response_id: str) -> ApiError:
    return ApiError(
        404,
        f"Response with id '{response_id}' not found (Surge keeps responses stored with store: true "
        "in memory, the newest ones only).",
        param="response_id",
        code="response_not_found",
    )
