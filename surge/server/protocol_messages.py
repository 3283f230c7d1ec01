"""The body of ``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Anthropic's Messages
API, as vLLM serves it) and its translation into the chat request that Surge serves it with.

A Messages request is served by the chat path (:func:`surge.server.serving_chat.start_chat`), as
vLLM's is: ``system`` becomes a leading system message; ``messages`` become chat messages
(``text`` blocks text parts, an assistant's ``tool_use`` blocks its ``tool_calls``, its
``thinking`` blocks its ``reasoning``, a user's ``tool_result`` blocks ``tool`` messages before
the rest of its turn); ``tools`` (``name``, ``description``, ``input_schema``) become chat's
function tools; ``tool_choice`` ``auto`` / ``any`` / ``tool`` / ``none`` becomes ``auto`` /
``required`` / named / ``none``, and its ``disable_parallel_tool_use`` ``parallel_tool_calls:
false``; ``max_tokens`` ``max_completion_tokens``; ``stop_sequences`` ``stop``; ``thinking``
``{"type": "enabled"}`` / ``{"type": "disabled"}`` the chat template's ``enable_thinking``
(Qwen3's switch; vLLM 0.26 ignores ``thinking``; ``display: "omitted"`` sends thinking blocks
without their text); ``output_config`` ``response_format`` and
``reasoning_effort`` (vLLM's). A last message from the assistant is continued (Anthropic's
prefill), not answered.

Accepted as inert (Anthropic clients send them routinely): ``metadata``, ``service_tier``,
``cache_control`` (top-level, on blocks and on tools: Surge caches prefixes by itself), ``citations: null`` on a text block,
``signature`` on a thinking block, ``redacted_thinking`` blocks (opaque, skipped as vLLM skips
them) and ``thinking.budget_tokens`` where the server has no reasoning parser (with one it
caps the reasoning: :func:`chat_body`); Claude Code's ``x-anthropic-billing-header`` system block is dropped, as vLLM drops
it (:data:`BILLING_HEADER`). Refused with a 400 naming the field: unknown fields, ``image`` / ``document`` and
other non-text blocks, server tools (a tool ``type`` other than ``custom``), ``tool_result`` in
an assistant turn and ``tool_use`` in a user's.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import Field

from surge.server.errors import bad_request
from surge.server.protocol import MAX_TOKEN_COUNT, JsonInt, NullIsUnsetBody, RequestBody, integral_number

_INERT_BLOCK_KEYS = frozenset({"cache_control"})
"""Keys any content block may carry and that change nothing here (prompt caching hints)."""

_BLOCK_KEYS: dict[str, frozenset[str]] = {
    "text": frozenset({"type", "text", "citations"}),
    "thinking": frozenset({"type", "thinking", "signature"}),
    "redacted_thinking": frozenset({"type", "data"}),
    "tool_use": frozenset({"type", "id", "name", "input"}),
    "tool_result": frozenset({"type", "tool_use_id", "content", "is_error"}),
}
"""The keys of each content block Surge takes (plus :data:`_INERT_BLOCK_KEYS`)."""

_TOOL_KEYS = frozenset({"type", "name", "description", "input_schema", "strict", "cache_control"})
_TOOL_CHOICE_KEYS = {
    "auto": frozenset({"type", "disable_parallel_tool_use"}),
    "any": frozenset({"type", "disable_parallel_tool_use"}),
    "tool": frozenset({"type", "name", "disable_parallel_tool_use"}),
    "none": frozenset({"type"}),
}
_CHAT_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}

_PARAM_NAMES = {
    "max_completion_tokens": "max_tokens",
    "max_tokens": "max_tokens",
    "stop": "stop_sequences",
    "response_format": "output_config.format",
    "reasoning_effort": "output_config.effort",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
    "thinking_token_budget": "thinking.budget_tokens",
}
_CHAT_NAME = re.compile(
    r"\b(max_completion_tokens|response_format|reasoning_effort|parallel_tool_calls|thinking_token_budget)\b"
)
_MESSAGES_INDEX = re.compile(r"\bmessages\[\d+\]")
_CHAT_SCHEMA = "response_format.json_schema.schema"
_MESSAGES_SCHEMA = "output_config.format.schema"
"""Where chat's ``response_format`` holds the schema of ``output_config.format``, and where the
Messages API holds it."""


def messages_param(param: str | None) -> str | None:
    """The Messages API name of a chat request field named by an error (``max_completion_tokens``
    -> ``max_tokens``, ``stop`` -> ``stop_sequences``, ``response_format.json_schema.schema`` ->
    ``output_config.format.schema``, ``messages[3]...`` -> ``messages``: the chat
    messages are not the request's, one for one)."""
    if param is None:
        return None
    if param.startswith("messages"):
        return "messages"
    if param == _CHAT_SCHEMA:
        return _MESSAGES_SCHEMA
    top = param.split(".", 1)[0].split("[", 1)[0]
    if top in _PARAM_NAMES:
        return _PARAM_NAMES[top]
    return param


_CHAT_PHRASES = (
    (_CHAT_SCHEMA, _MESSAGES_SCHEMA),
    ('tool_choice "auto"', 'tool_choice {"type": "auto"} (the default with tools)'),
    (
        '(use "required", a named function or "none" otherwise)',
        '(use {"type": "any"}, {"type": "tool", "name": ...} or {"type": "none"} otherwise)',
    ),
    (
        "tool_choice required or a named function cannot be combined with another structured output",
        'tool_choice {"type": "any"} or {"type": "tool"} cannot be combined with output_config.format',
    ),
)
"""Chat errors' words for chat's ``tool_choice`` values, and the Messages API's."""
_CHAT_STOP = re.compile(r"(?<![\w.])stop (?=must|has )")
"""Chat's ``stop`` at the start of a clause about it ("stop must not contain an empty string",
"stop has 9 strings"): the Messages API's ``stop_sequences``."""


def messages_message(message: str) -> str:
    """A chat error's message with the chat fields it names spelled as the Messages API has them
    (``tools[0].function.name`` -> ``tools[0].name``, ``tools[0].function.parameters`` ->
    ``tools[0].input_schema``), and without the index of a chat message
    (which is not the request's)."""
    for chat, ours in _CHAT_PHRASES:
        message = message.replace(chat, ours)
    message = _CHAT_STOP.sub("stop_sequences ", message)
    message = _CHAT_NAME.sub(lambda m: _PARAM_NAMES[m.group(1)], message)
    message = re.sub(r"(tools\[\d+\])\.function\.parameters\b", r"\1.input_schema", message)
    message = re.sub(r"(tools\[\d+\])\.function\b", r"\1", message)
    return _MESSAGES_INDEX.sub("messages", message)


class MessagesMetadata(RequestBody):
    """Anthropic's ``metadata``: ``user_id`` only (another key is a 400 naming it, as Anthropic
    answers). Inert: a label for the caller's records."""

    user_id: str | None = None


class MessagesBody(NullIsUnsetBody):
    """The fields of a Messages request (``null`` is "not set" for every one), as
    ``/v1/messages/count_tokens`` takes them: the same body as ``/v1/messages``, whose sampling
    fields (``max_tokens``, ``stream``, ``temperature``, ...) are checked but count nothing.

    Attributes are Anthropic's (``model``, ``messages``, ``system``, ``max_tokens``,
    ``stop_sequences``, ``stream``, ``temperature``, ``top_p``, ``top_k``, ``metadata``,
    ``tools``, ``tool_choice``, ``thinking``, ``output_config``) and vLLM's
    ``chat_template_kwargs``, ``kv_transfer_params`` and ``ec_transfer_params`` (checked by the
    chat request they are passed to).
    """

    model: str | None = None
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    max_tokens: JsonInt | None = Field(default=None, ge=1, le=MAX_TOKEN_COUNT)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: JsonInt | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    # inert: labels for the caller's records (Anthropic's user_id); prompt caching (Surge caches
    # prefixes by itself) and the service tier (one server, one tier)
    metadata: MessagesMetadata | None = None
    cache_control: dict[str, Any] | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    # vLLM's extras, passed to the chat request as sent
    chat_template_kwargs: dict[str, Any] | None = None
    kv_transfer_params: Any = None
    ec_transfer_params: Any = None


def thinking_omitted(body: MessagesBody) -> bool:
    """Whether ``thinking.display`` is ``omitted``: the ``thinking`` blocks come without their
    text (``""``, the signature kept), as Anthropic redacts them."""
    return body.thinking is not None and body.thinking.get("display") == "omitted"


class MessagesRequest(MessagesBody):
    """Body of ``POST /v1/messages``: :class:`MessagesBody` with ``max_tokens`` required, as
    Anthropic requires it."""

    max_tokens: JsonInt = Field(ge=1, le=MAX_TOKEN_COUNT)


def _check_keys(block: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    for key in block:
        if key not in allowed and key not in _INERT_BLOCK_KEYS:
            raise bad_request(f"{where}.{key}: Surge does not know this field", param=f"{where}.{key}")


def _block(block: Any, where: str) -> tuple[str, dict[str, Any]]:
    """A content block's type and the block, its keys checked.

    Raises:
        ApiError: 400 naming ``where`` for a block that is not an object or whose type Surge
            does not take (``image``, ``document``, server tool blocks, ...), ``where.type`` for
            a type that is not a string.
    """
    if not isinstance(block, dict):
        raise bad_request(f"{where} must be an object with a 'type' (a content block)", param=where)
    kind = block.get("type")
    if not isinstance(kind, str):
        raise bad_request(f"{where}.type must be a string (the block's type)", param=f"{where}.type")
    if kind not in _BLOCK_KEYS:
        what = "images" if kind == "image" else f"{kind!r} blocks"
        raise bad_request(
            f"{where} has type {kind!r}: Surge serves text models and does not take {what} "
            "(content blocks: text, tool_use, tool_result, thinking, redacted_thinking)",
            param=where,
        )
    _check_keys(block, _BLOCK_KEYS[kind], where)
    return kind, block


def _string(block: dict[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise bad_request(f"{where}.{key} must be a string", param=f"{where}.{key}")
    return value


BILLING_HEADER = "x-anthropic-billing-header"
"""How the text block starts that Claude Code puts in the system prompt with a hash that changes
every request: dropped from the system prompt, as vLLM drops it, so that the prefix cache serves
the rest of the conversation."""


def _system_parts(content: Any, where: str) -> list[dict[str, Any]]:
    """System text (a string or text blocks) as chat text parts, without Claude Code's
    :data:`BILLING_HEADER` block."""
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else _text_parts(content, where)
    return [p for p in parts if p["text"] and not p["text"].startswith(BILLING_HEADER)]


def _text_parts(content: Any, where: str) -> list[dict[str, Any]]:
    """Text blocks as chat text parts.

    Raises:
        ApiError: 400 naming the block that is not a text block.
    """
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of text blocks", param=where)
    parts = []
    for j, raw in enumerate(content):
        kind, block = _block(raw, f"{where}[{j}]")
        if kind != "text":
            raise bad_request(
                f"{where}[{j}] has type {kind!r}: only text blocks go here", param=f"{where}[{j}].type"
            )
        parts.append({"type": "text", "text": _string(block, "text", f"{where}[{j}]")})
    return parts


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``tool_result`` block as a chat ``tool`` message; an ``is_error`` result's text starts
    with ``Error: `` (chat's tool messages have no error flag, so the model reads it)."""
    call_id = _string(block, "tool_use_id", where)
    content = block.get("content", "")
    if isinstance(content, str):
        text = content
    else:
        text = "\n".join(p["text"] for p in _text_parts(content, f"{where}.content"))
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise bad_request(f"{where}.is_error must be true or false", param=f"{where}.is_error")
    if is_error:
        text = "Error: " + text
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``tool_use`` block as a chat tool call."""
    call_id, name = _string(block, "id", where), _string(block, "name", where)
    arguments = block.get("input", {})
    if not isinstance(arguments, dict):
        raise bad_request(f"{where}.input must be an object", param=f"{where}.input")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _assistant(content: list[Any], where: str) -> dict[str, Any]:
    """An assistant turn's blocks as one chat assistant message."""
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for j, raw in enumerate(content):
        at = f"{where}[{j}]"
        kind, block = _block(raw, at)
        if kind == "text":
            parts.append({"type": "text", "text": _string(block, "text", at)})
        elif kind == "thinking":
            reasoning.append(_string(block, "thinking", at))
        elif kind == "tool_use":
            calls.append(_tool_call(block, at))
        elif kind == "tool_result":
            raise bad_request(
                f"{at}: a tool_result block goes in the user turn after the tool_use", param=f"{at}.type"
            )
    message: dict[str, Any] = {"role": "assistant", "content": parts or None}
    if reasoning:
        message["reasoning"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _user(content: list[Any], where: str) -> list[dict[str, Any]]:
    """A user turn's blocks as chat messages: its tool results (``tool`` messages), then the
    rest as one user message (when there is any)."""
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, raw in enumerate(content):
        at = f"{where}[{j}]"
        kind, block = _block(raw, at)
        if kind == "text":
            parts.append({"type": "text", "text": _string(block, "text", at)})
        elif kind == "tool_result":
            results.append(_tool_result(block, at))
        else:
            raise bad_request(
                f"{at} has type {kind!r}: a user turn takes text and tool_result blocks", param=f"{at}.type"
            )
    return results + ([{"role": "user", "content": parts}] if parts or not results else [])


def _tool_use_ids(content: Any) -> frozenset[str]:
    """The ids of an assistant message's ``tool_use`` blocks."""
    if not isinstance(content, list):
        return frozenset()
    return frozenset(
        b["id"]
        for b in content
        if isinstance(b, dict) and b.get("type") == "tool_use" and isinstance(b.get("id"), str)
    )


def _check_tool_results(content: list[Any], calls: frozenset[str], where: str) -> None:
    """Each ``tool_result`` block answers a ``tool_use`` of the assistant message just before.

    Raises:
        ApiError: 400 naming ``messages[i].content[j].tool_use_id`` (as Anthropic refuses it).
    """
    for j, block in enumerate(content):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            call_id = block.get("tool_use_id")
            if isinstance(call_id, str) and call_id not in calls:
                raise bad_request(
                    f"{where}[{j}].tool_use_id {call_id!r} answers no tool_use block of the assistant "
                    "message just before it",
                    param=f"{where}[{j}].tool_use_id",
                )


def chat_messages(body: MessagesBody) -> tuple[list[dict[str, Any]], bool]:
    """The chat messages of a Messages request (``system`` first), and whether the last one is
    the assistant's to continue (Anthropic's prefill).

    Raises:
        ApiError: 400 naming the field at fault (``system``, ``messages[i].role``,
            ``messages[i].content[j]...``; a ``tool_result`` whose ``tool_use_id`` no
            ``tool_use`` of the assistant message before it has).
    """
    out: list[dict[str, Any]] = []
    system = [] if body.system is None else _system_parts(body.system, "system")
    calls: frozenset[str] = frozenset()  # the tool_use ids of the message before (if the assistant's)
    for i, message in enumerate(body.messages):
        where = f"messages[{i}]"
        role, content = message.get("role"), message.get("content")
        _check_keys(message, frozenset({"role", "content"}), where)
        if role not in ("user", "assistant", "system"):
            raise bad_request(
                f"{where}.role must be 'user', 'assistant' or (vLLM's) 'system', got {role!r}",
                param=f"{where}.role",
            )
        if not isinstance(content, str | list):
            raise bad_request(
                f"{where}.content must be a string or a list of content blocks", param=f"{where}.content"
            )
        if role == "user" and isinstance(content, list):
            _check_tool_results(content, calls, f"{where}.content")
        calls = _tool_use_ids(content) if role == "assistant" else frozenset()
        if role == "system":  # vLLM's: its text joins the leading system message (templates want one, first)
            system.extend(_system_parts(content, f"{where}.content"))
        elif isinstance(content, str):
            out.append({"role": role, "content": content})
        elif role == "assistant":
            out.append(_assistant(content, f"{where}.content"))
        else:
            out.extend(_user(content, f"{where}.content"))
    if system:
        out.insert(0, {"role": "system", "content": system})
    continues = bool(body.messages) and body.messages[-1].get("role") == "assistant"
    if continues and "tool_calls" in out[-1]:
        last = len(body.messages) - 1
        raise bad_request(
            f"messages[{last}]: the last message is the assistant's with tool_use blocks, whose "
            "tool_result blocks must come in a user message after it (a prefill is text)",
            param=f"messages[{last}]",
        )
    return out, continues


def _chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Chat's function tools from Anthropic's (``name``, ``description``, ``input_schema``).

    Raises:
        ApiError: 400 naming ``tools[i]...`` for a server tool (a ``type`` other than
            ``custom``), an unknown key or a missing ``input_schema``.
    """
    if not tools:  # an empty list offers no tool: none (chat completions refuse an empty list)
        return None
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        kind = tool.get("type", "custom")
        if kind != "custom":
            raise bad_request(
                f"{where} has type {kind!r}: Surge serves only client tools (name, description, "
                "input_schema), not Anthropic's server tools",
                param=f"{where}.type",
            )
        _check_keys(tool, _TOOL_KEYS, where)
        if not isinstance(tool.get("input_schema"), dict):
            raise bad_request(
                f"{where}.input_schema must be a JSON schema object", param=f"{where}.input_schema"
            )
        fn: dict[str, Any] = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        for key in ("description", "strict"):
            if tool.get(key) is not None:
                fn[key] = tool[key]
        out.append({"type": "function", "function": fn})
    return out


def _chat_tool_choice(choice: dict[str, Any]) -> tuple[Any, bool | None]:
    """Chat's ``tool_choice`` and ``parallel_tool_calls`` from Anthropic's ``tool_choice``.

    Raises:
        ApiError: 400 naming ``tool_choice...`` for another shape.
    """
    kind = choice.get("type")
    if not isinstance(kind, str) or kind not in _TOOL_CHOICE_KEYS:
        raise bad_request(
            f"tool_choice.type must be 'auto', 'any', 'tool' or 'none', got {kind!r}",
            param="tool_choice.type",
        )
    _check_keys(choice, _TOOL_CHOICE_KEYS[kind], "tool_choice")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request(
            "tool_choice.disable_parallel_tool_use must be true or false",
            param="tool_choice.disable_parallel_tool_use",
        )
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request("tool_choice.name is required when type is 'tool'", param="tool_choice.name")
        chat: Any = {"type": "function", "function": {"name": name}}
    else:
        chat = _CHAT_TOOL_CHOICE[kind]
    return chat, None if parallel is None else not parallel


def _enable_thinking(thinking: dict[str, Any]) -> bool | None:
    """The chat template's ``enable_thinking`` for Anthropic's ``thinking`` (None: ``adaptive``,
    the template's own default).

    Raises:
        ApiError: 400 naming ``thinking...`` for another shape.
    """
    kind = thinking.get("type")
    keys = {
        "enabled": {"type", "budget_tokens", "display"},
        "disabled": {"type"},
        "adaptive": {"type", "display"},
    }
    if not isinstance(kind, str) or kind not in keys:
        raise bad_request(
            f"thinking.type must be 'enabled', 'disabled' or 'adaptive', got {kind!r}", param="thinking.type"
        )
    for key in thinking:
        if key not in keys[kind]:
            raise bad_request(f"thinking.{key} is not a field of {kind!r} thinking", param=f"thinking.{key}")
    if thinking.get("display") not in (None, "summarized", "omitted"):
        raise bad_request("thinking.display must be 'summarized' or 'omitted'", param="thinking.display")
    budget = integral_number(thinking.get("budget_tokens"))  # 1024.0 is 1024, as every count
    if kind == "enabled" and (type(budget) is not int or budget < 1):
        raise bad_request(
            "thinking.budget_tokens must be a positive integer",
            param="thinking.budget_tokens",
        )
    return None if kind == "adaptive" else kind == "enabled"


def _output_config(config: dict[str, Any]) -> dict[str, Any]:
    """Chat fields of vLLM's ``output_config``: ``format`` (``{"type": "json_schema", "schema":
    ...}``) as ``response_format``, ``effort`` as ``reasoning_effort``.

    Raises:
        ApiError: 400 naming ``output_config...`` for another key or shape.
    """
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key == "effort":
            if value not in ("low", "medium", "high", "xhigh", "max"):
                raise bad_request(
                    f"output_config.effort must be low, medium, high, xhigh or max, got {value!r}",
                    param="output_config.effort",
                )
            out["reasoning_effort"] = value
        elif key == "format":
            if (
                not isinstance(value, dict)
                or value.get("type") != "json_schema"
                or not isinstance(value.get("schema"), dict)
                or set(value) - {"type", "schema"}
            ):
                raise bad_request(
                    'output_config.format must be {"type": "json_schema", "schema": {...}}',
                    param="output_config.format",
                )
            out["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "json_schema", "schema": value["schema"]},
            }
        else:
            raise bad_request(
                f"output_config.{key}: Surge does not know this field", param=f"output_config.{key}"
            )
    return out


def chat_body(body: MessagesBody, *, cap_thinking: bool = False) -> dict[str, Any]:
    """The chat completion body that serves ``body`` (to validate as a
    :class:`~surge.server.protocol.ChatCompletionRequest`). With ``cap_thinking`` (the server
    has a reasoning parser, so it knows where the reasoning ends) ``thinking.budget_tokens``
    becomes vLLM's ``thinking_token_budget``: ``</think>`` is forced once it is spent.

    Raises:
        ApiError: 400 naming the Messages field at fault.
    """
    messages, continues = chat_messages(body)
    chat: dict[str, Any] = {"model": body.model, "messages": messages, "stream": body.stream}
    if continues:
        chat["add_generation_prompt"] = False
        chat["continue_final_message"] = True
    if body.max_tokens is not None:
        chat["max_completion_tokens"] = body.max_tokens
    if body.stop_sequences is not None:
        chat["stop"] = body.stop_sequences
    for name in ("temperature", "top_p", "top_k", "kv_transfer_params", "ec_transfer_params"):
        if getattr(body, name) is not None:
            chat[name] = getattr(body, name)
    tools = _chat_tools(body.tools)
    if tools is not None:
        chat["tools"] = tools
    if body.tool_choice is not None:
        chat["tool_choice"], parallel = _chat_tool_choice(body.tool_choice)
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    kwargs = dict(body.chat_template_kwargs or {})
    if body.thinking is not None:
        enable = _enable_thinking(body.thinking)
        if enable is not None:
            kwargs.setdefault("enable_thinking", enable)
        if cap_thinking and enable:  # the reasoning's delimiters are known: its budget is a cap
            chat["thinking_token_budget"] = body.thinking["budget_tokens"]
    if kwargs or body.chat_template_kwargs is not None:
        chat["chat_template_kwargs"] = kwargs
    if body.output_config is not None:
        chat.update(_output_config(body.output_config))
    return chat
