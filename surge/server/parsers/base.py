"""What every output parser shares: the delta types, the ``feed`` / ``finish`` of a parser that
rereads its whole text (:class:`BufferedParser`) and the streaming JSON tool-call scanner.

Parsers are streaming and per choice: ``feed(text)`` takes the next piece of generated text
and returns what can be sent now; ``finish()`` returns the rest. The non-streamed result is
the same code fed the whole text at once, so the joined deltas of a stream equal it, except
where a tool parser finds its text malformed (:meth:`ToolParser.malformed_text`: a call whose
JSON does not parse, e.g. cut by ``max_tokens``): the non-streamed result is then the whole
text as content and no tool calls, as in vLLM, while a stream cannot take back the deltas it
already sent. A forced ``tool_choice`` (``required`` or named) keeps its cut calls, streamed or
not, so both read the same (:mod:`surge.server.parsers.forced`).
"""

from __future__ import annotations

import abc
import functools
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

_DECODER = json.JSONDecoder(strict=False)
"""Finds where a call's JSON ends. ``strict=False`` reads a raw control character (a tab, a line
break) inside a string as the string's: a model's unconstrained text may hold them (and
xgrammar's own grammar for a string with ``maxLength`` let them in, which Surge's grammar no longer
does: docs/structured-outputs.md), and a strict decoder failed there, so the call's end was never
found and the closing ``}]`` of a ``required`` array became arguments text. Whether the
arguments then parse is judged elsewhere, strictly (``calls_complete``, ``malformed_text``)."""
_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
ARGUMENT_KEYS = ("arguments", "parameters")
"""The keys a call object's arguments may come under, first found first."""
_TRAILING = " \t\r\n}"


@functools.cache
def _args_key(keys: tuple[str, ...]) -> re.Pattern[str]:
    """Matches ``, "KEY": `` for one of ``keys``, right after a call's name."""
    return re.compile(r'\s*,\s*"(?:' + "|".join(map(re.escape, keys)) + r')"\s*:\s*')


def new_tool_call_id() -> str:
    """A fresh OpenAI-style tool call id."""
    return f"chatcmpl-tool-{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of one tool call: the first piece of a call has its ``id`` and ``name`` (and
    empty ``arguments``); later pieces carry argument text that concatenates to a JSON value.
    A streamed chunk merges a call's consecutive pieces into one entry
    (:func:`surge.server.chat_tools.merge_call_pieces`).

    Attributes:
        index: the call's position among the choice's tool calls.
        id: the call id (first piece only).
        name: the function name (first piece only).
        arguments: the next fragment of the arguments' JSON text.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, object]:
        """The streamed ``delta.tool_calls[i]`` object."""
        out: dict[str, object] = {"index": self.index}
        function: dict[str, str] = {"arguments": self.arguments}
        if self.id is not None:
            out["id"] = self.id
            out["type"] = "function"
        if self.name is not None:
            function["name"] = self.name
        out["function"] = function
        return out


