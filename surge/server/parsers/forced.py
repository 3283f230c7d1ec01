"""Tool calls forced by ``tool_choice``: ``required`` makes the model write a JSON array of
``{"name": ..., "parameters": {...}}`` objects, a named function makes it write that
function's arguments object (both enforced by a grammar built from the tools' schemas)."""

from __future__ import annotations

from typing import Any

from surge.server.parsers.base import DeltaMessage, JsonCallSequence, ToolCallDelta, ToolParser


def required_schema(tools: list[dict[str, Any]], parallel: bool = True) -> dict[str, Any]:
    """The JSON schema of ``tool_choice: "required"``: an array of one or more calls (exactly
    one unless ``parallel``), each ``{"name": <a tool's name>, "parameters": <that tool's
    parameter schema>}``."""
    variants = []
    for tool in tools:
        fn = tool["function"]
        variants.append(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [fn["name"]]},
                    "parameters": fn.get("parameters") or {"type": "object"},
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


class RequiredToolParser(ToolParser):
    """Parses the JSON array of ``tool_choice: "required"`` into streamed tool calls."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._buf = ""
        self._seq = JsonCallSequence(self, "[,]")

    def feed(self, text: str) -> DeltaMessage:
        self._buf += text
        return DeltaMessage(tool_calls=self._seq.update(self._buf, final=False))

    def finish(self) -> DeltaMessage:
        return DeltaMessage(tool_calls=self._seq.update(self._buf, final=True))


class NamedToolParser(ToolParser):
    """The answer is the named function's arguments: one call, its text streamed as is."""

    def __init__(self, name: str, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._name = name
        self._args = ""

    @property
    def has_tool_calls(self) -> bool:
        return True

    def feed(self, text: str) -> DeltaMessage:
        out = DeltaMessage()
        if not self.calls:
            call = self._new_call()
            call.name = self._name
            out.tool_calls.append(ToolCallDelta(call.index, call.id, self._name, ""))
        if text:
            out.tool_calls.append(ToolCallDelta(0, arguments=text))
            self._args += text
        return out

    def finish(self) -> DeltaMessage:
        return self.feed("")
