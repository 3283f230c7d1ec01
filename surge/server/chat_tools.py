"""What a chat completion does with ``tools``, ``tool_choice``, the reasoning parser and a
grammar: the tools the template renders, the grammar sent to the engine, and the per-choice
output parser that turns the generated text into ``content``, the reasoning and ``tool_calls``
(streamed as deltas or whole). The reasoning goes out under two names with the same value:
``reasoning`` (vLLM's name since it renamed the field, and the only one vLLM sends now) and
``reasoning_content`` (the older name, which DeepSeek's API and many clients read).

- ``tool_choice: "none"``: tools are rendered (unless ``--exclude-tools-when-tool-choice-none``:
  ``ServerState.template_tools``), the output is content.
- ``"auto"`` (the default with tools): the server's ``--tool-call-parser`` finds the calls the
  model writes (a 400 without one).
- ``"required"`` / a named function: a grammar from the tools' parameter schemas forces the
  calls (a JSON array of ``{"name", "parameters"}``, or the named function's arguments), so
  the arguments always validate; no parser flag is needed. ``parallel_tool_calls: false``
  limits ``required`` to one call.
- ``--reasoning-parser``: as vLLM 0.26's parsers, the output starts inside the reasoning
  (unless ``chat_template_kwargs.enable_thinking`` is false: then all of it is content): up to
  the first ``</think>`` (a leading ``<think>`` dropped, qwen3: every one; qwen3: or a
  ``<tool_call>``) it is the reasoning, after it the answer; an output that never writes ``</think>`` is all reasoning
  (``content: null``, no calls). A rendered prompt that closed the reasoning (its last
  ``</think>`` after its last ``<think>``) starts the output in the answer instead, as vLLM reads
  the prompt. A grammar applies after the ``</think>`` token (from the first token after such a
  prompt, or with ``include_reasoning: false``: then the output is the answer), and the parser
  agrees with it: the constrained answer after ``</think>`` is the content or the forced calls.

Streamed, each choice opens with a chunk of its own that carries only the role
(``{"role": "assistant", "content": ""}``, as vLLM). Through a parser, a chunk whose delta would
carry nothing (the parser holds or took the text) is not sent (:func:`is_empty_delta`); the
finishing one and any chunk carrying logprobs entries always are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from surge.core.thinking_budget import reasoning_ended, reasoning_tokens_of
from surge.sampling_params import StructuredOutputsParams
from surge.server.errors import bad_request
from surge.server.parsers import REASONING_PARSERS, TOOL_PARSERS, ChatOutputParser, DeltaMessage
from surge.server.parsers.base import ToolCallDelta, ToolParser
from surge.server.parsers.forced import (
    NamedToolParser,
    RequiredToolParser,
    parameters_schema,
    required_schema,
)
from surge.server.parsers.reasoning import THINK_END, THINK_START, ReasoningParser
from surge.server.structured_request import grammar_param, structured_outputs_of, validate
from surge.tokenizer import content_text


@dataclass
class ChatPlan:
    """How one chat request renders and parses.

    Attributes:
        tools: the function definitions for the chat template, or None.
        structured_outputs: the grammar for the engine (the request's, or the one
            ``tool_choice`` forces), or None.
        reasoning_parser: the reasoning parser's class, or None (no reasoning fields).
        tool_parser: builds one choice's tool parser, or None (the answer is all content).
        starts_in_reasoning: the output starts inside the reasoning (with a reasoning parser,
            unless :meth:`see_prompt` found the prompt closed it); False under a grammar from the
            first token; None without a reasoning parser.
        single_call: ``parallel_tool_calls: false``: only the first call is returned (the
            ``required`` grammar allows one; under ``auto`` later calls are dropped, as vLLM).
        reasoning_gated: the grammar waits for ``</think>`` (the reasoning parser's ``gated``).
        reasoning_field: the server has a reasoning parser, so a non-streamed message carries
            ``reasoning`` and ``reasoning_content`` (null) even when the request turned the parser off
            (``chat_template_kwargs.enable_thinking: false``): one message shape per server.
        include_reasoning: vLLM's ``include_reasoning``; False: the reasoning is parsed out of
            the answer as usual but not returned (the fields are null; no streamed delta
            carries it, and a chunk left with nothing else is not sent), and a grammar
            applies from the first token (no reasoning first), as in vLLM.
        continues_reasoning: the request continues (``continue_final_message``) a message
            that opened ``<think>`` without closing it: the prompt ends inside the reasoning,
            so the output starts there (:meth:`see_prompt`), as vLLM's ``is_reasoning_end``
            reads the prompt.
        forced: ``tool_choice`` is ``"required"`` or a named function: a non-streamed chat
            message's ``content`` is then a string, ``""`` when there is no answer text (next to
            the calls, after a reasoning, or with no call at all), as vLLM 0.26's chat
            completion answers a forced tool choice (``content or ""``).
        grammar_param: the request field that carried ``structured_outputs`` (e.g.
            ``structured_outputs.grammar``; ``tools`` for a forced tool call), named by an error
            the engine reports about the grammar later.
        keeps_special_tokens: the ``"auto"`` tool parser reads tags that some models mark as
            special tokens (hermes' ``<tool_call>``): the answer is decoded with special tokens
            unless the request sets ``skip_special_tokens`` itself
            (:meth:`skip_special_tokens`).
    """

    tools: list[dict[str, Any]] | None
    structured_outputs: StructuredOutputsParams | None
    reasoning_parser: type[ReasoningParser] | None = None
    tool_parser: Callable[[], ToolParser] | None = None
    starts_in_reasoning: bool | None = None
    single_call: bool = False
    reasoning_gated: bool = False
    reasoning_field: bool = False
    include_reasoning: bool = True
    continues_reasoning: bool = False
    grammar_param: str | None = None
    forced: bool = False
    keeps_special_tokens: bool = False

    def skip_special_tokens(self, body: Any) -> bool:
        """The ``skip_special_tokens`` a chat request decodes with: the request's own value when
        it sent one, else False under a parser that reads special tokens
        (:attr:`keeps_special_tokens`, as vLLM's hermes parser sets it for a request with tools),
        else True (the field's default)."""
        if self.keeps_special_tokens and "skip_special_tokens" not in body.model_fields_set:
            return False
        return bool(body.skip_special_tokens)

    @property
    def reasoning(self) -> bool:
        """Whether the reasoning (``reasoning``, ``reasoning_content``) is reported."""
        return self.reasoning_parser is not None

    def see_prompt(self, tokenizer: Any, prompt_ids: list[int]) -> None:
        """Read the rendered prompt as vLLM 0.26 does (``is_reasoning_end`` on the prompt): one
        that has closed the reasoning (its last ``</think>`` comes after its last ``<think>``, as a
        template that turns thinking off writes it) makes the output start in the answer, and a
        grammar then applies from the first token, as vLLM's chat decides it; otherwise the output
        starts inside the reasoning (:func:`plan_chat`). A continued final message that opened
        ``<think>`` (:attr:`continues_reasoning`) continues the reasoning. Nothing changes
        without a reasoning parser or under a grammar from the first token (all answer)."""
        if self.reasoning_parser is None or self.starts_in_reasoning is False or self.continues_reasoning:
            return
        if not prompt_closes_reasoning(tokenizer, prompt_ids):
            return
        self.starts_in_reasoning = False
        if self.reasoning_gated and self.structured_outputs is not None:
            self.structured_outputs = msgspec.structs.replace(
                self.structured_outputs, reasoning_end_token_id=None
            )
            self.reasoning_gated = False

    def new_parser(self) -> ChatOutputParser | None:
        """One choice's output parser; None when the output is plain content."""
        if self.reasoning_parser is None and self.tool_parser is None:
            return None
        reasoning = (
            None
            if self.reasoning_parser is None
            else self.reasoning_parser(self.starts_in_reasoning, gated=self.reasoning_gated)
        )
        return ChatOutputParser(reasoning, None if self.tool_parser is None else self.tool_parser())

    def message(
        self, text: str, finish_reason: str | None, as_streamed: bool = False
    ) -> tuple[dict[str, Any], str | None]:
        """The non-streamed ``message`` of one choice and its finish reason ("tool_calls"
        when the model called tools and stopped, except for a named ``tool_choice``: "stop").

        A forced call (``tool_choice`` ``"required"`` or named) cut short by ``max_tokens`` or a
        stop string keeps its calls, the last with the arguments written so far, and the
        engine's finish reason, as :meth:`delta` streams them. A ``--tool-call-parser`` call
        that does not parse (cut, or invalid JSON) makes the answer its raw text as content,
        as vLLM answers a chat completion, unless ``as_streamed``: then it is the calls the
        stream sends (the Responses API, whose stream has sent them as items). Next to tool
        calls, an answer of whitespace alone is null, as vLLM's non-streamed parse gives it to
        chat completions and to the Responses API (no ``message`` item). Under a forced
        ``tool_choice`` (:attr:`forced`) a chat message's empty answer is ``""`` instead of null,
        as vLLM 0.26 gives it (not ``as_streamed``: the Responses API has no ``message`` item)."""
        parser = self.new_parser()
        if parser is None:
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if self.reasoning_field:
                msg.update(reasoning_fields(None))
            return msg, finish_reason
        d = parser.parse(text, as_streamed)
        calls: dict[int, dict[str, Any]] = {}
        for t in d.tool_calls:
            if self.single_call and t.index > 0:
                continue
            if t.name is not None:
                calls[t.index] = {
                    "id": t.id,
                    "type": "function",
                    "function": {"name": t.name, "arguments": ""},
                }
            calls[t.index]["function"]["arguments"] += t.arguments
        # an empty answer is null next to tool calls and under a reasoning parser (after a
        # finished reasoning, or in one cut short), as vLLM gives it; a tool parser alone that
        # found no call gives the text as it is. Next to tool calls, whitespace alone (Qwen3's
        # "\n\n" between </think> and <tool_call>) is no answer either, as vLLM's non-streamed
        # parse (``Parser.parse``, chat's and the Responses API's) drops it (streamed, both send
        # it as it comes)
        content = d.content
        if calls and content.isspace():
            content = ""
        null = (bool(calls) or self.reasoning or parser.in_reasoning) and (as_streamed or not self.forced)
        msg = {"role": "assistant", "content": content or (None if null else "")}
        if self.reasoning or self.reasoning_field:
            # deepseek_r1's empty reasoning is "" (vLLM's partition), qwen3's null
            reasoning = None
            if self.include_reasoning and parser.reasoning is not None:
                reasoning = parser.reasoning.message_reasoning(d.reasoning)
            msg.update(reasoning_fields(reasoning))
        if calls:
            msg["tool_calls"] = [calls[i] for i in sorted(calls)]
            tools = parser.tools
            if (
                finish_reason == "stop"
                and tools is not None
                and tools.finishes_as_tool_calls
                and tools.calls_complete()
            ):
                finish_reason = "tool_calls"
        return msg, finish_reason

    def delta(
        self, parser: ChatOutputParser | None, text: str, finish_reason: str | None
    ) -> tuple[dict[str, Any], str | None]:
        """One streamed ``delta`` of a choice (from its next ``text``) and its finish reason (the
        role rides on a chunk of its own before the choice's first delta). A delta that carries
        nothing is ``{}`` (not ``{"content": ""}``) while the parser holds text or once the
        choice has tool calls, as vLLM sends it."""
        if parser is None:
            return {"content": text}, finish_reason
        d = parser.feed(text)
        if finish_reason is not None:
            d.extend(parser.finish())
            # a call cut by a stop string is not a finished call (the message says so too),
            # and a named tool_choice's call keeps "stop"
            tools = parser.tools
            if (
                finish_reason == "stop"
                and parser.has_tool_calls
                and tools is not None
                and tools.finishes_as_tool_calls
                and tools.calls_complete()
            ):
                finish_reason = "tool_calls"
        if self.single_call:
            d.tool_calls = [t for t in d.tool_calls if t.index == 0]
        out = _delta_fields(d, parser.in_reasoning)
        if not self.include_reasoning:
            for key in reasoning_fields(None):
                out.pop(key, None)
        if is_empty_delta(out) and (finish_reason is None or parser.has_tool_calls):
            # the parser holds the text (tool-call markup): vLLM's empty DeltaMessage, no
            # content key (sent only with logprobs entries or token ids, or as the final delta of
            # a choice with calls, whose message content is null)
            return {}, finish_reason
        return out, finish_reason


def reasoning_fields(reasoning: str | None) -> dict[str, str | None]:
    """A message's or delta's reasoning under both of its names: ``reasoning`` (vLLM's since
    it renamed ``reasoning_content``; clients written for vLLM read only it) and
    ``reasoning_content`` (DeepSeek's and vLLM's older name, which other clients read)."""
    return {"reasoning": reasoning, "reasoning_content": reasoning}


def prompt_closes_reasoning(tokenizer: Any, prompt_ids: list[int]) -> bool:
    """Whether a rendered chat prompt has closed the reasoning: its last ``</think>`` comes after
    its last ``<think>`` (token ids, as vLLM 0.26's ``is_reasoning_end`` reads the prompt), as
    Qwen3's template writes an empty ``<think>\n\n</think>\n\n`` when thinking is off. A prompt
    with neither has not (the output starts inside the reasoning)."""
    return reasoning_ended(reasoning_tokens_of(tokenizer, THINK_START, THINK_END), prompt_ids)


def opens_reasoning(content: Any) -> bool:
    """Whether a message's content (a string or text parts) opens ``<think>`` without closing
    it after: continued (``continue_final_message``), the output is inside the reasoning.
    False for content the chat template will refuse (its error is reported there)."""
    try:
        text = content_text(content)
    except ValueError:
        return False
    return text.rfind(THINK_START) > text.rfind(THINK_END)


def is_empty_delta(delta: dict[str, Any]) -> bool:
    """Whether a streamed chat ``delta`` carries nothing: no role, no content text, no
    reasoning text and no tool call (``{"content": ""}`` is empty). A parsed stream sends no
    chunk for such a delta unless it ends the choice or carries logprobs entries or token ids
    (``return_token_ids``), as vLLM skips a parser's empty deltas."""
    return not (
        delta.get("role") or delta.get("content") or delta.get("reasoning") or delta.get("tool_calls")
    )


def _delta_fields(d: DeltaMessage, in_reasoning: bool) -> dict[str, Any]:
    """The delta's fields; ``content`` only with text, or alone (``""``) outside the
    reasoning: a choice still inside it (or that never left it) has no answer yet, as its
    message's ``content`` is null."""
    out: dict[str, Any] = {}
    if d.reasoning:
        out.update(reasoning_fields(d.reasoning))
    if d.content or not (d.reasoning or d.tool_calls or in_reasoning):
        out["content"] = d.content
    if d.tool_calls:
        out["tool_calls"] = [t.to_openai() for t in merge_call_pieces(d.tool_calls)]
    return out


def merge_call_pieces(pieces: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """One entry per call in a streamed delta: consecutive pieces of the same ``index`` (a
    call's opening piece and its first argument text, or several pieces a coalesced chunk
    holds) become one, with the call's ``id`` and ``name`` and the joined arguments, as vLLM
    streams them; clients that read ``delta.tool_calls[0]`` would otherwise miss a fragment."""
    merged: list[ToolCallDelta] = []
    for t in pieces:
        last = merged[-1] if merged else None
        if last is not None and last.index == t.index:
            merged[-1] = ToolCallDelta(
                t.index, last.id or t.id, last.name or t.name, last.arguments + t.arguments
            )
        else:
            merged.append(t)
    return merged


_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
"""The fields of an OpenAI function definition (``tools[].function``)."""

_TOOL_KEYS = frozenset({"type", "function"})
"""The fields of an OpenAI function tool (``tools[]``, the SDK's ``ChatCompletionFunctionToolParam``)."""

_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
"""The names OpenAI takes for a function tool (``tools[].function.name``), for ``fullmatch``
(``$`` would let a trailing newline through): ASCII letters, digits, underscores and dashes, 1
to 64 of them; another name is a 400 naming the field, as OpenAI answers (Anthropic's Messages
API has the same pattern)."""

TOOL_NAME_PATTERN = f"^{_TOOL_NAME.pattern}$"
""":data:`_TOOL_NAME` as OpenAI writes it in its error, ``^[a-zA-Z0-9_-]{1,64}$``."""

MAX_TOOL_PARAMETERS_DEPTH = 256
"""Most levels of JSON objects and arrays in one tool's ``parameters``: the chat template
renders them recursively (``tojson``), and Qwen3's ran out of Python's recursion limit at 800
levels ("chat template error: maximum recursion depth exceeded", a 400 that named ``messages``).
A schema compiled to a grammar (``tool_choice`` required or named) is bounded more tightly, at
64 levels of subschemas."""

ROOT_VALUE_KEYWORDS = ("$ref", "anyOf", "oneOf", "allOf", "enum", "const")
"""JSON-schema keywords refused at the root of a tool's ``parameters``: each chooses the values
itself (xgrammar then ignores a ``"type": "object"`` beside it), so the arguments could be a
string, a number or an array. They stay allowed inside the schema's properties."""


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether JSON ``value`` nests objects and arrays more than ``limit`` levels deep (no
    recursion: a walk with a stack)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """A request's OpenAI ``tools`` (chat completions and ``/tokenize``), checked: a list of
    ``{"type": "function", "function": {"name": ..., ...}}``, each with a name of
    :data:`TOOL_NAME_PATTERN` that no other tool has, a string ``description`` and a boolean
    ``strict`` if given, and ``parameters`` that are an object schema (``"type": "object"`` or
    no type, none of :data:`ROOT_VALUE_KEYWORDS` at its root) nested at most
    :data:`MAX_TOOL_PARAMETERS_DEPTH` levels, if given.

    Raises:
        ApiError: a 400 naming ``tools`` for anything else.
    """
    if not isinstance(tools, list):
        raise bad_request("tools must be a list of function definitions", param="tools")
    names = set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(fn, dict)
        ):
            raise bad_request(
                f'tools[{i}] must be {{"type": "function", "function": {{...}}}}', param="tools"
            )
        unknown = sorted(set(tool) - _TOOL_KEYS)
        if unknown:  # would be ignored
            raise bad_request(
                f"tools[{i}] has an unknown field {unknown[0]!r} (known: {', '.join(sorted(_TOOL_KEYS))})",
                param="tools",
            )
        unknown = sorted(set(fn) - _FUNCTION_KEYS)
        if unknown:  # would be ignored
            raise bad_request(
                f"tools[{i}].function has an unknown field {unknown[0]!r} (known: {', '.join(sorted(_FUNCTION_KEYS))})",
                param="tools",
            )
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"tools[{i}].function.name must be a non-empty string", param="tools")
        if not _TOOL_NAME.fullmatch(name):  # OpenAI refuses it; a template or parser may mangle it
            shown = repr(name) if len(name) <= 80 else f"{name[:64]!r}..."  # not a megabyte echoed
            raise bad_request(
                f"tools[{i}].function.name {shown} does not match the pattern '{TOOL_NAME_PATTERN}' "
                "(ASCII letters, digits, underscores and dashes, at most 64)",
                param="tools",
            )
        if name in names:  # calls could not say which definition they meant
            raise bad_request(
                f"tools[{i}].function.name {name!r} is already the name of another tool", param="tools"
            )
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise bad_request(f"tools[{i}].function.description must be a string", param="tools")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise bad_request(f"tools[{i}].function.strict must be true or false", param="tools")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON schema object", param="tools")
        if isinstance(params, dict) and _deeper_than(params, MAX_TOOL_PARAMETERS_DEPTH):
            raise bad_request(
                f"tools[{i}].function.parameters is nested too deeply: more than "
                f"{MAX_TOOL_PARAMETERS_DEPTH} levels of JSON objects and arrays",
                param="tools",
            )
        if isinstance(params, dict) and params.get("type", "object") != "object":
            # arguments are a JSON object (OpenAI refuses other schemas): a string or array schema
            # gave arguments that callers cannot pass as keyword arguments
            raise bad_request(
                f'tools[{i}].function.parameters must have "type": "object", got {params.get("type")!r}',
                param="tools",
            )
        root_choice = next(
            (key for key in ROOT_VALUE_KEYWORDS if isinstance(params, dict) and key in params), None
        )
        if root_choice is not None:
            # the grammar follows such a keyword and ignores a "type" beside it: {"anyOf":
            # [{"type": "integer"}]} gave the arguments 5988288238 (OpenAI refuses it too)
            raise bad_request(
                f"tools[{i}].function.parameters has {root_choice!r} at its root, which lets the "
                "arguments be a value other than a JSON object; use it inside properties",
                param="tools",
            )
        names.add(name)
    return tools


def _named_choice(tool_choice: Any, tools: list[dict[str, Any]]) -> dict[str, Any]:
    fn = tool_choice.get("function") if tool_choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise bad_request(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    unknown = sorted((set(tool_choice) - _TOOL_KEYS) | {f"function.{k}" for k in set(fn) - {"name"}})
    if unknown:  # would be ignored: the SDK's ChatCompletionNamedToolChoiceParam has no more
        raise bad_request(
            f"tool_choice has an unknown field {unknown[0]!r} (a named choice is "
            '{"type": "function", "function": {"name": ...}})',
            param="tool_choice",
        )
    for tool in tools:
        if tool["function"]["name"] == name:
            return tool
    raise bad_request(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")


def plan_chat(
    body: Any, tokenizer: Any, tool_call_parser: str | None, reasoning_parser: str | None
) -> ChatPlan:
    """Check the request's tools, tool choice and structured outputs, and plan the chat.

    Raises:
        ApiError: 400 naming ``tools`` (an empty list included, as OpenAI and vLLM refuse it),
            ``tool_choice`` or the structured-output field.
    """
    if body.tools == []:  # OpenAI and vLLM refuse it: an empty list offers no tool to call
        raise bad_request(
            "tools must not be an empty array: give at least one tool or leave tools out", param="tools"
        )
    tools = None if body.tools is None else check_tools(body.tools)
    tool_choice = body.tool_choice
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    if tool_choice not in ("none", "auto", "required") and not isinstance(tool_choice, dict):
        raise bad_request(
            'tool_choice must be "none", "auto", "required" or a named function', param="tool_choice"
        )
    if tool_choice != "none" and not tools:
        raise bad_request("tool_choice needs tools", param="tool_choice")
    structured, field = structured_outputs_of(body)
    grammar = None if structured is None or field is None else grammar_param(structured, field)
    tool_parser: Callable[[], ToolParser] | None = None
    keeps_special = False
    if tool_choice == "auto":
        if tool_call_parser is None:
            raise bad_request(
                'tool_choice "auto" needs a server started with --tool-call-parser '
                '(use "required", a named function or "none" otherwise)',
                param="tool_choice",
            )
        tool_parser = TOOL_PARSERS[tool_call_parser]
        keeps_special = TOOL_PARSERS[tool_call_parser].keeps_special_tokens
    elif tool_choice == "required" or isinstance(tool_choice, dict):
        assert tools is not None
        if structured is not None:
            raise bad_request(
                "tool_choice required or a named function cannot be combined with another structured output",
                param="tool_choice",
            )
        if tool_choice == "required":
            try:
                schema = required_schema(
                    tools, parallel=getattr(body, "parallel_tool_calls", None) is not False
                )
            except RecursionError:  # walking the parameter schemas for local $refs
                raise bad_request("a tool's parameters schema is nested too deeply", param="tools") from None
            tool_parser = RequiredToolParser
        else:
            fn = _named_choice(tool_choice, tools)["function"]
            schema = parameters_schema(fn)
            name = fn["name"]
            tool_parser = lambda: NamedToolParser(name)  # noqa: E731
        structured = StructuredOutputsParams(json=json.dumps(schema))
        validate(structured, "tools")
        grammar = "tools"
    kwargs = body.template_kwargs or {}
    reasoning_cls = None
    if reasoning_parser is not None and kwargs.get("enable_thinking") is not False:
        reasoning_cls = REASONING_PARSERS[reasoning_parser]
    # vLLM 0.26's qwen3 (and deepseek_r1) parser starts inside the reasoning whenever thinking is
    # on: "X</think>Y" is reasoning X and answer Y, <think> or not; see_prompt turns it off for a
    # prompt that closed the reasoning
    starts_in_reasoning = None if reasoning_cls is None else True
    gated = False
    if structured is not None and reasoning_cls is not None:
        # the parser reads the output as the grammar does: free reasoning up to the first
        # </think> token, the constrained answer after it; or constrained from the start, also
        # when the request does not want the reasoning (include_reasoning: false), as vLLM's
        # ChatCompletionRequest.resolve_reasoning_ended decides
        end_id = _single_token_id(tokenizer, THINK_END) if body.include_reasoning else None
        if end_id is not None:
            structured = msgspec.structs.replace(structured, reasoning_end_token_id=end_id)
            gated = True
        else:
            starts_in_reasoning = False
    single = tools is not None and getattr(body, "parallel_tool_calls", None) is False
    return ChatPlan(
        tools,
        structured,
        reasoning_cls,
        tool_parser,
        starts_in_reasoning,
        single,
        gated,
        reasoning_field=reasoning_parser is not None,
        include_reasoning=body.include_reasoning,
        continues_reasoning=body.continue_final_message and opens_reasoning(body.messages[-1].content),
        grammar_param=grammar,
        forced=tool_choice == "required" or isinstance(tool_choice, dict),
        keeps_special_tokens=keeps_special,
    )


def _single_token_id(tokenizer: Any, text: str) -> int | None:
    """The id of the vocabulary entry ``text`` (e.g. Qwen3's ``</think>``), or None."""
    token_id = tokenizer.convert_tokens_to_ids(text)
    if not isinstance(token_id, int) or token_id == tokenizer.unk_token_id:
        return None
    return token_id
