"""Tool calls forced by ``tool_choice``: ``required`` makes the model write a JSON array of
``{"name": ..., "parameters": {...}}`` objects, a named function makes it write that
function's arguments object (both enforced by a grammar built from the tools' schemas).

A complete ``required`` answer finishes with "tool_calls"; a named call keeps the engine's
"stop", as OpenAI and vLLM answer a forced named function.

``max_tokens`` or a stop string may still cut that JSON short. The calls written so far then
stay the answer's calls, the last with the arguments written so far (JSON that does not parse),
non-streamed as streamed: a stream has sent their pieces and cannot take them back, and a client
must read the same calls either way. The finish reason is the engine's ("length" or "stop"),
never "tool_calls", which says the calls are complete. A named call reads so in vLLM too; vLLM's
``required`` answer differs between its two paths (streamed: the cut calls and "tool_calls";
not streamed: no calls, content ``""``), and Surge gives both its stream's calls with the
engine's reason. Text cut before a call's name is complete opens no call and is not content
(the stream has not sent it either). The Responses API marks such a call ``incomplete``."""

from __future__ import annotations

import json
from typing import Any

from surge.server.parsers.base import (
    BufferedParser,
    DeltaMessage,
    JsonCallSequence,
    ToolCallDelta,
    ToolParser,
)

NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
"""The arguments of a function without ``parameters``: none (OpenAI: "omitting parameters defines a
function with an empty parameter list"); a bare ``{"type": "object"}`` would take any keys."""


def parameters_schema(function: dict[str, Any]) -> dict[str, Any]:
    """The schema a forced call's arguments are generated under: the function's ``parameters``,
    :data:`NO_PARAMETERS` when it has none (or ``{}``), and ``"type": "object"`` added to one
    that says nothing of its values' type (``{"description": ...}``, ``{"properties": {...}}``):
    arguments are a JSON object, as the tools' check takes such a schema to be
    (``surge.server.chat_tools``), where the schema alone let the grammar write any JSON value
    (a string, a number). The check refuses the root keywords that would choose other values
    (``ROOT_VALUE_KEYWORDS``), so the ``type`` added here holds."""
    params = function.get("parameters") or NO_PARAMETERS
    return {"type": "object", **params}


def required_schema(tools: list[dict[str, Any]], parallel: bool = True) -> dict[str, Any]:
    """The JSON schema of ``tool_choice: "required"``: an array of one or more calls (exactly
    one unless ``parallel``), each ``{"name": <a tool's name>, "parameters": <that tool's
    parameter schema>}``.

    A parameter schema with local ``$ref``s (``#/$defs/...`` or ``#``, as Pydantic writes nested
    or recursive models) is moved to this schema's ``$defs`` as ``tool_<i>``, its references
    re-rooted there (``#/$defs/X`` -> ``#/$defs/tool_<i>/$defs/X``): inside the array they would
    otherwise resolve against the array's root."""
    variants = []
    defs: dict[str, Any] = {}
    for i, tool in enumerate(tools):
        fn = tool["function"]
        params = parameters_schema(fn)
        if _has_local_ref(params):
            defs[f"tool_{i}"] = _reroot(params, f"#/$defs/tool_{i}")
            params = {"$ref": f"#/$defs/tool_{i}"}
        variants.append(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [fn["name"]]},
                    "parameters": params,
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


_DATA_KEYWORDS = frozenset(("const", "enum", "default", "examples"))
"""Schema keywords whose values are instances, not schemas (a ``$ref`` key there is data)."""
_NAMED_SUBSCHEMAS = frozenset(("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"))
"""Schema keywords whose values map names to subschemas: there a key is a name, never a keyword
(a property called ``default`` or ``enum`` is a schema like any other)."""


