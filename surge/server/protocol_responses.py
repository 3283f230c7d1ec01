"""The body of ``POST /v1/responses`` (OpenAI's Responses API) and its translation into the chat
request that Surge serves it with.

A Responses request is served by the chat path (:func:`surge.server.serving_chat.start_chat`):
``instructions`` and ``input`` become chat ``messages`` (the conversation of a stored
``previous_response_id`` first), ``tools`` (flat function definitions) and ``tool_choice``
become chat's nested ones, ``text.format`` becomes ``response_format``, ``reasoning.effort``
``reasoning_effort``, ``max_output_tokens`` ``max_completion_tokens``, and ``include``'s
``message.output_text.logprobs`` with ``top_logprobs`` chat's ``logprobs`` / ``top_logprobs``.
vLLM's extra sampling fields (``top_k``, ``seed``, ``stop``, ``ignore_eos``, ...) are passed
as they are, so they are checked, honoured or refused exactly as on chat. A chat error's
``param`` is given back under the Responses name of the field (:func:`responses_param`), and the
chat fields its message names too (:func:`responses_message`).

Refused with a 400 naming the field: built-in tools (``web_search``, ``file_search``,
``code_interpreter``, ``mcp``, ...), ``background: true`` with ``store: false``, non-text input
parts (images, files, audio), encrypted reasoning on input, ``include`` values other than ``message.output_text.logprobs``
and ``reasoning.encrypted_content`` (:data:`ENCRYPTED_REASONING_INCLUDE`),
``truncation: "auto"``, ``reasoning.summary``, ``text.verbosity``, ``max_tool_calls``, ``prompt``
(stored prompt templates) and ``conversation``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import Field

from surge.server.errors import bad_request
from surge.server.protocol import MAX_TOKEN_COUNT, JsonInt, NullIsUnsetBody, ReasoningEffort, ServiceTier

LOGPROBS_INCLUDE = "message.output_text.logprobs"
"""The ``include`` value that adds each ``output_text`` part's token logprobs."""
ENCRYPTED_REASONING_INCLUDE = "reasoning.encrypted_content"
"""An ``include`` value taken as vLLM takes it (stateless clients such as Codex send it with
``store: false`` to replay the reasoning): Surge never encrypts, a reasoning item's text is
always in its ``content`` (which is what to send back) and ``encrypted_content`` stays null."""

CHAT_PASSTHROUGH_FIELDS = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "request_id",
    "chat_template_kwargs",
    "include_reasoning",
    "structured_outputs",
    "return_tokens_as_token_ids",
    "priority",
    "cache_salt",
    "kv_transfer_params",
    "ec_transfer_params",
    "vllm_xargs",
    "mm_processor_kwargs",
    "media_io_kwargs",
)
"""vLLM's extra fields of a Responses request that chat completions take under the same name:
passed to the chat request as sent, so chat's checks (types, bounds, refusals) apply."""

_PARAM_NAMES = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "response_format.schema": "text.format.schema",
    "response_format.json_schema.schema": "text.format.schema",
    "reasoning_effort": "reasoning.effort",
    "logprobs": "include",
}


def responses_param(param: str | None) -> str | None:
    """The Responses name of a chat request field named by an error (``messages`` -> ``input``,
    ``response_format...`` -> ``text.format...``); other names are the same in both."""
    if param is None:
        return None
    if param in _PARAM_NAMES:
        return _PARAM_NAMES[param]
    if param.startswith("response_format."):
        return "text.format." + param.removeprefix("response_format.").removeprefix("json_schema.")
    return param


