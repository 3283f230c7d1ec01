"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Anthropic's Messages API, as
vLLM serves it), served by the chat path.

The request becomes a chat completion request (:func:`surge.server.protocol_messages.chat_body`),
which :func:`~surge.server.serving_chat.start_chat` checks, renders and sends to the engine; its
text goes through the chat plan's parsers (reasoning, tool calls) and comes back as content
blocks: ``thinking`` (its ``signature`` a random token, as vLLM's: Surge signs nothing; its text
``""`` under ``thinking.display: "omitted"``), ``text``
and ``tool_use`` (``input`` the parsed arguments), in the order the model wrote them. Both
answers are built by one :class:`_Blocks` from the same parse, so the streamed blocks and
``stop_reason`` are those of the unstreamed answer. ``stop_reason``: ``max_tokens`` when the
length limit cut the output, ``stop_sequence`` (with ``stop_sequence``) when one of
``stop_sequences`` ended it, ``tool_use`` when it ended in complete tool calls, else
``end_turn``. ``usage.input_tokens`` is the templated prompt's tokens (what
``count_tokens`` counts), ``output_tokens`` the generated ones, as vLLM reports them.

Streamed, the events are Anthropic's: ``message_start``, per block ``content_block_start``,
its ``content_block_delta`` events (``text_delta``, ``thinking_delta`` then one
``signature_delta``, ``input_json_delta``) and ``content_block_stop``, then ``message_delta``
(``stop_reason``, ``stop_sequence``, ``usage``) and ``message_stop``, each as ``event: <type>``
with its JSON; an error after the stream started is one ``error`` event. Errors are Anthropic's
body, ``{"type": "error", "error": {"type", "message"}}``
(:func:`surge.server.errors.anthropic_error_body`).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import msgspec
from fastapi import Request
from fastapi.responses import Response
from pydantic import ValidationError

from surge.server.chat_tools import plan_chat
from surge.server.errors import ApiError, anthropic_error_type, bad_request
from surge.server.generation import ChoiceDelta
from surge.server.protocol import ChatCompletionRequest
from surge.server.protocol_messages import (
    MessagesBody,
    MessagesRequest,
    chat_body,
    messages_message,
    messages_param,
    thinking_omitted,
)
from surge.server.serving_chat import note_prompt_part, start_chat
from surge.server.serving_common import (
    ServerState,
    build_sampling_params,
    check_template_kwargs,
    collect,
    render_chat,
    stream_response,
)

_json_encode = msgspec.json.Encoder().encode


def _chat_request(body: MessagesBody, state: ServerState) -> ChatCompletionRequest:
    """The chat request that serves ``body``, validated (``thinking.budget_tokens`` caps the
    reasoning when the server has a reasoning parser).

    Raises:
        ApiError: 400 naming the Messages field whose value chat refuses.
    """
    try:
        return ChatCompletionRequest.model_validate(
            chat_body(body, cap_thinking=state.reasoning_parser is not None)
        )
    except ValidationError as e:
        first = e.errors()[0]
        loc = [str(x) for x in first.get("loc", ())]
        param = messages_param(loc[0] if loc else None)
        raise bad_request(
            f"{param}: {messages_message(str(first.get('msg', 'invalid value')))}", param=param
        ) from None


def _renamed(e: ApiError) -> ApiError:
    """A chat error told with the Messages API's field names."""
    e.param = messages_param(e.param)
    e.message = messages_message(e.message)
    return e


