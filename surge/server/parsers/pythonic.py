"""Pythonic tool calls (Llama 3.2, Llama 4, ToolACE): the whole answer is a Python list of calls
with literal keyword arguments, ``[get_weather(city='Paris', unit="c"), get_time()]``; any other
answer is content. As vLLM's ``PythonicToolParser`` (``--tool-call-parser pythonic``)."""

from __future__ import annotations

import ast
import json
import keyword
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from surge.server.parsers.base import BufferedParser, DeltaMessage, ToolCallDelta, ToolParser, skip_space

_JSON_NAMES: dict[str, Any] = {"true": True, "false": False, "null": None}
"""JSON's literals, which models trained on JSON write for Python's (vLLM reads them too)."""

_STREAMED_PREFIXES = frozenset({"", "r", "R", "u", "U"})
"""Prefixes of a ``str`` literal whose text is streamed as it comes (``b''`` and f-strings are
not literals of a call: the call is malformed)."""

_CLOSING = {"(": ")", "[": "]", "{": "}"}
_HEX_ESCAPE_LENGTH = {"x": 4, "u": 6, "U": 10}
"""The length of a ``\\x``, ``\\u`` or ``\\U`` escape, its backslash included."""
_LONGEST_GROWING_ESCAPE = 11
"""More characters than any escape but ``\\N{...}`` has: what :func:`_escape_done` reads of one."""


class NotALiteral(ValueError):
    """An argument that is not a literal JSON can carry (a name, an expression, bytes, a set, a
    tuple, a number JSON has no word for)."""