class ResponsesRequest(NullIsUnsetBody):
    """Body of ``POST /v1/responses``; ``null`` is "not set" for every field.

    Attributes are OpenAI's (``input``, ``instructions``, ``max_output_tokens``, ``tools``,
    ``text``, ``reasoning``, ...) and vLLM's extras (:data:`CHAT_PASSTHROUGH_FIELDS`, checked by
    the chat request they are passed to). ``store`` (default true, as OpenAI) keeps the
    response in the server's bounded in-memory store for ``GET /v1/responses/{id}`` and
    ``previous_response_id``.
    """

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: JsonInt | None = Field(default=None, le=MAX_TOKEN_COUNT)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: JsonInt | None = Field(default=None, ge=0, le=20)
    store: bool = True
    previous_response_id: str | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    background: bool = False
    stream_options: dict[str, Any] | None = None
    # inert: labels for the caller's records (metadata is echoed in the response)
    metadata: dict[str, str] | None = None
    user: str | None = None
    service_tier: ServiceTier | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # refused unless unset
    max_tool_calls: Any = None
    prompt: Any = None
    conversation: Any = None
    enable_response_messages: Any = None
    previous_input_messages: Any = None
    # vLLM's extras, passed to the chat request as sent (CHAT_PASSTHROUGH_FIELDS)
    top_k: Any = None
    min_p: Any = None
    repetition_penalty: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    seed: Any = None
    stop: Any = None
    stop_token_ids: Any = None
    ignore_eos: Any = None
    min_tokens: Any = None
    skip_special_tokens: Any = None
    spaces_between_special_tokens: Any = None
    include_stop_str_in_output: Any = None
    logit_bias: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    request_id: Any = None
    chat_template_kwargs: Any = None
    include_reasoning: Any = None
    structured_outputs: Any = None
    return_tokens_as_token_ids: Any = None
    priority: Any = None
    cache_salt: Any = None
    kv_transfer_params: Any = None
    ec_transfer_params: Any = None
    vllm_xargs: Any = None
    mm_processor_kwargs: Any = None
    media_io_kwargs: Any = None

    def check_unimplemented(self) -> None:
        """Raise a 400 naming the first field that asks for what Surge does not do."""
        for name in (
            "max_tool_calls",
            "prompt",
            "conversation",
            "enable_response_messages",
            "previous_input_messages",
        ):
            if getattr(self, name) is not None:
                raise bad_request(f"'{name}' is not supported by Surge", param=name)
        if self.background and not self.store:
            raise bad_request(
                "background: true needs store: true (a background response is read back with "
                "GET /v1/responses/{id} from the store)",
                param="background",
            )
        if self.truncation == "auto":
            raise bad_request(
                'truncation "auto" (dropping the start of the conversation) is not supported by Surge: '
                'an input longer than the context is a 400 (use "disabled")',
                param="truncation",
            )
        for value in self.include or ():
            if value not in (LOGPROBS_INCLUDE, ENCRYPTED_REASONING_INCLUDE):
                raise bad_request(
                    f"include value {value!r} is not supported by Surge (only {LOGPROBS_INCLUDE!r} "
                    f"and {ENCRYPTED_REASONING_INCLUDE!r}, whose reasoning comes as plain content)",
                    param="include",
                )
        if self.top_logprobs and not self.wants_logprobs:
            raise bad_request(
                f'top_logprobs needs include: ["{LOGPROBS_INCLUDE}"] (the logprobs are returned only then)',
                param="top_logprobs",
            )
        if self.stream_options is not None:
            if not self.stream:
                raise bad_request(
                    "stream_options can only be set when stream is true", param="stream_options"
                )
            for key, value in self.stream_options.items():
                if key != "include_obfuscation":
                    raise bad_request(
                        f"stream_options.{key} is not supported (only include_obfuscation, inert: "
                        "Surge never pads events)",
                        param=f"stream_options.{key}",
                    )
                if not isinstance(value, bool | None):
                    raise bad_request(
                        "stream_options.include_obfuscation must be true, false or null, got "
                        f"{type(value).__name__} (it is inert: Surge never pads events)",
                        param="stream_options.include_obfuscation",
                    )

    @property
    def wants_logprobs(self) -> bool:
        """Whether ``include`` asks for the output text's logprobs."""
        return LOGPROBS_INCLUDE in (self.include or ())

    @property
    def reasoning_effort(self) -> ReasoningEffort | None:
        """``reasoning.effort`` (chat's ``reasoning_effort``), checked.

        Raises:
            ApiError: 400 naming ``reasoning`` or ``reasoning.<key>``.
        """
        if self.reasoning is None:
            return None
        for key, value in self.reasoning.items():
            if key not in ("effort", "summary", "generate_summary"):
                raise bad_request(f"reasoning.{key} is not a known field", param=f"reasoning.{key}")
            if key != "effort" and value is not None:
                raise bad_request(
                    f"reasoning.{key} is not supported by Surge (the reasoning is returned whole, "
                    "in the reasoning item's content)",
                    param=f"reasoning.{key}",
                )
        effort = self.reasoning.get("effort")
        if effort is not None and effort not in ("none", "minimal", "low", "medium", "high", "xhigh", "max"):
            raise bad_request(f"reasoning.effort {effort!r} is not a known effort", param="reasoning.effort")
        return effort


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Chat's nested tools from the Responses API's flat function tools.

    Raises:
        ApiError: 400 naming ``tools`` for a built-in tool (``web_search``, ``file_search``,
            ``code_interpreter``, ``mcp``, ...) or a malformed function tool.
    """
    if not tools:  # the Responses API takes an empty list (its default): no tools
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise bad_request(
                f"tools[{i}] has type {kind!r}: Surge serves only function tools (built-in tools such as "
                "web_search, file_search, code_interpreter and mcp are not supported)",
                param="tools",
            )
        if "function" in tool and "name" not in tool:
            raise bad_request(
                f"tools[{i}] has chat completions' nested shape "
                '({"type": "function", "function": {...}}): the Responses API takes flat function '
                'tools ({"type": "function", "name": ..., "parameters": ...})',
                param="tools",
            )
        fn = {k: v for k, v in tool.items() if k != "type" and v is not None}
        out.append({"type": "function", "function": fn})
    return out


_MESSAGE_NAMES = {
    "response_format.json_schema.schema": "text.format.schema",
    "response_format.json_schema": "text.format",
    "response_format.schema": "text.format.schema",
    "response_format": "text.format",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "reasoning_effort": "reasoning.effort",
}
"""Chat fields a chat error's message may name, and their Responses names."""
_CHAT_NAME = re.compile(r"\b(" + "|".join(re.escape(k) for k in _MESSAGE_NAMES) + r")\b")