def _has_local_ref(node: Any, names: bool = False) -> bool:
    """Whether a schema holds a ``$ref`` to ``#`` or ``#/...`` (outside instance values);
    ``names``: ``node`` maps names to subschemas."""
    if isinstance(node, dict):
        if names:
            return any(_has_local_ref(v) for v in node.values())
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            return True
        return any(
            _has_local_ref(v, k in _NAMED_SUBSCHEMAS) for k, v in node.items() if k not in _DATA_KEYWORDS
        )
    if isinstance(node, list):
        return any(_has_local_ref(v) for v in node)
    return False


def _reroot(node: Any, root: str, names: bool = False) -> Any:
    """A copy of a schema whose local ``$ref``s point below ``root`` (a JSON pointer);
    ``names``: ``node`` maps names to subschemas."""
    if isinstance(node, dict):
        if names:
            return {k: _reroot(v, root) for k, v in node.items()}
        out = {}
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str) and v.startswith("#"):
                out[k] = root + v[1:]
            elif k in _DATA_KEYWORDS:
                out[k] = v
            else:
                out[k] = _reroot(v, root, k in _NAMED_SUBSCHEMAS)
        return out
    if isinstance(node, list):
        return [_reroot(v, root) for v in node]
    return node


class RequiredToolParser(BufferedParser[DeltaMessage], ToolParser):
    """Parses the JSON array of ``tool_choice: "required"`` into streamed tool calls."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._buf = ""
        self._seq = JsonCallSequence(self, "[,]")

    def _process(self, final: bool) -> DeltaMessage:
        return DeltaMessage(tool_calls=self._seq.update(self._buf, final=final))

    def malformed_text(self) -> str | None:
        """None: an array that ``max_tokens`` or a stop string cut (the grammar allows nothing
        else that does not parse) stays its calls, the last with the arguments written so far,
        as the stream sent them; the finish reason says it was cut (:meth:`calls_complete`)."""
        return None

    def calls_complete(self) -> bool:
        """Whether the whole array parses (a cut one keeps the engine's finish reason)."""
        return _unless_json(self._buf) is None


class NamedToolParser(ToolParser):
    """The answer is the named function's arguments: one call, its text streamed as is. The
    call opens with the answer's first text that is not whitespace (leading whitespace is held
    and becomes the arguments' first fragment); an answer of whitespace alone is content, and
    a choice whose answer never started (its reasoning never ended) has no call. A complete
    call finishes with "stop", not "tool_calls" (OpenAI and vLLM for a named function)."""

    finishes_as_tool_calls = False

    def __init__(self, name: str, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._name = name
        self._args: list[str] = []  # the answer's pieces (joined when it ends)

    @property
    def has_tool_calls(self) -> bool:
        return bool(self.calls)

    def feed(self, text: str) -> DeltaMessage:
        out = DeltaMessage()
        self._args.append(text)
        if not self.calls:
            if not text.strip():  # nothing but whitespace yet: no call, no arguments
                return out
            call = self._new_call()
            call.name = self._name
            out.tool_calls.append(ToolCallDelta(call.index, call.id, self._name, ""))
            text = "".join(self._args)  # the held whitespace leads the first fragment
        if text:
            out.tool_calls.append(ToolCallDelta(0, arguments=text))
        return out

    def finish(self) -> DeltaMessage:
        """An answer of whitespace alone (no call opened) is released as content."""
        return DeltaMessage(content="".join(self._args)) if not self.calls else DeltaMessage()

    def malformed_text(self) -> str | None:
        """None: arguments that do not parse because ``max_tokens`` or a stop string cut them
        stay the named call's, as the stream sent them and as vLLM answers (the finish reason
        says why); an answer of whitespace alone is already content (:meth:`finish`)."""
        return None

    def calls_complete(self) -> bool:
        """Whether the arguments parse (cut ones stay the call)."""
        try:
            json.loads("".join(self._args))
        except (ValueError, RecursionError):
            return False
        return True


def _unless_json(text: str) -> str | None:
    """``text`` unless it is empty or one whole JSON value."""
    if not text.strip():
        return None
    try:
        json.loads(text)
    except (ValueError, RecursionError):  # nested past the parser's depth: as JSON cut short
        return text
    return None
