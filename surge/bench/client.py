"""Async streaming requests against an OpenAI-compatible server, timed the way vLLM's ``bench serve`` is
(but for which chat chunks count: :func:`counts_as_output`).

One function per request (``send_request``): it is called after the concurrency semaphore, reads
``time.perf_counter()`` first thing, and returns a :class:`~surge.bench.metrics.RequestResult`.
The SSE stream is parsed by :class:`SSEParser`, which copes with lines split across TCP reads,
``\\r\\n`` and bare ``\\r`` line ends, comments (``: ping``), multi-line ``data:`` fields and ``data: [DONE]``.
An error object inside a 200 stream (``{"error": {...}}`` or ``{"object": "error"}``), or an event
named ``error`` (``event: error``, whatever its data), fails the request with its message as the
reason, and so does a stream that ends without ``data: [DONE]`` (a server that stopped or a
connection dropped mid-answer: a close-delimited body, or a chunked one ended cleanly, raises
nothing in aiohttp; a body without any event is quoted in the reason).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from surge.bench.metrics import RequestResult
from surge.bench.tokens import request_headers

CHAT_ENDPOINT = "/v1/chat/completions"
COMPLETIONS_ENDPOINT = "/v1/completions"


def is_chat_route(url: str) -> bool:
    """Whether requests to ``url`` (a route such as ``--endpoint`` or a full URL) are chat
    requests: it ends with ``/chat/completions`` (``/v1/chat/completions``, or behind a proxy's
    prefix, ``/proxy/v1/chat/completions``); any other ``.../completions`` takes completions
    requests."""
    return url.endswith("/chat/completions")


def check_route(endpoint: str) -> None:
    """Refuse an ``--endpoint`` Surge's client cannot send its requests to. vLLM 0.26 takes any
    path whose URL ends with ``completions`` (its backend picks the request format); Surge takes a
    path that starts with ``/`` and ends with ``/completions``, with any prefix (a proxy's, or none
    for a server without ``/v1``), and picks the format from it (:func:`is_chat_route`).

    Raises:
        ValueError: any other route (one line that names it): no leading ``/``, another last
            part (vLLM's ``/profile``, ``/v1/embeddings``...), a query string or whitespace.
    """
    if (
        not endpoint.startswith("/")
        or not endpoint.endswith("/completions")
        or any(c in endpoint for c in "?# \t\n")
    ):
        raise ValueError(
            f"--endpoint {endpoint!r}: Surge's bench sends chat or completions requests to a route that "
            "starts with / and ends with /chat/completions (chat) or /completions (completions), any prefix "
            "before it, e.g. /v1/chat/completions, /v1/completions or /proxy/v1/completions"
        )


class ErrorEvent(str):
    """The data of an SSE event whose ``event:`` field is ``error`` (a ``str``, so that it is
    parsed like any other event's data; its type says that the server named it an error)."""


HEAD_BYTES = 300
"""How many of a body's first bytes :class:`SSEParser` keeps, to quote a body without events."""


class SSEParser:
    """Incremental Server-Sent-Events parser (WHATWG ``text/event-stream`` rules: the ``data`` and
    ``event`` fields; lines end in ``\\n``, ``\\r\\n`` or a bare ``\\r``).

    ``feed(bytes)`` returns the ``data`` payloads of every event completed by that piece; bytes of an
    unfinished line or event are kept for the next call. An event named ``error`` (``event:
    error``) comes back as an :class:`ErrorEvent`. ``events`` counts the events returned so far
    and ``head`` keeps the body's first :data:`HEAD_BYTES` bytes (to quote a body without any).
    """

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []
        self._error = False  # the current event's type is "error"
        self._skip_lf = False  # the last piece ended in \r: a \n that starts the next one ends no line
        self.events = 0
        self.head = b""

    def feed(self, chunk: bytes) -> list[str]:
        """Add raw bytes; return the data strings of the events they complete (in order).

        The piece is split into lines once (no re-slicing of the buffer per line), so a read
        holding many events costs one pass over its bytes.
        """
        if len(self.head) < HEAD_BYTES:
            self.head += chunk[: HEAD_BYTES - len(self.head)]
        if self._skip_lf:
            self._skip_lf = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:  # CRLF or a bare CR ends a line, as LF does
            self._skip_lf = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = lines.pop()  # the unfinished last line (b"" after a line end)
        events: list[str] = []
        data = self._data
        for raw in lines:
            if not raw:
                if data:
                    text = "\n".join(data)
                    events.append(ErrorEvent(text) if self._error else text)
                    data = self._data = []
                self._error = False
                continue
            if raw.startswith(b"data:"):
                value = raw[6:] if raw.startswith(b"data: ") else raw[5:]
                data.append(value.decode("utf-8", errors="replace"))
            elif raw == b"data":
                data.append("")
            elif raw.startswith(b"event:"):
                self._error = raw[6:].strip() == b"error"
            # comments (":...") and other fields are ignored
        self.events += len(events)
        return events

    def flush(self) -> list[str]:
        """End of stream: return a last event not followed by a blank line, if any."""
        events = self.feed(b"\n\n") if self._buf else []
        if self._data:
            text = "\n".join(self._data)
            events.append(ErrorEvent(text) if self._error else text)
            self.events += 1
            self._data = []
        return events


@dataclass(frozen=True)
class RequestInput:
    """One request to send. Lengths in tokens; ``prompt_len`` is the dataset's count.

    ``temperature`` None sends no temperature (the server's default, as vLLM's client does);
    ``extra_body`` is merged into the JSON body last (it may override any field).
    """

    api_url: str  # full URL, e.g. http://127.0.0.1:8000/v1/chat/completions
    model: str
    prompt: str
    prompt_len: int
    output_len: int
    ignore_eos: bool = True
    api_key: str | None = None
    temperature: float | None = None
    extra_body: dict[str, Any] | None = None
    request_id: str | None = None  # sent as the X-Request-Id header (vLLM's --request-id-prefix + index)
    # vLLM's --header pairs: they replace Content-Type or Authorization, X-Request-Id replaces them
    headers: tuple[tuple[str, str], ...] = ()


def build_payload(req: RequestInput) -> dict[str, Any]:
    """The JSON body, as vLLM's client builds it: streaming with usage; chat sends
    ``messages`` and ``max_completion_tokens``, completions ``prompt``, ``max_tokens`` and
    ``repetition_penalty`` 1.0 (so a model's default penalty from its ``generation_config.json``
    does not apply there, as under vLLM's client; ``--extra-body`` may set another)."""
    body: dict[str, Any] = {"model": req.model}
    if is_chat_route(req.api_url):
        body["messages"] = [{"role": "user", "content": req.prompt}]
        body["max_completion_tokens"] = req.output_len
    else:
        body["prompt"] = req.prompt
        body["repetition_penalty"] = 1.0
        body["max_tokens"] = req.output_len
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.ignore_eos:
        body["ignore_eos"] = True
    if req.extra_body:
        body.update(req.extra_body)
    return body


_decode_json = msgspec.json.decode


def parse_event(ev: str) -> Any:
    """The JSON value of an event's data (msgspec; Python's ``json`` for what msgspec refuses,
    such as ``NaN``). Raises ``ValueError`` for data that is not JSON."""
    try:
        return _decode_json(ev)
    except msgspec.DecodeError:
        return json.loads(ev)
    except TypeError:  # a str subclass (ErrorEvent), which msgspec does not take
        return parse_event(str(ev))


def _error_message(data: Any) -> str | None:
    """The message of an OpenAI/vLLM error object, or None when ``data`` is not one."""
    if not isinstance(data, dict):
        return "malformed chunk (not a JSON object)"
    err = data.get("error")
    if err is not None:
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    if data.get("object") == "error":
        return str(data.get("message") or data)
    return None


_OUTPUT_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls")


def counts_as_output(choice: Any, chat: bool) -> bool:
    """Does this choice carry output (and so count for TTFT, ITL and E2EL)?

    vLLM 0.26's client counts every chat chunk with ``choices`` (the role-only one gives its TTFT,
    the first token then a near-zero ITL gap); this rule leaves out the chunks without output, so
    that TTFT ends at the first token whenever the server sends the role chunk (docs/benchmarking.md).

    Completions: every choice counts (its text may be empty, e.g. a special token). Chat: the
    delta must carry non-empty ``content``, ``reasoning_content``, ``reasoning`` or
    ``tool_calls``, or an empty ``content`` string without a ``role`` (a token whose text is
    empty). A leading ``{"role": "assistant", "content": ""}`` chunk and a ``delta: {}``
    finish-only chunk do not count.
    """
    if not chat:
        return True
    delta = choice.get("delta") if isinstance(choice, dict) else None
    if not isinstance(delta, dict):
        return False
    content = delta.get("content")
    if content:  # the common case first: one dict lookup per event
        return True
    for k in _OUTPUT_FIELDS[1:]:
        if delta.get(k):
            return True
    return content == "" and "role" not in delta


def _error_event_text(ev: str) -> str:
    """The reason of an ``event: error`` whose data is no error object: ``(event: error)`` and the
    data's first 300 characters on one line."""
    text = ev.strip()[:300].replace("\r", " ").replace("\n", " ")
    return f"(event: error) {text}" if text else "(event: error) with empty data"


def _answer_text(body: bytes, reason: str | None) -> str:
    """A non-stream answer for an error string: the message of an error object, else the body's
    first 300 characters on one line (undecodable bytes replaced), or ``reason`` (the HTTP reason
    phrase) and ``(empty body)`` when there is none."""
    text = body.decode("utf-8", errors="replace").strip()
    if not text:
        return f"{reason or ''} (empty body)".lstrip()
    try:
        msg = _error_message(parse_event(text))
    except (ValueError, RecursionError):
        msg = None
    if msg is None or msg.startswith("malformed chunk"):
        msg = text
    return msg[:300].replace("\r", " ").replace("\n", " ")


def _choices_problem(choices: Any) -> str:
    """Why a chunk's non-empty ``choices`` is not the one choice (index 0) a request of ``n`` = 1
    streams: several choices, another index, or not a list of objects."""
    if type(choices) is not list:
        return f"choices is not a list: {str(choices)[:100]!r}"
    if len(choices) > 1:
        return f"{len(choices)} choices in one chunk (the benchmark asks one choice per request)"
    if type(choices[0]) is not dict:
        return f"a choice is not an object: {str(choices[0])[:100]!r}"
    return f"choice index {choices[0].get('index')!r} (the benchmark asks one choice per request)"


def _read_usage(usage: Any, out: RequestResult) -> str | None:
    """Take a usage object's token counts into ``out`` (``completion_tokens`` as ``output_len``,
    ``prompt_tokens`` as ``prompt_len``); a count that is not a non-negative integer is not taken,
    and the reason is returned (None when all is well)."""
    if type(usage) is not dict:
        return f"usage is not an object: {str(usage)[:100]!r}"
    counts = {}
    for key in ("completion_tokens", "prompt_tokens"):
        value = usage.get(key)
        if value is not None and (type(value) is not int or value < 0):
            return f"usage.{key} {value!r} is not a token count"
        counts[key] = value
    if counts["completion_tokens"] is not None:
        out.output_len = counts["completion_tokens"]
    if counts["prompt_tokens"] is not None:
        out.prompt_len = counts["prompt_tokens"]
    return None


def _chunk_text(choice: dict[str, Any]) -> str:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return str(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or "")
    return str(choice.get("text") or "")


DRAIN_AFTER_DONE_S = 1.0
"""How long a request waits, after ``data: [DONE]``, for the end of the body (seconds)."""


async def _drain(content: aiohttp.StreamReader) -> None:
    """Read what follows ``data: [DONE]`` up to the body's end, which a sound server sends at once
    (the chunked encoding's last chunk), so that aiohttp hands the connection back to the pool
    instead of closing it: the next request then starts on it, as under vLLM's client (which reads
    every stream to its end), without a TCP connect inside its TTFT. A body that has not ended
    within :data:`DRAIN_AFTER_DONE_S`, or a connection lost meanwhile, only costs that connection:
    the request has its answer."""
    try:
        async with asyncio.timeout(DRAIN_AFTER_DONE_S):
            while await content.readany():
                pass
    except (TimeoutError, aiohttp.ClientError, OSError):
        pass


async def send_request(session: aiohttp.ClientSession, req: RequestInput) -> RequestResult:
    """Send one streaming request and time it (TTFT, ITL per chunk, E2EL; seconds, perf_counter).

    Only chunks that carry output count (:func:`counts_as_output`): the first one
    gives TTFT, each later one an ITL gap, the last one E2EL. Never raises for server or network
    trouble: any such problem gives ``success=False`` with the reason in ``error`` (HTTP status and
    body, exception, error object in the stream, a malformed chunk (not JSON; choices other than one
    of index 0; a usage count that is not a non-negative integer), no ``[DONE]`` at its end, or no
    content).
    """
    out = RequestResult(prompt_len=req.prompt_len, expected_output_len=req.output_len)
    headers = request_headers(req.api_key, req.headers, "application/json")
    if req.request_id is not None:  # vLLM's order: the request id over a --header of that name
        headers = request_headers(None, [*headers.items(), ("X-Request-Id", req.request_id)])
    payload = build_payload(req)
    chat = is_chat_route(req.api_url)
    st = time.perf_counter()
    out.start_time = st
    last_ts = st
    text_parts: list[str] = []
    got_choice = False
    streaming = False
    try:
        async with session.post(req.api_url, json=payload, headers=headers) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {_answer_text(await resp.read(), resp.reason)}"
                return out
            if resp.content_type == "application/json":  # a whole answer: no stream to time
                text = _answer_text(await resp.read(), None)
                out.error = f"the server answered application/json, not an event stream: {text}"
                return out
            parser = SSEParser()
            done = False
            streaming = True  # a ClientPayloadError from here on is the event stream cut off
            async for piece in resp.content.iter_any():
                events = parser.feed(piece)
                ts = time.perf_counter()
                for ev in events:
                    if ev.strip() == "[DONE]":
                        done = True
                        break
                    try:
                        data = parse_event(ev)
                    except ValueError:
                        if type(ev) is ErrorEvent:
                            out.error = f"error in stream: {_error_event_text(ev)}"
                        else:
                            out.error = f"malformed SSE data: {ev[:200]!r}"
                        return out
                    msg = _error_message(data)
                    if type(ev) is ErrorEvent and (msg is None or type(data) is not dict):
                        msg = _error_event_text(ev)
                    if msg is not None:
                        out.error = f"error in stream: {msg}"
                        return out
                    choices = data.get("choices")
                    if choices:
                        choice = choices[0] if type(choices) is list and len(choices) == 1 else None
                        if type(choice) is not dict or choice.get("index", 0) != 0:
                            out.error = f"malformed chunk: {_choices_problem(choices)}"
                            return out
                        if counts_as_output(choice, chat):
                            if not got_choice:
                                out.ttft = ts - st
                                got_choice = True
                            else:
                                out.itl.append(ts - last_ts)
                            last_ts = ts
                            text_parts.append(_chunk_text(choice))
                    usage = data.get("usage")
                    if usage is not None:
                        problem = _read_usage(usage, out)
                        if problem:
                            out.error = f"malformed chunk: {problem}"
                            return out
                if done:
                    break
            if not done:
                for ev in parser.flush():  # the stream's end may close its last event
                    if ev.strip() == "[DONE]":
                        done = True
                        break
                    try:
                        data = parse_event(ev)
                        msg = _error_message(data)
                    except ValueError:
                        data, msg = None, f"malformed SSE data: {ev[:200]!r}"
                    if type(ev) is ErrorEvent and (msg is None or type(data) is not dict):
                        msg = _error_event_text(ev)
                    if msg is not None:
                        out.error = f"error in stream: {msg}"
                        return out
            if not done:  # the server stopped or the connection dropped mid-answer
                out.error = f"the stream ended without data: [DONE] after {len(text_parts)} output chunk(s)"
                if parser.events == 0 and parser.head.strip():  # not an event stream at all
                    out.error += f"; its body has no data: line: {_answer_text(parser.head, None)}"
                return out
            if not resp.content.at_eof():
                await _drain(resp.content)
    except TimeoutError:
        total = getattr(getattr(session, "timeout", None), "total", None)
        out.error = "the request timed out" + (f" (--request-timeout {total:g} s)" if total else "")
        return out
    except aiohttp.ClientPayloadError as e:
        if not streaming:  # an error answer's or a JSON answer's body cut, or a corrupt encoding
            out.error = f"{type(e).__name__}: {e}".strip()
            return out
        # the body's chunked encoding was cut mid-answer; aiohttp's own text reads like an HTTP
        # 400 ("TransferEncodingError: 400, message='Not enough data ...'"), which it is not
        out.error = (
            f"the stream was cut off before data: [DONE] after {len(text_parts)} output chunk(s) "
            f"(the server stopped or the connection dropped; aiohttp's {type(e).__name__})"
        )
        return out
    except Exception as e:  # network trouble of any kind is a failed request, not a crash
        out.error = f"{type(e).__name__}: {e}".strip()
        return out
    out.generated_text = "".join(text_parts)
    if not got_choice:
        out.error = "no content chunk received"
        return out
    out.latency = last_ts - st
    out.success = True
    return out