def responses_message(message: str) -> str:
    """A chat error's message with the chat fields it names spelled as the Responses API
    names them (``response_format`` -> ``text.format``, ``max_tokens`` -> ``max_output_tokens``,
    ``reasoning_effort`` -> ``reasoning.effort``), whatever field its ``param`` names."""
    return _CHAT_NAME.sub(lambda m: _MESSAGE_NAMES[m.group(1)], message)


_CHAT_MESSAGE = re.compile(r"\bmessages\[(\d+)\]\.?")


def responses_messages_error(message: str, instructions: bool, history: int) -> tuple[str, str]:
    """A chat error about ``messages[i]`` told as the Responses request has it, and the field
    to name: the ``instructions`` (message 0 when given), the stored conversation of
    ``previous_response_id`` (the ``history`` messages after them: a response cut by
    ``max_output_tokens`` in a function call stores arguments that do not parse) or the
    ``input`` (its items merge into messages, so no index is given).

    Args:
        message: the chat error's message (``messages[2].tool_calls: arguments are not ...``).
        instructions: whether the request has ``instructions``.
        history: how many messages the stored conversation holds (0 without one).
    """
    params: list[str] = []

    def where(m: re.Match[str]) -> str:
        i = int(m.group(1)) - instructions
        if i < 0:
            params.append("instructions")
            return "instructions: "
        if i < history:
            params.append("previous_response_id")
            return f"previous_response_id: message {i} of its stored conversation: "
        params.append("input")
        return "input: "

    text = _CHAT_MESSAGE.sub(where, message)
    return text, params[0] if params else "input"


def responses_tools_message(message: str) -> str:
    """A chat error about ``tools`` with its paths as the Responses API's flat tools have them
    (``tools[0].function.name`` -> ``tools[0].name``)."""
    return re.sub(r"(tools\[\d+\])\.function\b", r"\1", message)


