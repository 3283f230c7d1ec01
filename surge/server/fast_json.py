"""Request bodies parsed with msgspec, about four times faster than the standard ``json`` module.

JSON bodies are parsed on the event loop, which every stream shares: a 4 MB body of token ids
took about 140 ms with ``json.loads`` against 30 ms here. :class:`FastJSONRoute` is FastAPI's
documented hook for a custom request class; a malformed body still reaches FastAPI as a
``json.JSONDecodeError``, hence the usual 400 (saying what is wrong at which byte, line and
column), a leading UTF-8 byte order mark is skipped as vLLM's parse skips it, and msgspec
refuses what it should not accept (``NaN``, invalid UTF-8, lone surrogates) with a 400 too. A
body msgspec cannot take is split into its top-level fields (:func:`field_at_fault`) so that the
400 names the one at fault: a value nested past the parser's depth (a ``RecursionError``, once a
500 on ``/invocations`` and
"There was an error parsing the body" elsewhere), a number out of range (``1e999``), ``NaN``.

msgspec parses a body in one call that holds the GIL (a thread would not help): a body over
:data:`PIECE_BYTES` is parsed a top-level field at a time, and a long array (``messages``,
``tools``, ``stop``) or a large object (``logit_bias``) about :data:`PIECE_BYTES` of it at a
time, with a yield to the event loop between pieces (:func:`decode_in_pieces`; 90,000 chat
messages in 3.9 MB were one 70-130 ms stall, 266,000 ``logit_bias`` keys one of 100-380 ms). A route whose body is a pydantic model then gets its body's long lists of models (a
chat request's ``messages``) validated a chunk at a time before FastAPI validates the rest, also
yielding between chunks (:mod:`surge.server.chunked_validation`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec
from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel

from surge.server.chunked_validation import model_list_fields, prevalidate

_decode = msgspec.json.decode
_encode = msgspec.json.encode

PIECE_BYTES = 256 * 1024
"""Bytes of JSON parsed between two yields to the event loop (a few ms of msgspec's time) when a
body is larger than this (:func:`decode_in_pieces`); smaller bodies are parsed at once."""

_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}:,]|[^"\[\]{}:,]+', re.DOTALL)
"""A JSON token for :func:`field_at_fault`: a string, one structural character, or a run of
anything else (numbers, literals, white space)."""


class BodyFieldError(HTTPException):
    """A 400 for a JSON body msgspec could not parse, naming the top-level field at fault
    (``param``; None when the body is not an object or no field is to blame)."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(status_code=400, detail=message)
        self.param = param


def _key_text(token: bytes) -> str:
    """A JSON string token's text, UTF-8 encodable: a lone surrogate is written ``\\ud800`` (an
    error body holding one could not be encoded: a 500); a malformed token, its raw bytes."""
    try:
        text = json.loads(token)
    except ValueError:
        return token[1:-1].decode("utf-8", "replace")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _spans(body: bytes) -> list[tuple[str, int, int, int]]:
    """``(key, start, end, depth)`` of each top-level field of a JSON object ``body``: its value
    is ``body[start:end]``, nested ``depth`` arrays and objects deep. Empty when ``body`` is not
    an object; a field cut short (the body ends in its value) is left out, and so are the field
    whose value is missing or followed by anything but ``,`` or ``}`` (a missing comma, a second
    ``:``) and every field after it: there the body's structure is to blame, not a value."""
    out: list[tuple[str, int, int, int]] = []
    depth, key, start, deepest, done = 0, None, -1, 0, False
    for m in _TOKEN.finditer(body):
        tok = m.group()
        head = tok[:1]
        if depth == 0:
            if head == b"{":
                depth = 1
            elif tok.strip():
                return out  # not an object, or done
            continue
        if depth == 1 and key is None:
            if head == b'"':
                key = _key_text(tok)
            elif head == b"}":
                depth = 0
            continue
        if depth == 1 and start < 0:
            if head == b":":
                start, deepest, done = m.end(), 0, False
            continue
        if depth == 1:
            if head in (b",", b"}"):
                if not done:
                    return out  # no value: the body's structure is to blame
                out.append((key, start, m.start(), deepest))
                key, start = None, -1
                depth = 0 if head == b"}" else 1
                continue
            scalar = tok.strip()
            if not scalar:
                continue
            if done or head == b":" or (head != b'"' and len(scalar.split()) > 1):
                return out  # a second value (a missing comma: `1 2`, `"x" "y"`) or a stray colon
            done = head not in (b"[", b"{")  # a string or a scalar: one value
        if head in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth - 1)
        elif head in (b"]", b"}"):
            depth -= 1
            done = done or depth == 1
    return out  # a field cut short is not listed: the body is to blame, not the field


def field_at_fault(body: bytes, too_deep: bool) -> str | None:
    """The top-level field of a JSON object ``body`` that msgspec could not parse: with
    ``too_deep`` (the parse ran out of recursion depth) the one nested deepest, else the first
    whose value alone fails to parse. None when ``body`` is not an object or no field fails.
    Cost: one regex pass over ``body`` (and a parse of each value), so call it off the event loop."""
    spans = _spans(body)
    if too_deep:
        return max(spans, key=lambda s: s[3])[0] if spans else None
    for key, start, end, _ in spans:
        try:
            _decode(body[start:end])
        except (msgspec.DecodeError, RecursionError):
            return key
    return None


