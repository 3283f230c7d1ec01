"""Hermes-style tool calls (Qwen2.5, Qwen3, Hermes): ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`` blocks inside the answer; the text outside them is content."""

from __future__ import annotations

import json
import re

from surge.server.parsers.base import (
    BufferedParser,
    DeltaMessage,
    JsonToolCall,
    ToolParser,
    json_string_end,
    partial_suffix,
)

START = "<tool_call>"
END = "</tool_call>"

_OUTSIDE = re.compile(r'["<]')
"""What the block scan stops at outside a JSON string: a string's start, a possible ``END``."""


class HermesToolParser(BufferedParser[DeltaMessage], ToolParser):
    """``--tool-call-parser hermes``.

    Content before the first call is released as it comes (a possible start of ``<tool_call>``
    is held back); after a call, text between or after blocks is dropped, streamed as not, as
    vLLM 0.26's parser answers only the text before the first ``<tool_call>``. Inside a
    block the call streams through :class:`JsonToolCall`; the block ends at the first
    ``</tool_call>`` outside a JSON string (an argument may hold the tag itself:
    ``{"text": "a </tool_call> b"}``; :meth:`_block_end`). A call needs an ``arguments`` key, as
    vLLM's parser reads it (``{"name": "f"}`` or ``"parameters"`` is no call: the name waits for
    the key, so a stream never opens one). A block whose text is not a JSON object naming a
    function with arguments (cut by ``max_tokens``, invalid JSON) makes the text malformed
    (:meth:`malformed_text`), so a non-streamed answer is then the whole text as content, as
    vLLM's ``Hermes2ProToolParser.extract_tool_calls`` answers.

    Some models mark ``<tool_call>`` and ``</tool_call>`` as special tokens, which
    ``skip_special_tokens`` would drop before the parser sees them: as vLLM's parser
    (``adjust_request``), a request it parses decodes special tokens (:attr:`keeps_special_tokens`).
    """

    keeps_special_tokens = True
    call_needs_arguments = True
    call_argument_keys = ("arguments",)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._buf = ""
        self._call: JsonToolCall | None = None
        self._pieces: list[str] = []  # joined only by malformed_text (``+=`` on an attribute copies)
        self._malformed = False
        self._scan = 0  # how far the open block's text has been scanned for its END
        self._in_string = False  # whether the scan stopped inside a JSON string

    def feed(self, text: str) -> DeltaMessage:
        self._pieces.append(text)
        return super().feed(text)

    def malformed_text(self) -> str | None:
        return "".join(self._pieces) if self._malformed else None

    def _content(self, text: str, out: DeltaMessage) -> None:
        """Release answer text, unless a call came before it (then it is dropped)."""
        if not self.has_tool_calls:
            out.content += text

    def _process(self, final: bool) -> DeltaMessage:
        out = DeltaMessage()
        while True:
            buf = self._buf
            if self._call is None:
                i = buf.find(START)
                if i < 0:
                    keep = 0 if final else partial_suffix(buf, START)
                    self._content(buf[: len(buf) - keep], out)
                    self._buf = buf[len(buf) - keep :]
                    return out
                self._content(buf[:i], out)
                self._buf = buf[i + len(START) :]
                self._call = self._new_call()
                self._scan, self._in_string = 0, False
                continue
            j = self._block_end(buf)
            if j < 0:
                keep = 0 if final else partial_suffix(buf, END)
                out.tool_calls += self._call.update(buf, final, 0, len(buf) - keep)
                if final:
                    self._check(buf)
                    if not self._call.started:  # an unfinished block that never named a function
                        self._content(START + buf, out)
                return out
            self._check(buf[:j])
            out.tool_calls += self._call.update(buf, True, 0, j)
            if not self._call.started:
                self.calls.remove(self._call)
                self._content(START + buf[: j + len(END)], out)
            self._call = None
            self._buf = buf[j + len(END) :]

    def _block_end(self, buf: str) -> int:
        """Where the open block's ``END`` starts in ``buf`` (the block's text so far), or -1: the
        first ``END`` outside a JSON string, as the JSON's quotes and backslash escapes delimit
        its strings. The scan resumes where it stopped (a block's text only grows until its
        end); a possible start of ``END``, or an escape, at the end of ``buf`` is scanned again
        with the next text. In invalid JSON a string left open hides the tags after it: the
        block then runs to the end of the text, which is malformed, so a non-streamed answer is
        all content, as when the tag ended the block."""
        i, in_string, n = self._scan, self._in_string, len(buf)
        while i < n:
            if in_string:
                i, closed = json_string_end(buf, i, n)
                if not closed:
                    break
                in_string = False
                continue
            m = _OUTSIDE.search(buf, i)
            if m is None:
                i = n
            elif m.group() == '"':
                in_string, i = True, m.end()
            elif buf.startswith(END, m.start()):
                self._scan, self._in_string = m.start(), False
                return m.start()
            elif END.startswith(buf[m.start() :]):  # may still become END
                i = m.start()
                break
            else:
                i = m.end()
        self._scan, self._in_string = i, in_string
        return -1

    def _check(self, block: str) -> None:
        """Mark the text malformed unless ``block`` (a whole block's text) is a JSON object
        with a string ``name`` and an ``arguments`` key (vLLM's parser reads
        ``call["arguments"]``: ``{"name": "f"}`` or ``"parameters"`` makes its answer content)."""
        try:
            call = json.loads(block)
        except (ValueError, RecursionError):
            call = None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or "arguments" not in call:
            self._malformed = True