async def create_message(state: ServerState, body: MessagesRequest, request: Request) -> Response:
    """Serve one Messages API request, streamed (SSE) or not.

    Raises:
        ApiError: 400 for a bad request (``param`` names the Messages field), 404 for an unknown
            model, 503 when the engine is gone.
        ClientGone: the client disconnected before a non-streamed answer was ready.
    """
    arrival = time.monotonic()
    chat = _chat_request(body, state)
    try:
        prepared = await start_chat(state, chat, request, "msg", arrival, separator="_")
    except ApiError as e:
        if body.system:
            note_prompt_part(e, "messages", "'system'")
        raise _renamed(e) from None
    plan = prepared.plan
    model = state.model_name
    input_tokens = len(prepared.prompt_ids)

    def usage() -> dict[str, int]:
        return {"input_tokens": prepared.gen.prompt_tokens, "output_tokens": prepared.gen.completion_tokens}

    if not body.stream:
        try:
            results = await collect(request, prepared.gen)
        except ApiError as e:
            raise _renamed(e) from None
        text, finish, stop = results.get(0, ("", None, None))
        blocks = _Blocks(thinking_omitted(body))
        delta, finish = plan.delta(plan.new_parser(), text, finish)
        blocks.feed(delta)
        blocks.close()
        blocks.drop_blank_text()
        blocks.ensure_one()
        reason, sequence = blocks.stop_reason(finish, stop)
        message = {
            "id": prepared.request_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks.blocks,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage(),
        }
        return Response(_json_encode(message), media_type="application/json")

    blocks = _Blocks(thinking_omitted(body))
    parser = plan.new_parser()
    ending: dict[str, Any] = {"finish": None, "stop": None}

    def make_events(deltas: list[ChoiceDelta]) -> list[bytes]:
        out: list[bytes] = []
        for d in deltas:
            delta, finish = plan.delta(parser, d.text, d.finish_reason)
            out.extend(blocks.feed(delta))
            if finish is not None:
                ending["finish"], ending["stop"] = finish, d.stop_reason
        return out

    def closing() -> list[bytes]:
        out = blocks.close()
        out.extend(blocks.ensure_one())
        reason, sequence = blocks.stop_reason(ending["finish"], ending["stop"])
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        out.append(_event("message_delta", delta=delta, usage=usage()))
        out.append(_event("message_stop"))
        return out

    def on_error(error: ApiError) -> list[bytes]:
        return [_event("error", error={"type": anthropic_error_type(error.status), "message": error.message})]

    start = {
        "id": prepared.request_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }
    return await stream_response(
        request,
        prepared.gen,
        make_events,
        None,
        state.sse_queued_interval,
        opening=[_event("message_start", message=start)],
        closing=closing,
        on_error=on_error,
    )


async def count_tokens(state: ServerState, body: MessagesBody) -> dict[str, int]:
    """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, the tokens of the prompt a
    ``/v1/messages`` request with this body renders (its ``usage.input_tokens``), without
    generating; a prompt longer than the context is counted too.

    Raises:
        ApiError: 400 naming the Messages field at fault, 404 for an unknown model.
    """
    chat = _chat_request(body, state)
    try:
        state.check_model(chat.model)
        chat.check_unimplemented()
        # the sampling fields (stop_sequences, top_p, ...) a /v1/messages call would refuse
        state.check_stop(chat.stop_list)
        build_sampling_params(chat, 1, None, token_rules={})
        check_template_kwargs(chat.template_kwargs)
        chat.use_template_defaults(state.default_chat_template_kwargs)
        worker = state.tokenizer_worker
        plan = await worker.run(
            plan_chat, chat, state.tokenizer, state.tool_call_parser, state.reasoning_parser
        )
        ids, _ = await render_chat(
            state,
            chat.messages,
            chat.add_generation_prompt,
            chat.template_kwargs,
            state.template_tools(plan.tools, chat.tool_choice),
            bound=False,
            continue_final_message=chat.continue_final_message,
            add_special_tokens=chat.add_special_tokens,
        )
    except ApiError as e:
        raise _renamed(e) from None
    return {"input_tokens": len(ids)}


def _event(kind: str, **fields: Any) -> bytes:
    """One Anthropic SSE event: ``event: <type>`` and its JSON (``{"type": <type>, ...}``)."""
    return b"event: " + kind.encode() + b"\ndata: " + _json_encode({"type": kind, **fields}) + b"\n\n"