INVALID_JSON = "Invalid JSON body: JSON decode error"
"""How the 400 for a body that is not JSON starts (FastAPI's ``msg`` for it, which vLLM's message
quotes too); :func:`where_json_fails` says what and where after it."""

_BOM = b"\xef\xbb\xbf"
"""UTF-8's byte order mark: a body that starts with it is parsed without it, as vLLM's (the standard
``json.loads`` of a ``bytes`` body reads it as ``utf-8-sig``)."""

_MALFORMED = re.compile(r"JSON is malformed: (.*) \(byte (\d+)\)", re.DOTALL)
"""msgspec's message for malformed JSON: what is wrong, and the byte offset where."""


def where_json_fails(body: bytes, error: msgspec.DecodeError) -> tuple[str, int]:
    """What is wrong with ``body``, which msgspec refused with ``error``, and where: ``("invalid
    character at byte 6 (line 1, column 7)", 6)``, the byte offset second (0-based; the line and
    column are 1-based, the column in characters). A body cut short is wrong at its end; an error
    that names no position is msgspec's words at offset 0. Cost: a C-speed count over the body
    up to the offset, so call it off the event loop."""
    text = str(error)
    m = _MALFORMED.fullmatch(text)
    if m is not None:
        what, pos = m.group(1), min(int(m.group(2)), len(body))
        if what == "trailing characters" and pos > 0:  # msgspec's offset is one past the first
            pos -= 1
    elif text == "Input data was truncated":
        what, pos = "the body ends before its JSON does", len(body)
    else:
        return text, 0
    line_start = body.rfind(b"\n", 0, pos) + 1
    line = body.count(b"\n", 0, pos) + 1
    column = len(body[line_start:pos].decode("utf-8", "replace")) + 1
    return f"{what} at byte {pos} (line {line}, column {column})", pos


def _refusal(body: bytes, error: Exception) -> BodyFieldError | json.JSONDecodeError:
    """The 400 naming the field of ``body`` that msgspec refused with ``error``, or, with no field
    to blame (the body is not JSON), the ``json.JSONDecodeError`` FastAPI answers with a 400 whose
    message says what is wrong and where (:func:`where_json_fails`). Runs off the event loop."""
    too_deep = isinstance(error, RecursionError)
    field = field_at_fault(body, too_deep)
    if too_deep:
        where = "body" if field is None else field or "''"
        return BodyFieldError(field, f"{where}: nested too deeply to parse as JSON")
    if field is not None:
        return BodyFieldError(field, f"{field or repr(field)}: not a JSON value Surge can parse ({error})")
    if not isinstance(error, msgspec.DecodeError):
        return json.JSONDecodeError(str(error), "", 0)
    what, pos = where_json_fails(body, error)
    return json.JSONDecodeError(what, "", pos)


async def decode_in_pieces(body: bytes) -> Any:
    """``msgspec.json.decode(body)``, the same value, parsed in pieces with a yield to the event
    loop between them: each top-level field of a JSON object on its own, an array field larger
    than :data:`PIECE_BYTES` in runs of elements of about that size, and an object field larger
    than that (``logit_bias``) between its members (:func:`_object_in_pieces`). Anything the pieces
    cannot parse (a body that is not an object, malformed JSON, a value nested too deeply) is
    parsed again whole, so the errors are exactly those of one ``msgspec.json.decode(body)``.

    Raises:
        msgspec.DecodeError, RecursionError: as ``msgspec.json.decode(body)``.
    """
    try:
        fields = _decode(body, type=dict[str, msgspec.Raw])  # checks the whole body's syntax
        out: dict[str, Any] = {}
        for key, raw in fields.items():
            await asyncio.sleep(0)
            head = memoryview(raw)[:1]
            if len(raw) <= PIECE_BYTES:
                out[key] = _decode(raw)
            elif head == b"[":
                out[key] = await _array_in_pieces(raw)
            elif head == b"{":
                out[key] = await _object_in_pieces(bytes(raw))
            else:
                out[key] = _decode(raw)
        return out
    except (msgspec.DecodeError, RecursionError, ValueError):
        return _decode(body)  # raises the whole body's error (or parses what the pieces could not)


