"""Llama 3.x JSON tool calls: the whole answer is ``{"name": ..., "parameters": {...}}``
objects (separated by ``;``, optionally after ``<|python_tag|>``); any other answer is content."""

from __future__ import annotations

import json

from surge.server.parsers.base import (
    BufferedParser,
    DeltaMessage,
    JsonCallSequence,
    ToolParser,
    skip_space,
)

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(BufferedParser[DeltaMessage], ToolParser):
    """``--tool-call-parser llama3_json``.

    The first non-space character decides: ``{`` (after an optional ``<|python_tag|>``)
    starts tool calls, anything else makes the whole answer content. Calls stream through
    :class:`JsonCallSequence`; if the answer turns out not to be calls (no name found), it is
    released as content at the end. Calls whose text is not a ``;``-separated sequence of JSON
    objects naming a function (cut by ``max_tokens``, invalid JSON) make the text malformed
    (:meth:`malformed_text`): a non-streamed answer is then the whole text as content, as
    vLLM's ``Llama3JsonToolParser.extract_tool_calls`` answers. An object needs a ``parameters``
    (or ``arguments``) key to be a call, as vLLM's parser requires (its ``KeyError`` makes the
    answer content): a JSON answer such as ``{"name": "Bob", "age": 3}`` is content, streamed
    or not (the call's name waits for that key).
    """

    call_needs_arguments = True

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._buf = ""
        self._mode = "undecided"
        self._seq = JsonCallSequence(self, ";")
        self._start = 0
        self._lead = 0  # white space at the start of _buf already read, while undecided
        self._after_tag = 0  # and after a leading <|python_tag|>

    def malformed_text(self) -> str | None:
        if self._mode != "calls" or not self.has_tool_calls or _well_formed(self._buf[self._start :]):
            return None
        return self._buf

    def _process(self, final: bool) -> DeltaMessage:
        out = DeltaMessage()
        if self._mode == "undecided":
            buf = self._buf
            self._lead = skip_space(buf, self._lead)
            if buf.startswith(PYTHON_TAG, self._lead):
                self._after_tag = skip_space(buf, max(self._after_tag, self._lead + len(PYTHON_TAG)))
                head = buf[self._after_tag :]
            else:
                head = buf[self._lead :]
            if not head or (PYTHON_TAG.startswith(head) and not final):
                if final:
                    out.content += self._buf
                    self._buf = ""
                return out
            if head[0] == "{":
                self._mode = "calls"
                self._start = len(self._buf) - len(head)
            else:
                self._mode = "content"
        if self._mode == "content":
            out.content, self._buf = self._buf, ""
            return out
        out.tool_calls += self._seq.update(self._buf, final, self._start)
        if final and not self.has_tool_calls:
            out.content += self._buf
        return out


def _well_formed(text: str) -> bool:
    """Whether ``text`` is one or more JSON objects with a string ``name`` and an ``arguments`` or
    ``parameters`` key, with only whitespace and ``;`` around them: what :class:`JsonCallSequence`
    streams as calls, so that a streamed and a non-streamed answer agree (a trailing ``;`` was a
    call streamed and content otherwise)."""
    decoder = json.JSONDecoder()
    i, n, calls = 0, len(text), 0
    while True:
        while i < n and (text[i].isspace() or text[i] == ";"):
            i += 1
        if i == n:
            return calls > 0
        try:
            obj, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):
            return False
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return False
        if "arguments" not in obj and "parameters" not in obj:
            return False
        calls += 1