def _tool_input(arguments: str) -> dict[str, Any] | None:
    """A tool call's arguments as ``tool_use.input``: the JSON object they hold, or None when
    they are not one (cut by ``max_tokens`` or a stop sequence)."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):  # nested past the parser's depth: as JSON cut short
        return None
    return value if isinstance(value, dict) else None


class _Blocks:
    """Chat deltas (the chat plan's parse) as content blocks and their streamed events.

    One block is open at a time: text of another kind (reasoning, answer text, a new tool call)
    closes it and opens the next. :attr:`blocks` are the closed blocks, as the answer lists them.
    """

    def __init__(self, omit_thinking: bool = False) -> None:
        self.omit_thinking = omit_thinking  # thinking.display "omitted": no thinking text sent
        self.blocks: list[dict[str, Any]] = []
        self._kind: str | None = None  # "thinking", "text", "tool_use" or None
        self._text: list[str] = []  # the open block's text, in pieces (joined when it closes)
        self._call: tuple[int, str, str] = (-1, "", "")  # chat index, id, name
        self._complete = False  # the last closed tool call's arguments are a JSON object

    @property
    def _index(self) -> int:
        return len(self.blocks)

    def feed(self, delta: dict[str, Any]) -> list[bytes]:
        """The events of one chat delta (reasoning, then content, then tool calls)."""
        out: list[bytes] = []
        if delta.get("reasoning"):
            out.extend(self._open("thinking"))
            if not self.omit_thinking:
                thinking = delta["reasoning"]
                out.append(self._delta({"type": "thinking_delta", "thinking": thinking}, thinking))
        if delta.get("content"):
            out.extend(self._open("text"))
            out.append(self._delta({"type": "text_delta", "text": delta["content"]}, delta["content"]))
        for call in delta.get("tool_calls") or ():
            fn = call.get("function") or {}
            if self._kind != "tool_use" or call["index"] != self._call[0]:
                out.extend(self.close())
                call_id = call.get("id") or f"toolu_{uuid.uuid4().hex}"
                self._call = (call["index"], call_id, fn.get("name") or "")
                out.extend(self._open("tool_use"))
            if fn.get("arguments"):
                out.append(
                    self._delta(
                        {"type": "input_json_delta", "partial_json": fn["arguments"]}, fn["arguments"]
                    )
                )
        return out

    def _delta(self, delta: dict[str, Any], text: str) -> bytes:
        self._text.append(text)
        return _event("content_block_delta", index=self._index, delta=delta)

    def _open(self, kind: str) -> list[bytes]:
        """Close the open block unless it is of ``kind`` (a tool call's is closed by its
        caller), then open a new one."""
        if self._kind == kind and kind != "tool_use":
            return []
        out = self.close() if kind != "tool_use" else []
        self._kind, self._text = kind, []
        if kind == "thinking":
            block: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
        elif kind == "text":
            block = {"type": "text", "text": ""}
        else:
            _, call_id, name = self._call
            block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        out.append(_event("content_block_start", index=self._index, content_block=block))
        return out

    def close(self) -> list[bytes]:
        """The events that end the open block (none open: none), which joins :attr:`blocks`."""
        kind, text = self._kind, "".join(self._text)
        if kind is None:
            return []
        self._kind = None
        out: list[bytes] = []
        if kind == "thinking":
            signature = uuid.uuid4().hex
            out.append(self._delta({"type": "signature_delta", "signature": signature}, ""))
            block: dict[str, Any] = {"type": "thinking", "thinking": text, "signature": signature}
        elif kind == "text":
            block = {"type": "text", "text": text}
        else:
            _, call_id, name = self._call
            parsed = _tool_input(text)
            block = {"type": "tool_use", "id": call_id, "name": name, "input": parsed or {}}
            self._complete = parsed is not None
        out.append(_event("content_block_stop", index=self._index))
        self.blocks.append(block)
        return out

    def drop_blank_text(self) -> None:
        """Drop the text blocks of whitespace alone (Qwen3's ``"\\n\\n"`` between ``</think>`` and
        ``<tool_call>``) from an answer with a ``tool_use`` block, as chat's unstreamed answer drops
        such content next to tool calls (vLLM's ``/v1/messages`` builds its answer from that chat
        answer). Unstreamed answers only: a stream has sent the block as it came, as vLLM's does."""
        if any(b["type"] == "tool_use" for b in self.blocks):
            self.blocks = [b for b in self.blocks if not (b["type"] == "text" and b["text"].isspace())]

    def ensure_one(self) -> list[bytes]:
        """The events of one empty text block when there is no block at all (Anthropic's shape
        of an empty answer, as vLLM gives it)."""
        if self.blocks:
            return []
        return self._open("text") + self.close()

    def stop_reason(self, finish: str | None, stop: str | int | None) -> tuple[str, str | None]:
        """Anthropic's ``stop_reason`` and ``stop_sequence`` for the engine's finish reason and
        stop string, once every block is closed."""
        if finish == "length":
            return "max_tokens", None
        if isinstance(stop, str):
            return "stop_sequence", stop
        if finish == "tool_calls" or (
            self.blocks and self.blocks[-1]["type"] == "tool_use" and self._complete
        ):
            return "tool_use", None
        return "end_turn", None