def chat_tool_choice(tool_choice: Any) -> Any:
    """Chat's ``tool_choice`` from the Responses API's: ``"none"``, ``"auto"``, ``"required"``
    or ``{"type": "function", "name": ...}``.

    Raises:
        ApiError: 400 naming ``tool_choice`` for another shape (hosted tools, allowed tools).
    """
    if tool_choice is None or isinstance(tool_choice, str):
        return tool_choice
    if (
        isinstance(tool_choice, dict)
        and tool_choice.get("type") == "function"
        and set(tool_choice) <= {"type", "name"}
    ):
        return {"type": "function", "function": {"name": tool_choice.get("name")}}
    raise bad_request(
        'tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...} '
        "(Surge serves only function tools)",
        param="tool_choice",
    )


def chat_response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat's ``response_format`` from ``text.format`` (``text``, ``json_object``,
    ``json_schema`` with ``name``, ``schema``, ``strict``, ``description``).

    Raises:
        ApiError: 400 naming ``text`` or ``text.<key>`` for another key or shape.
    """
    if text is None:
        return None
    for key, value in text.items():
        if key == "verbosity" and value in (None, "medium"):
            continue  # OpenAI's default: nothing to change
        if key != "format":
            raise bad_request(f"text.{key} is not supported by Surge", param=f"text.{key}")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request(
            'text.format.type must be "text", "json_object" or "json_schema"', param="text.format"
        )
    if fmt["type"] != "json_schema":
        if set(fmt) != {"type"}:
            raise bad_request(f"text.format of type {fmt['type']!r} takes no other key", param="text.format")
        return {"type": fmt["type"]}
    unknown = sorted(set(fmt) - {"type", "name", "schema", "strict", "description"})
    if unknown:
        raise bad_request(f"text.format has an unknown key {unknown[0]!r}", param=f"text.format.{unknown[0]}")
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}


_PART_KEYS: dict[str, frozenset[str]] = {
    "input_text": frozenset({"type", "text", "prompt_cache_breakpoint"}),
    "output_text": frozenset({"type", "text", "annotations", "logprobs"}),
    "text": frozenset({"type", "text"}),
    "refusal": frozenset({"type", "refusal"}),
}
"""The keys of each text part the openai SDK declares (``ResponseInputTextParam``,
``ResponseOutputTextParam``, ``ResponseOutputRefusalParam``); those beside the text are inert:
a replayed output's ``annotations`` and ``logprobs``, a ``prompt_cache_breakpoint`` (Surge caches
every prefix by itself)."""

_ITEM_KEYS: dict[str, frozenset[str]] = {
    "message": frozenset({"type", "role", "content", "id", "status", "phase"}),
    "function_call": frozenset(
        {"type", "arguments", "call_id", "name", "id", "status", "caller", "namespace"}
    ),
    "function_call_output": frozenset(
        {"type", "output", "call_id", "id", "status", "caller", "name", "namespace"}
    ),
    "reasoning": frozenset({"type", "id", "summary", "content", "encrypted_content", "status"}),
}
"""The keys of each input item the openai SDK declares (``EasyInputMessageParam``, ``Message``,
``ResponseOutputMessageParam``, ``ResponseFunctionToolCallParam``, ``FunctionCallOutput``,
``ResponseReasoningItemParam``). ``id``, ``status`` (but an assistant message's, see
:func:`input_messages`), ``phase``, ``caller`` and a call output's ``name`` are inert, as in
vLLM; a ``namespace`` is refused (Surge serves no tool namespaces)."""

_REASONING_PART_KEYS = frozenset({"type", "text"})
"""The keys of a reasoning item's ``summary`` and ``content`` parts (the SDK's ``Summary``,
``Content``)."""


def _check_keys(value: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    """Raise a 400 naming ``where.<key>`` for the first key of ``value`` not in ``allowed``
    (it would be ignored), and for a set ``namespace``."""
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise bad_request(
            f"{where}.{unknown[0]} is not a field of {where} (fields: {', '.join(sorted(allowed))})",
            param=f"{where}.{unknown[0]}",
        )
    if value.get("namespace") is not None:
        raise bad_request(
            f"{where}.namespace: tool namespaces are not supported by Surge (only function tools)",
            param=f"{where}.namespace",
        )


def _part_text(part: Any, where: str) -> dict[str, Any]:
    """One content part of an input message, as a chat text part.

    Raises:
        ApiError: 400 naming ``where`` for a part that is not an object or not text (images,
            files, audio), ``where.type`` for a type that is not a string, ``where.text``
            (``where.refusal``) for a text part whose text is not a string, and ``where.<key>``
            for a key its type does not have.
    """
    if not isinstance(part, dict):
        raise bad_request(f"{where} must be an object with a 'type' (a content part)", param=where)
    kind = part.get("type")
    if not isinstance(kind, str):
        raise bad_request(f"{where}.type must be a string (the part's type)", param=f"{where}.type")
    if kind in _PART_KEYS:
        _check_keys(part, _PART_KEYS[kind], where)
    key = "refusal" if kind == "refusal" else "text"
    if kind in ("input_text", "output_text", "text", "refusal"):
        if not isinstance(part.get(key), str):
            raise bad_request(
                f"{where}.{key} must be a string (a part of type {kind!r})", param=f"{where}.{key}"
            )
        return {"type": "text", "text": part[key]}
    raise bad_request(
        f"{where} has type {kind!r}: Surge takes only text parts (input_text, output_text, refusal)",
        param=where,
    )


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return [_part_text(p, f"{where}[{j}]") for j, p in enumerate(content)]
    raise bad_request(f"{where} must be a string or a list of content parts", param=where)


def _last_assistant(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    last = messages[-1] if messages else None
    return last if last is not None and last.get("role") == "assistant" else None


def call_ids(messages: list[dict[str, Any]]) -> frozenset[str]:
    """The ids of every tool call in ``messages`` (chat form)."""
    return frozenset(
        c["id"] for m in messages for c in m.get("tool_calls") or () if isinstance(c.get("id"), str)
    )


def input_messages(
    items: str | list[dict[str, Any]], known_call_ids: frozenset[str] = frozenset()
) -> tuple[list[dict[str, Any]], bool]:
    """Chat messages from a Responses ``input``, and whether the last one is an unfinished
    assistant message to continue (its ``status`` ``in_progress`` or ``incomplete``, as vLLM).

    A string is one user message. Items: messages (``role`` user, system, developer or
    assistant; ``content`` a string or text parts), ``function_call`` (a tool call of the
    assistant turn before it, or of a new one), ``function_call_output`` (a tool message),
    ``reasoning`` (the reasoning of the assistant turn it belongs to; its ``content`` text,
    else its ``summary``).

    Args:
        items: the request's ``input``.
        known_call_ids: the ``call_id`` of every call earlier in the conversation
            (``previous_response_id``'s stored turns): outputs may answer them.

    Raises:
        ApiError: 400 naming ``input[i]...`` for an item Surge cannot render, a key its type
            does not have (:data:`_ITEM_KEYS`, :data:`_PART_KEYS`; ``input[0].foo``), or a
            ``function_call_output`` whose ``call_id`` answers no earlier call (as OpenAI).
    """
    if isinstance(items, str):
        return [{"role": "user", "content": items}], False
    messages: list[dict[str, Any]] = []
    called = set(known_call_ids)  # the calls an output may answer: those before it
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if isinstance(kind, str) and kind in _ITEM_KEYS:
            _check_keys(item, _ITEM_KEYS[kind], where)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(
                    f"{where}.role must be user, system, developer or assistant, got {role!r}",
                    param=f"{where}.role",
                )
            content = _content(item.get("content"), f"{where}.content")
            prev = _last_assistant(messages)
            if (
                role == "assistant"
                and prev is not None
                and prev.get("content") is None
                and "tool_calls" not in prev
            ):
                prev["content"] = content  # the answer after its reasoning item
            else:
                messages.append({"role": role, "content": content})
        elif kind == "function_call":
            name, args, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(args, str) or not isinstance(call_id, str):
                raise bad_request(f"{where} needs string name, arguments and call_id", param=where)
            try:
                json.loads(args or "{}")
            except (ValueError, RecursionError):  # nested past the parser's depth: not JSON to us
                raise bad_request(
                    f"{where}.arguments is not valid JSON", param=f"{where}.arguments"
                ) from None
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            called.add(call_id)
            prev = _last_assistant(messages)
            if prev is not None:
                prev.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output, call_id = item.get("output"), item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{where}.call_id must be a string", param=f"{where}.call_id")
            if call_id not in called:
                raise bad_request(
                    f"{where}: no function_call before it has call_id {call_id!r}",
                    param=f"{where}.call_id",
                )
            if not isinstance(output, str):
                output = _content(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            if item.get("encrypted_content"):
                raise bad_request(
                    f"{where}.encrypted_content: Surge does not encrypt reasoning; pass its content",
                    param=f"{where}.encrypted_content",
                )
            key = "content" if item.get("content") else "summary"
            parts = item.get(key) or []
            if not isinstance(parts, list):
                raise bad_request(f"{where}.{key} must be a list", param=f"{where}.{key}")
            for j, p in enumerate(parts):
                if not isinstance(p, dict) or not isinstance(p.get("text"), str):
                    raise bad_request(
                        f"{where}.{key}[{j}] must be an object with a string 'text'",
                        param=f"{where}.{key}[{j}]",
                    )
                _check_keys(p, _REASONING_PART_KEYS, f"{where}.{key}[{j}]")
            text = "\n".join(p["text"] for p in parts)
            prev = _last_assistant(messages)
            if prev is not None and "reasoning" not in prev:
                prev["reasoning"] = text
            else:
                messages.append({"role": "assistant", "content": None, "reasoning": text})
        else:
            raise bad_request(
                f"{where} has type {kind!r}: Surge takes message, function_call, function_call_output "
                "and reasoning items",
                param=f"{where}.type",
            )
    last = items[-1] if items else None
    continues = (
        isinstance(last, dict)
        and last.get("type", "message") == "message"
        and last.get("role") == "assistant"
        and last.get("status") in ("in_progress", "incomplete")
    )
    return messages, bool(continues)


def chat_body(
    req: ResponsesRequest, history: list[dict[str, Any]], model: str | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The chat completion body that serves ``req`` (to validate as a
    :class:`~surge.server.protocol.ChatCompletionRequest`), and the conversation it renders
    without ``instructions`` (what a later ``previous_response_id`` continues).

    Args:
        req: the checked Responses request.
        history: the stored conversation of ``previous_response_id`` (input and output), or [].
        model: the model name to ask for.

    Raises:
        ApiError: 400 naming the Responses field at fault.
    """
    req.check_unimplemented()
    new, continues = input_messages(req.input, call_ids(history))
    conversation = [*history, *new]
    messages = list(conversation)
    if req.instructions is not None:
        messages.insert(0, {"role": "system", "content": req.instructions})
    body: dict[str, Any] = {"model": model, "messages": messages, "stream": req.stream}
    if continues:
        body["add_generation_prompt"] = False
        body["continue_final_message"] = True
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    for name in ("temperature", "top_p", "parallel_tool_calls"):
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    tools = chat_tools(req.tools)
    if tools is not None:
        body["tools"] = tools
    if req.tool_choice is not None:
        body["tool_choice"] = chat_tool_choice(req.tool_choice)
    fmt = chat_response_format(req.text)
    if fmt is not None:
        body["response_format"] = fmt
    effort = req.reasoning_effort
    if effort is not None:
        body["reasoning_effort"] = effort
    if req.wants_logprobs:
        body["logprobs"] = True
        body["top_logprobs"] = req.top_logprobs or 0
    for name in CHAT_PASSTHROUGH_FIELDS:
        if name in req.model_fields_set:
            body[name] = getattr(req, name)
    return body, conversation