@dataclass(slots=True)
class DeltaMessage:
    """What a parser releases for one piece of text: answer text, reasoning text, tool calls."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def extend(self, other: DeltaMessage) -> DeltaMessage:
        """Append ``other`` to this delta (in place) and return it."""
        self.content += other.content
        self.reasoning += other.reasoning
        self.tool_calls.extend(other.tool_calls)
        return self


Released = TypeVar("Released")


class BufferedParser(abc.ABC, Generic[Released]):
    """The ``feed`` / ``finish`` of a streaming parser that reads the whole text fed so far,
    ``_buf`` (set to ``""`` by the parser's ``__init__``), at each piece: both hand it to
    :meth:`_process`, which returns what can be released (a tool parser's
    :class:`DeltaMessage`, a reasoning parser's ``(reasoning, answer)``). A tool parser lists
    this class before :class:`ToolParser` among its bases, whose abstract ``feed`` and
    ``finish`` these then are."""

    _buf: str

    def feed(self, text: str) -> Released:
        """Take the next piece of text; return what can be released."""
        # grown as a local that holds the only reference, which CPython extends in place
        # (``self._buf += text`` copies the whole buffer at every piece)
        buf, self._buf = self._buf, ""
        buf += text
        self._buf = buf
        return self._process(final=False)

    def finish(self) -> Released:
        """No more text: release the rest."""
        return self._process(final=True)

    @abc.abstractmethod
    def _process(self, final: bool) -> Released:
        """What ``_buf`` releases now that was not released before (``final``: no more text
        will come, so nothing is held back)."""


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag`` (text that
    may still become ``tag`` and must be held back)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


_NON_SPACE = re.compile(r"\S")


def skip_space(text: str, i: int) -> int:
    """The offset of the first character of ``text`` at or after ``i`` that is not white space
    (as ``str.isspace`` and ``str.lstrip`` read it), ``len(text)`` when there is none. A parser
    deciding on an output's first non-space character keeps this offset between pieces, so an
    output of white space alone is read once, not stripped whole at every piece (quadratic:
    128,000 characters of it took 0.7 s)."""
    m = _NON_SPACE.search(text, i)
    return len(text) if m is None else m.start()


_STRING_STOP = re.compile(r'["\\]')
_VALUE_STOP = re.compile(r'["{}\[\]]')


def json_string_end(text: str, i: int, end: int) -> tuple[int, bool]:
    """Read the inside of a JSON string in ``text[i:end]`` (``i``: past its opening quote, or where
    an earlier read stopped), following its backslash escapes; each character is read once.

    Returns:
        ``(offset, closed)``: closed, the offset just past the string's closing quote; else
        where to read on once the text grows: ``end``, or the offset of a backslash at the
        text's end whose escaped character is still to come.
    """
    while True:
        m = _STRING_STOP.search(text, i, end)
        if m is None:
            return end, False
        if m.group() == '"':
            return m.end(), True
        if m.end() >= end:  # a backslash whose escaped character is still to come
            return m.start(), False
        i = m.end() + 1  # a backslash: skip the character it escapes


class JsonExtent:
    """Where one JSON object or array in a growing text ends, found by reading each character
    once however the text grows (a call's text arrives a token at a time; parsing it whole at
    every token, as ``json.JSONDecoder.raw_decode`` does, made a 32,000-character call cost
    0.3-0.5 s of the API process's CPU, quadratic in its length).

    Brackets are counted outside strings, whose quotes and backslash escapes are followed; the
    value ends where the count first returns to zero. Valid JSON ends exactly there; invalid
    JSON cannot be made valid by any later text, so one parse at that point decides.

    Args:
        start: the offset of the value's opening ``{`` or ``[`` in the text.
    """

    def __init__(self, start: int) -> None:
        self._i = start
        self._depth = 0
        self._in_string = False
        self.end: int | None = None

    def scan(self, text: str, end: int | None = None) -> int | None:
        """Read what ``text[:end]`` (the same text as before, grown) added; return the offset
        just past the value's closing bracket once it has come, else None."""
        if self.end is not None:
            return self.end
        i, depth, in_string = self._i, self._depth, self._in_string
        n = len(text) if end is None else end
        while i < n:
            if in_string:
                i, closed = json_string_end(text, i, n)
                if not closed:
                    break
                in_string = False
                continue
            m = _VALUE_STOP.search(text, i, n)
            if m is None:
                i = n
                continue
            c, i = m.group(), m.end()
            if c == '"':
                in_string = True
            elif c in "{[":
                depth += 1
            else:
                depth -= 1
                if depth <= 0:
                    self.end = i
                    break
        self._i, self._depth, self._in_string = i, depth, in_string
        return self.end


def _is_object(text: str) -> bool:
    """Whether ``text`` (whitespace around it aside) is a whole JSON object."""
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


class JsonToolCall:
    """Streams one ``{"name": ..., "arguments" | "parameters": {...}}`` object as tool-call
    deltas: the name as soon as it is complete, then the arguments' JSON text as it grows.

    Argument text is released up to the last character that surely belongs to the arguments
    (trailing ``}`` and whitespace wait, since they may close the outer object); once the
    arguments' value parses (``json.JSONDecoder.raw_decode``), the rest of it is released.
    The released fragments concatenate to the exact arguments text of the model's output.
    While the call streams, each update reads only the text added since the last one (offsets
    into the caller's growing text, never a copy of it): slicing and comparing the whole call
    at every token made a long call's CPU quadratic in its length.

    Args:
        index: the call's index among the choice's calls.
        call_id: its id.
        needs_arguments: an object without one of ``argument_keys`` is no call (llama3_json,
            whose calls are bare JSON objects: ``{"name": "Bob", "age": 3}`` is an answer;
            hermes, whose ``{"name": "f"}`` vLLM answers as content); the name then waits for the arguments' key, so a stream never opens such
            a call. False: ``{"name": "f"}`` calls ``f`` with no arguments.
        argument_keys: the keys the arguments may come under (hermes: only ``arguments``).
    """

    def __init__(
        self,
        index: int,
        call_id: str,
        needs_arguments: bool = False,
        argument_keys: tuple[str, ...] = ARGUMENT_KEYS,
    ) -> None:
        self.index = index
        self.id = call_id
        self.needs_arguments = needs_arguments
        self.argument_keys = argument_keys
        self._args_key = _args_key(argument_keys)
        self.name: str | None = None
        self._arguments: list[str] = []  # the released fragments
        self._after_name = 0
        self._args_start: int | None = None
        self._released_to = 0  # where the released arguments text ends, while it streams
        self._stripped_to = 0  # how far the text has been read for its trailing ``_TRAILING``
        self._content_end = 0  # just past its last character outside ``_TRAILING`` so far
        self._extent: JsonExtent | None = None  # the arguments' object or array, over the stream
        self._parsed: int | None = None  # where it ends once closed (-1: closed, does not parse)
        self._done = False

    @property
    def started(self) -> bool:
        """The name has been released."""
        return self.name is not None

    @property
    def arguments(self) -> str:
        """The arguments text released so far."""
        if len(self._arguments) > 1:
            self._arguments[:] = ["".join(self._arguments)]
        return self._arguments[0] if self._arguments else ""

    def update(
        self, text: str, complete: bool, start: int = 0, end: int | None = None
    ) -> list[ToolCallDelta]:
        """Take the call's whole text so far, ``text[start:end]`` (from its ``{``; ``end``: the
        text's end); ``complete`` when no more text will come. Later calls pass the same text
        grown, with the same ``start``. Returns the deltas to release."""
        out: list[ToolCallDelta] = []
        if self._done:
            return out
        end = len(text) if end is None else end
        if self.name is None:
            m = _NAME.match(text, start, end)
            if m is None or (self.needs_arguments and self._args_key.match(text, m.end(), end) is None):
                if complete:
                    self._whole(text[start:end], out)
                return out
            try:
                self.name = json.loads(f'"{m.group(1)}"')
            except ValueError:
                self.name = m.group(1)
            out.append(ToolCallDelta(self.index, self.id, self.name, ""))
            self._after_name = m.end()
        if self._args_start is None:
            m = self._args_key.match(text, self._after_name, end)
            if m is not None and m.end() == end and not complete:
                return out  # whitespace before the value may still grow
            if m is None:
                if complete:
                    # a closed object without arguments (``{"name": "f"}``) calls f with none; one
                    # cut short after its name (``{"name": "f", "par``) wrote no arguments: none
                    # are released, rather than a ``{}`` the model never wrote
                    if _is_object(text[start:end]):
                        self._release("{}", out)
                    self._done = True
                return out
            self._args_start = self._released_to = self._stripped_to = self._content_end = m.end()
        if complete:  # any JSON value will do: parse it once
            raw = text[self._args_start : end]
            try:
                _, stop = _DECODER.raw_decode(raw)
                self._release(raw[:stop], out)
            except (ValueError, RecursionError):  # nested past the parser's depth: as cut JSON
                self._release(raw.rstrip(_TRAILING), out)
            self._done = True
            return out
        # only an object or array can be known whole before the text ends
        closed = self._value_end(text, end)
        if closed is not None:
            self._release(text[self._args_start : closed], out)
            self._done = True
            return out
        if end > self._stripped_to:  # read the new text for its last non-trailing character
            kept = text[self._stripped_to : end].rstrip(_TRAILING)
            if kept:
                self._content_end = self._stripped_to + len(kept)
            self._stripped_to = end
        if self._content_end > self._released_to:
            piece = text[self._released_to : self._content_end]
            out.append(ToolCallDelta(self.index, arguments=piece))
            self._arguments.append(piece)
            self._released_to = self._content_end
        return out

    def _value_end(self, text: str, end: int) -> int | None:
        """Where the arguments' object or array ends in ``text`` (the call's text so far), once
        it has closed and parses; None while it is open, when it closed but does not parse, and
        when the value is no object or array. Each character is read once over a stream
        (:class:`JsonExtent`), and the value is parsed once, when it closes."""
        if self._extent is None:
            if text[self._args_start] not in "{[":
                return None
            self._extent = JsonExtent(self._args_start)
        if self._parsed is None and self._extent.scan(text, end) is not None:
            try:
                _, end = _DECODER.raw_decode(text, self._args_start)
                self._parsed = end
            except (ValueError, RecursionError):  # no later text can make it parse
                self._parsed = -1
        return None if self._parsed is None or self._parsed < 0 else self._parsed

    def _release(self, upto: str, out: list[ToolCallDelta]) -> None:
        """Release the rest of ``upto``, the arguments text, when it goes on from the text
        released so far."""
        released = self.arguments
        if len(upto) > len(released) and upto.startswith(released):
            out.append(ToolCallDelta(self.index, arguments=upto[len(released) :]))
            self._arguments[:] = [upto]

    def _whole(self, text: str, out: list[ToolCallDelta]) -> None:
        """A complete call whose name is not its first key: parse it whole."""
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            return
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return
        keys = [key for key in self.argument_keys if key in obj]
        if self.needs_arguments and not keys:
            return
        args = obj[keys[0]] if keys else {}
        self.name = obj["name"]
        out.append(ToolCallDelta(self.index, self.id, self.name, ""))
        self._release(args if isinstance(args, str) else json.dumps(args, ensure_ascii=False), out)
        self._done = True


class ToolParser(abc.ABC):
    """Splits a choice's answer text into content and tool calls (streaming).

    Args:
        new_id: makes tool call ids.

    Attributes:
        calls: the tool calls found so far.
        finishes_as_tool_calls: whether a "stop" finish with complete calls becomes
            "tool_calls" (OpenAI and vLLM: for ``auto`` and ``required`` calls, not for a named
            ``tool_choice``, which keeps "stop").
    """

    finishes_as_tool_calls = True
    keeps_special_tokens = False
    """Whether the text this parser reads keeps special tokens: a request it parses (``tool_choice``
    ``"auto"``) then decodes with ``skip_special_tokens`` false unless it sets the field itself."""
    call_needs_arguments = False
    """Whether a call object must have one of :attr:`call_argument_keys`
    (:class:`JsonToolCall`'s ``needs_arguments``)."""
    call_argument_keys: tuple[str, ...] = ARGUMENT_KEYS
    """The keys a call's arguments may come under (:class:`JsonToolCall`'s ``argument_keys``)."""

    def __init__(self, new_id: Callable[[], str] = new_tool_call_id) -> None:
        self._new_id = new_id
        self.calls: list[JsonToolCall] = []

    @property
    def has_tool_calls(self) -> bool:
        return any(c.started for c in self.calls)

    @abc.abstractmethod
    def feed(self, text: str) -> DeltaMessage:
        """Take the next piece of text; return what can be released."""

    @abc.abstractmethod
    def finish(self) -> DeltaMessage:
        """No more text: release the rest."""

    def malformed_text(self) -> str | None:
        """After :meth:`finish`: all the text fed when it held a tool call that does not parse
        (JSON cut short by ``max_tokens``, or invalid), which a non-streamed answer then
        returns as content instead of the parse; None otherwise."""
        return None

    def calls_complete(self) -> bool:
        """After :meth:`finish`: whether every call it found parses, so that a "stop" finish
        becomes "tool_calls" (a call cut by a stop string is not a finished call; see
        :attr:`finishes_as_tool_calls`). By default, whether :meth:`malformed_text` is None."""
        return self.malformed_text() is None

    def _new_call(self) -> JsonToolCall:
        call = JsonToolCall(
            len([c for c in self.calls if c.started]),
            self._new_id(),
            self.call_needs_arguments,
            self.call_argument_keys,
        )
        self.calls.append(call)
        return call


class JsonCallSequence:
    """Tool calls written as JSON objects one after another, with separator characters
    between them (Llama 3's ``;``, or a JSON array's ``[``, ``,`` and ``]``).

    Args:
        parser: the owning parser (makes the calls).
        separators: characters skipped between objects (besides whitespace).
    """

    def __init__(self, parser: ToolParser, separators: str) -> None:
        self._parser = parser
        self._skip = separators + " \t\r\n"
        self._pos = 0
        self._call: JsonToolCall | None = None
        self._extent: JsonExtent | None = None  # the open call's object, over the stream
        self._end: int | None = None  # where it ends once closed and parsed
        self.invalid = False

    def update(self, text: str, final: bool, start: int = 0) -> list[ToolCallDelta]:
        """Take the calls' whole text so far, ``text[start:]`` (later calls pass the same text
        grown, with the same ``start``); return the deltas to release."""
        out: list[ToolCallDelta] = []
        self._pos = max(self._pos, start)
        while not self.invalid:
            if self._call is None:
                while self._pos < len(text) and text[self._pos] in self._skip:
                    self._pos += 1
                if self._pos >= len(text):
                    return out
                if text[self._pos] != "{":
                    self.invalid = True
                    return out
                self._call = self._parser._new_call()
                self._extent = JsonExtent(self._pos)
            end = self._object_end(text)
            if end is None:  # not whole yet, or closed and invalid
                out += self._call.update(text, final, self._pos)
                return out
            out += self._call.update(text, True, self._pos, end)
            self._pos = end
            self._call = self._extent = None
        return out

    def _object_end(self, text: str) -> int | None:
        """Where the open call's object ends in ``text``, once it has closed and parses (it is
        parsed once, when it closes; see :class:`JsonExtent`); None otherwise."""
        assert self._extent is not None
        closed = self._extent.end
        if self._extent.scan(text) is None:
            return None
        if closed is None:  # closed by this text: parse it, once
            try:
                _, end = _DECODER.raw_decode(text, self._pos)
                self._end = end
            except (ValueError, RecursionError):  # nested past the parser's depth, or invalid
                self._end = None
        return self._end