async def _array_in_pieces(raw: msgspec.Raw) -> list[Any]:
    """A JSON array's value, runs of its elements of about :data:`PIECE_BYTES` parsed at a time."""
    items = _decode(raw, type=list[msgspec.Raw])
    step = max(1, PIECE_BYTES * len(items) // len(raw))
    value: list[Any] = []
    for start in range(0, len(items), step):
        await asyncio.sleep(0)
        value.extend(_decode(b"[" + b",".join(items[start : start + step]) + b"]"))
    return value


async def _object_in_pieces(raw: bytes) -> dict[str, Any]:
    """A JSON object's value (``raw``: its text, whose syntax msgspec has checked), its members
    parsed about :data:`PIECE_BYTES` at a time (``logit_bias``: 266,000 keys in 3.9 MB took
    0.2-0.6 s in one call). A piece ends at the first comma past that size if the text before it,
    closed with ``}``, parses: a comma inside a string or a nested value leaves an unterminated
    string or an unclosed bracket there, so one that parses separates two members. At the first
    comma that does not, the rest is left to :func:`_members_in_runs`, which finds its members in
    one pass (trying further commas re-parsed a piece each: an object whose every member holds
    commas cost 8 parses per piece, then one call for the rest). Members are merged in order (a
    key given twice keeps its first place and last value, as in one parse).

    Raises:
        msgspec.DecodeError, RecursionError: a piece cannot be parsed (the caller parses the
            whole body again for its error).
        ValueError: a key msgspec cannot encode again (a lone surrogate; the caller parses the
            whole body again).
    """
    out: dict[str, Any] = {}
    start = 1  # past the "{"
    while len(raw) - start > PIECE_BYTES:
        await asyncio.sleep(0)
        comma = raw.find(b",", start + PIECE_BYTES)
        if comma < 0:
            break
        try:
            piece = _decode(b"{" + raw[start:comma] + b"}")
        except (msgspec.DecodeError, RecursionError):
            out.update(await _members_in_runs(b"{" + raw[start:]))
            return out
        out.update(piece)
        start = comma + 1
    out.update(_decode(b"{" + raw[start:]))
    return out


async def _members_in_runs(raw: bytes) -> dict[str, Any]:
    """A JSON object's value: one call reads its keys and finds each value's text without building
    it (``dict[str, msgspec.Raw]``), then runs of members of about :data:`PIECE_BYTES` are parsed at
    a time, each rebuilt as ``{key: value, ...}`` from its key encoded again and its value's text.

    Raises:
        msgspec.DecodeError, RecursionError, ValueError: as :func:`_object_in_pieces`.
    """
    members = _decode(raw, type=dict[str, msgspec.Raw])
    out: dict[str, Any] = {}
    run: list[bytes] = []
    size = 0
    for key, value in members.items():
        member = _encode(key) + b":" + bytes(value)
        run.append(member)
        size += len(member)
        if size >= PIECE_BYTES:
            await asyncio.sleep(0)
            out.update(_decode(b"{" + b",".join(run) + b"}"))
            run, size = [], 0
    if run:
        await asyncio.sleep(0)
        out.update(_decode(b"{" + b",".join(run) + b"}"))
    return out


class FastJSONRequest(Request):
    """A Starlette request whose ``json()`` parses with msgspec (cached like Starlette's); a
    leading UTF-8 byte order mark is skipped, as vLLM's parse skips it. With a ``body_model``
    (the route's pydantic body), the parsed body's long lists of models are validated in chunks
    that yield to the event loop (:func:`surge.server.chunked_validation.prevalidate`)."""

    body_model: type[BaseModel] | None = None

    async def json(self) -> Any:
        """The body parsed once by msgspec, then cached.

        Raises:
            BodyFieldError: a top-level field's value cannot be parsed (a 400 naming it).
            json.JSONDecodeError: the body is not valid JSON (FastAPI answers 400); its ``msg``
                says what is wrong and where, its ``pos`` is the byte offset.
        """
        if not hasattr(self, "_json"):
            body = await self.body()
            if body.startswith(_BOM):  # vLLM's json.loads reads a bytes body as utf-8-sig
                body = body[len(_BOM) :]
            try:
                self._json = await decode_in_pieces(body) if len(body) > PIECE_BYTES else _decode(body)
            except (msgspec.DecodeError, RecursionError) as e:
                raise await asyncio.to_thread(_refusal, body, e) from None
            if self.body_model is not None:
                await prevalidate(self._json, self.body_model)
            if len(body) > PIECE_BYTES:
                await asyncio.sleep(0)  # FastAPI's validation, another long call, comes next
        return self._json


def body_model_of(endpoint: Callable[..., Any]) -> type[BaseModel] | None:
    """The pydantic model of an endpoint's body: its first parameter annotated with a
    :class:`BaseModel` subclass, or None (none, or annotations that do not resolve)."""
    try:
        parameters = inspect.signature(endpoint, eval_str=True).parameters.values()
    except (NameError, TypeError, ValueError):
        return None
    for p in parameters:
        if isinstance(p.annotation, type) and issubclass(p.annotation, BaseModel):
            return p.annotation
    return None


class FastJSONRoute(APIRoute):
    """An APIRoute whose handler sees a :class:`FastJSONRequest` (knowing the route's body model)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, given each request as a :class:`FastJSONRequest`."""
        handler = super().get_route_handler()
        body_model = body_model_of(self.endpoint)
        if body_model is not None:
            model_list_fields(body_model)  # its validators built now, not on a request's time

        async def fast_json_handler(request: Request) -> Response:
            fast = FastJSONRequest(request.scope, request.receive)
            fast.body_model = body_model
            return await handler(fast)

        return fast_json_handler