def literal_value(node: ast.expr) -> Any:
    """The JSON value of a call's literal argument, as vLLM's pythonic parser reads one: a
    string, a number (``-2`` and ``+2`` too), ``True`` / ``False`` / ``None`` (or JSON's ``true`` /
    ``false`` / ``null``), and lists and dicts of them (dict keys: strings, numbers, booleans or
    ``None``, which JSON writes as strings).

    Raises:
        NotALiteral: any other expression, a number JSON cannot write (``1e999``, ``1j``), or a
            string holding a UTF-16 surrogate that has no partner (``'\\ud800'``), which no JSON
            response can carry.
    """
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, bool | int):
            return value
        if isinstance(value, float) and math.isfinite(value):
            return value
        if isinstance(value, str):
            return _paired(value)
        raise NotALiteral(f"{type(value).__name__} is not a JSON value")
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub | ast.UAdd)
        and isinstance(node.operand, ast.Constant)
        and type(node.operand.value) in (int, float)
    ):
        number = literal_value(node.operand)
        return -number if isinstance(node.op, ast.USub) else number
    if isinstance(node, ast.List):
        return [literal_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        out: dict[Any, Any] = {}
        for k, v in zip(node.keys, node.values, strict=True):
            key = None if k is None else literal_value(k)  # None: a ``**mapping``
            if k is None or not (key is None or isinstance(key, str | int | float)):
                raise NotALiteral("a dict key must be a string, a number, a boolean or None")
            out[key] = literal_value(v)
        return out
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise NotALiteral(f"{type(node).__name__} is not a literal")


def _paired(text: str) -> str:
    """``text`` with its UTF-16 surrogate pairs (``'\\ud83d\\ude00'``, as JSON writes an emoji)
    joined into their characters.

    Raises:
        NotALiteral: a surrogate without its partner is left.
    """
    if not any("\ud800" <= c <= "\udfff" for c in text):
        return text
    try:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError:
        raise NotALiteral("a lone UTF-16 surrogate") from None


def json_text(value: Any) -> str:
    """``value`` as JSON text, as vLLM writes a pythonic call's arguments (``json.dumps`` with
    ``ensure_ascii=False``).

    Raises:
        NotALiteral: a number too long to write (Python's 4300-digit limit).
    """
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except ValueError as e:
        raise NotALiteral(str(e)) from None


def _parse(source: str) -> ast.Expression:
    """``source`` parsed as one Python expression, without the warnings an invalid escape
    (``'\\d'``) makes the compiler print.

    Raises:
        SyntaxError, ValueError, RecursionError, MemoryError: not an expression Python reads.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(source, mode="eval")


def parse_calls(text: str) -> list[tuple[str, str]] | None:
    """The calls of a whole answer, ``[(name, arguments JSON)]``, or None when the answer (white
    space around it aside) is not a Python list of one or more calls of plain names with literal
    keyword arguments, each keyword once. What vLLM's non-streamed ``extract_tool_calls`` answers
    with calls (it checks its call-list regex, then ``ast``; any failure makes the answer
    content)."""
    try:
        tree = _parse(text.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls = []
    for call in tree.body.elts:
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.args:
            return None
        args: dict[str, Any] = {}
        for kw in call.keywords:
            if kw.arg is None or kw.arg in args:  # ``**mapping``, or a keyword repeated
                return None
            try:
                args[kw.arg] = literal_value(kw.value)
            except (NotALiteral, RecursionError):
                return None
        try:
            calls.append((call.func.id, json_text(args)))
        except NotALiteral:
            return None
    return calls


@dataclass(slots=True)
class _Call:
    """One call of the list as it streams: its name, its complete arguments (their keywords, and
    their ``"key": value`` JSON texts) and the argument text released so far.

    The arguments text is ``{``, the pairs joined by ``, ``, and ``}`` once closed: its
    *segments* are ``{``, each pair (after the first with its ``, ``) and ``}``. What is released
    is the first ``segments_released`` segments, then ``tail`` (the start of the next pair: its
    key and the string value streamed so far, ``tail_sent`` pieces of ``tail_of``'s JSON), so
    that a piece's release costs the piece's length, not the arguments' (rebuilding and comparing
    the whole text at every piece was quadratic: a 128,000-character string argument streamed in
    4-character pieces took 0.53 s)."""

    index: int
    id: str
    name: str
    keys: set[str] = field(default_factory=set)
    pairs: list[str] = field(default_factory=list)
    released_parts: list[str] = field(default_factory=list)
    closed: bool = False
    segments_released: int = 0
    tail: list[str] = field(default_factory=list)
    tail_of: _String | None = None
    tail_sent: int = 0
    stuck: bool = False  # the released text stopped being a start of the arguments text

    @property
    def released(self) -> str:
        """The arguments text released so far."""
        if len(self.released_parts) > 1:
            self.released_parts[:] = ["".join(self.released_parts)]
        return self.released_parts[0] if self.released_parts else ""

    def segment(self, k: int) -> str:
        """The ``k``-th complete segment of the arguments text (``k`` < :meth:`num_segments`)."""
        if k == 0:
            return "{"
        if k <= len(self.pairs):
            return (", " if k > 1 else "") + self.pairs[k - 1]
        return "}"

    def num_segments(self) -> int:
        """How many segments of the arguments text are complete."""
        return 1 + len(self.pairs) + (1 if self.closed else 0)


@dataclass(slots=True)
class _String:
    """The string literal a keyword's value opens with, streamed as it is written.

    Attributes:
        body: where its text starts (after the opening quotes).
        quote: its quote character.
        triple: it opened with three of them.
        prefix: its prefix letters (``r``, ``u``, or none).
        decoded_to: how far its text has been decoded.
        json: the JSON string text of what is decoded, without quotes, in pieces.
        streams: False once a piece would not stream (a surrogate): the rest waits for the value.
    """

    body: int
    quote: str
    triple: bool
    prefix: str
    decoded_to: int = 0
    json: list[str] = field(default_factory=list)
    streams: bool = True


class PythonicToolParser(BufferedParser[DeltaMessage], ToolParser):
    """``--tool-call-parser pythonic``, as vLLM's ``PythonicToolParser``.

    The first character that is not white space decides: ``[`` starts a list of calls, anything
    else makes the whole answer content. The list is scanned as it grows: a call opens (its id and
    name are released) once its first keyword's ``=`` or its closing ``)`` is written; each keyword
    argument is released as the JSON ``"key": value`` once its value ends (a ``,`` or ``)`` outside
    brackets and strings), a string value's text as it comes; the call's arguments join to
    ``json.dumps`` of its keyword arguments (``{"city": "Paris", "unit": "c"}``, ``{}`` for none).
    Until a call opens, an answer that turns out to be no call list (``[1] Paris ...``, ``[]``,
    ``[see(below)]``) is released as content. An answer whose calls do not parse as a Python list
    of calls with literal arguments (cut by ``max_tokens``, a name or an expression as an argument,
    a positional argument, text after the list) is malformed (:meth:`malformed_text`): a
    non-streamed answer is then the whole text as content, as vLLM's ``extract_tool_calls``
    answers; the text after a list's ``]`` is dropped from a stream (vLLM's stream drops it too).
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._buf = ""
        self._mode = "undecided"
        self._lead = 0  # white space at the start of _buf already read, while undecided
        self._start = 0  # where the list's ``[`` is in _buf
        self._pos = 0  # how far the list has been scanned (in _buf)
        self._state = "item"
        self._mark = 0  # where the name, keyword or value being scanned starts
        self._key = ""  # the keyword whose value is being scanned
        self._stack: list[str] = []  # the brackets open inside that value
        self._string: _String | None = None  # the string literal the scan is inside
        self._value_string: _String | None = None  # the one the value opened with, streamed
        self._escape = -1  # where the open string's last escape starts
        self._escape_read = (-1, 0)  # an open ``\N{`` escape's start, and how far it has no ``}``
        self._comment = False  # the scan is inside a ``#`` comment
        self._calls: list[_Call] = []
        self._pending_name = ""
        self._invalid = False
        self._checked: bool | None = None

    @property
    def has_tool_calls(self) -> bool:
        return bool(self._calls)

    def malformed_text(self) -> str | None:
        """The whole text, when it opened calls that are not what :func:`parse_calls` reads in
        it (cut short, invalid, or text after the list); None otherwise."""
        if self._mode != "calls" or not self._calls:
            return None
        if self._checked is None:
            streamed = [(c.name, c.released) for c in self._calls]
            self._checked = (
                not self._invalid
                and self._state == "end"
                and parse_calls(self._buf[self._start :]) == streamed
            )
        return None if self._checked else self._buf

    def _process(self, final: bool) -> DeltaMessage:
        out = DeltaMessage()
        self._checked = None
        if self._mode == "undecided":
            self._lead = skip_space(self._buf, self._lead)
            head = self._buf[self._lead :]
            if not head:
                if final:
                    out.content, self._buf = self._buf, ""
                return out
            if head[0] == "[":
                self._mode = "calls"
                self._start = len(self._buf) - len(head)
                self._pos = self._start + 1
            else:
                self._mode = "content"
        if self._mode == "content":
            out.content, self._buf = self._buf, ""
            return out
        if not self._invalid:
            self._scan(final, out.tool_calls)
            self._stream_string(final)
            if self._calls:
                self._release(self._calls[-1], out.tool_calls)
        if self._invalid and not self._calls:
            # no call opened: the answer was never a call list (``[1] Paris``); all content
            self._mode = "content"
            out.content, self._buf = self._buf, ""
        elif final and not self._calls:
            out.content += self._buf  # cut before a call opened
        return out

    # -- the scan ------------------------------------------------------------------------------

    def _scan(self, final: bool, out: list[ToolCallDelta]) -> None:
        """Scan the list from where the last scan stopped, opening and closing calls; stops at the
        end of the text, where the text may still go on as something else, or where it stops
        being a call list (``_invalid``)."""
        buf, n = self._buf, len(self._buf)
        i = self._pos
        while i < n and not self._invalid:
            if self._comment:  # a ``#`` comment runs to the end of its line
                j = buf.find("\n", i)
                if j < 0:
                    i = n
                    break
                self._comment, i = False, j
                continue
            c = buf[i]
            state = self._state
            if state == "value":
                j = self._scan_value(i, final, out)
                if j is None:
                    break
                i = j
                continue
            if state in ("name", "key"):
                j = i  # the word's characters before i are scanned already
                while j < n and (buf[j].isalnum() or buf[j] == "_"):
                    j += 1
                if j == n and not final:
                    i = j
                    break  # the word may go on
                word = buf[self._mark : j]
                if not word.isidentifier() or keyword.iskeyword(word):
                    self._invalid = True
                elif state == "name":
                    self._pending_name, self._state = word, "paren"
                else:
                    self._key, self._state = word, "equals"
                i = j
                continue
            if c.isspace() or c == "#":
                self._comment = c == "#"
                i += 1
                continue
            if state == "item":  # after ``[`` or a ``,`` between calls
                if c == "]" and self._calls:  # ``[f(),]``
                    self._state = "end"
                elif c.isidentifier():
                    self._state, self._mark = "name", i
                    continue
                else:
                    self._invalid = True
                i += 1
            elif state == "paren":
                self._invalid = c != "("
                self._state = "args"
                i += 1
            elif state == "args":  # after ``(`` or a ``,`` between keyword arguments
                if c == ")":
                    self._open_call(out)
                    self._close_call(out)
                elif c.isidentifier():
                    self._state, self._mark = "key", i
                    continue
                else:
                    self._invalid = True
                i += 1
            elif state == "equals":
                if c != "=":  # ``a==b`` opens a call whose value then does not parse
                    self._invalid = True
                else:
                    self._open_call(out)
                    self._state, self._mark, self._stack = "value", i + 1, []
                    self._value_string = None
                i += 1
            elif state == "after":  # after a call's ``)``
                if c == ",":
                    self._state = "item"
                elif c == "]":
                    self._state = "end"
                else:
                    self._invalid = True
                i += 1
            else:  # "end": only white space may follow the list
                self._invalid = True
        self._pos = i

    def _scan_value(self, i: int, final: bool, out: list[ToolCallDelta]) -> int | None:
        """Scan a keyword's value from ``i``: returns where the scan goes on, or None to wait for
        more text. The value ends at a ``,`` or ``)`` outside its brackets and strings."""
        buf, n = self._buf, len(self._buf)
        s = self._string
        if s is not None:  # inside a string literal
            c = buf[i]
            if c == "\\":
                if i + 1 >= n:
                    return None if not final else n
                self._escape = i
                return i + 2
            if c != s.quote:
                return i + 1
            if not s.triple:
                self._string = None
                return i + 1
            if buf.startswith(s.quote * 3, i):
                self._string = None
                return i + 3
            if n - i < 3 and buf[i:] == s.quote * (n - i) and not final:
                return None  # one or two quotes: the end may still come
            return i + 1
        c = buf[i]
        if c in "'\"":
            j = i
            while j > self._mark and buf[j - 1].isalpha():
                j -= 1
            if n - i < 3 and buf[i:] == c * (n - i) and not final:
                return None  # ``'`` or ``''`` at the end: a string or a triple-quoted one
            triple = buf.startswith(c * 3, i)
            body = i + (3 if triple else 1)
            self._string = _String(body, c, triple, buf[j:i], decoded_to=body)
            self._escape = -1
            if not self._stack and not buf[self._mark : j].strip() and buf[j:i] in _STREAMED_PREFIXES:
                self._value_string = self._string
            return body
        if c == "#":
            self._comment = True
            return i + 1
        if c in _CLOSING:
            self._stack.append(_CLOSING[c])
            return i + 1
        if c in ")]}" and self._stack:
            if self._stack.pop() != c:
                self._invalid = True
            return i + 1
        if c in ",)" and not self._stack:
            self._end_value(buf[self._mark : i])
            if not self._invalid:
                if c == ",":
                    self._state = "args"
                else:
                    self._close_call(out)
            return i + 1
        if c in "]}":
            self._invalid = True
        return i + 1

    def _end_value(self, text: str) -> None:
        """The current keyword's value is ``text``: add its ``"key": value`` pair, or mark the list
        invalid when it is not a literal."""
        call = self._calls[-1]
        try:
            value = json_text(literal_value(_parse(f"({text}\n)").body))
        except (NotALiteral, SyntaxError, ValueError, RecursionError, MemoryError):
            self._invalid = True
            return
        if self._key in call.keys:  # Python refuses a keyword given twice
            self._invalid = True
            return
        call.keys.add(self._key)
        call.pairs.append(f"{json_text(self._key)}: {value}")
        self._value_string = None

    def _open_call(self, out: list[ToolCallDelta]) -> None:
        """The call being scanned has its first keyword (or none): release its id and name."""
        if self._calls and not self._calls[-1].closed:
            return
        call = _Call(len(self._calls), self._new_id(), self._pending_name)
        self._calls.append(call)
        out.append(ToolCallDelta(call.index, call.id, call.name, ""))

    def _close_call(self, out: list[ToolCallDelta]) -> None:
        """The call's ``)``: release the rest of its arguments."""
        call = self._calls[-1]
        call.closed = True
        self._state = "after"
        self._release(call, out)

    # -- releasing arguments -------------------------------------------------------------------

    def _stream_string(self, final: bool) -> None:
        """Decode the text the open string value has so far, up to the last escape that may
        still grow (``\\1`` may become ``\\12``, ``\\x4`` ``\\x41``, ``\\N{...`` go on) and
        before a last ``\\r`` (a ``\\r\\n`` is one newline to Python, two when decoded apart)."""
        s = self._value_string
        if s is None or not s.streams or self._string is not s or final or self._invalid:
            return
        upto = self._pos
        if self._escape >= s.decoded_to and "r" not in s.prefix.lower() and not self._escape_done(upto):
            upto = self._escape
        if upto > s.decoded_to and self._buf[upto - 1] == "\r":
            # may be the start of a "\r\n", which Python reads as one newline (decoded apart, a
            # "\n" more), with the backslash before it (a line continuation) if there is one
            upto -= 1
            if self._escape == upto - 1:
                upto = self._escape
        if upto <= s.decoded_to:
            return
        piece = self._buf[s.decoded_to : upto]
        quote = s.quote * (3 if s.triple else 1)
        try:
            text = _parse(f"{s.prefix}{quote}{piece}{quote}").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            s.streams = False
            return
        if not isinstance(text, ast.Constant) or not isinstance(text.value, str):
            s.streams = False
            return
        decoded = text.value
        surrogate = next((k for k, c in enumerate(decoded) if "\ud800" <= c <= "\udfff"), None)
        if surrogate is not None:  # it may pair with what follows: the rest waits for the value
            decoded, s.streams = decoded[:surrogate], False
        piece = json.dumps(decoded, ensure_ascii=False)[1:-1]
        if piece:
            s.json.append(piece)
        s.decoded_to = upto

    def _escape_done(self, upto: int) -> bool:
        """Whether the open string's last escape, from ``_escape`` to ``upto``, can no longer
        grow (:func:`_escape_done`). Only its first characters are read, and a ``\\N{`` escape's
        text only once for its ``}``: an escape left open (``'\\N{xxx...``) was read whole at
        every piece (quadratic)."""
        start = self._escape
        if self._buf[start + 1 : start + 2] != "N":
            return _escape_done(self._buf[start : min(upto, start + _LONGEST_GROWING_ESCAPE)])
        seen_from, seen_to = self._escape_read
        i = seen_to if seen_from == start else start
        if self._buf.find("}", i, upto) >= 0:
            return True
        self._escape_read = (start, max(i, upto))
        return False

    def _release(self, call: _Call, out: list[ToolCallDelta]) -> None:
        """Release the arguments text of ``call`` that is sure: its complete pairs, the string
        value being written, and the closing ``}`` once the call is closed. That text only grows
        by the segments completed and the string's pieces decoded since the last release, which
        are all this reads (:class:`_Call`)."""
        if call.stuck:
            return
        k, n = call.segments_released, call.num_segments()
        s = self._value_string
        streaming = not call.closed and self._state == "value" and s is not None and bool(s.json)
        started = "".join(call.tail) if call.tail and k < n else ""
        if call.tail and (
            not call.segment(k).startswith(started) if k < n else streaming and call.tail_of is not s
        ):
            # the released start of a pair that does not go on as that pair: no later text can
            # extend what was released (the pair stays in it), so nothing more is released
            call.stuck = True
            return
        new: list[str] = []
        if started:
            new.append(call.segment(k)[len(started) :])
            call.tail, call.tail_of, k = [], None, k + 1
        while k < n:
            new.append(call.segment(k))
            k += 1
        call.segments_released = k
        if streaming:
            assert s is not None
            if not call.tail:
                start = (", " if call.pairs else "") + f'{json_text(self._key)}: "'
                call.tail, call.tail_of, call.tail_sent = [start], s, 0
                new.append(start)
            fresh = s.json[call.tail_sent :]
            call.tail.extend(fresh)
            new.extend(fresh)
            call.tail_sent = len(s.json)
        text = "".join(new)
        if text:
            out.append(ToolCallDelta(call.index, arguments=text))
            call.released_parts.append(text)


def _escape_done(escape: str) -> bool:
    """Whether the escape ``escape`` (from its backslash to the end of the text scanned) can no
    longer grow: an octal one of three digits or followed by another character, a ``\\x``,
    ``\\u`` or ``\\U`` with all its hex digits, a ``\\N{...}`` with its ``}``, any other one."""
    kind = escape[1:2]
    if kind and kind in "01234567":
        digits = len(escape[1:4]) - len(escape[1:4].lstrip("01234567"))
        return digits == 3 or len(escape) > 1 + digits
    if kind in _HEX_ESCAPE_LENGTH:
        return len(escape) >= _HEX_ESCAPE_LENGTH[kind]
    if kind == "N":
        return "}" in escape
    return bool(kind)
