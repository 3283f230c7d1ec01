"""The benchmark client against a server that misbehaves (:mod:`hostile_server`): every broken answer
is a failed request with a readable reason, every sound one a success with the right counts, and the
run still finishes, writes its result and exits 1."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import bench_main
from fake_server import prompt_tokens
from hostile_server import (
    Behaviour,
    HostileServer,
    Piece,
    event,
    ok,
    response,
    stream,
    token,
    tokens,
    usage,
)

from surge.bench import client
from surge.bench.client import RequestInput, send_request
from surge.bench.metrics import RequestResult, compute_metrics
from surge.bench.serve import validate_results

N = 3  # output tokens every request asks


def _send(behaviour: Behaviour, chat: bool, timeout_s: float = 30.0) -> RequestResult:
    async def go(url: str) -> RequestResult:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            endpoint = "/v1/chat/completions" if chat else "/v1/completions"
            return await send_request(session, RequestInput(url + endpoint, "fake-model", "w1 w2", 3, N))

    with HostileServer([behaviour]) as s:
        return asyncio.run(go(s.url))


def _body(events: list[bytes]) -> Behaviour:
    return lambda chat, body: stream(events)


def _split(pieces: list[bytes], size: int) -> list[bytes]:
    data = b"".join(pieces)
    return [data[i : i + size] for i in range(0, len(data), size)]


def _role(chat: bool) -> bytes:
    return event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})


# behaviours that must give a success of N tokens with N - 1 ITL gaps
SOUND: dict[str, Behaviour] = {
    "ok": ok,
    "data lines split across TCP writes": lambda chat, body: stream(
        _split([*tokens(chat, N), event(usage(N)), event("[DONE]")], 7)
    ),
    "CRLF line ends": lambda chat, body: stream(
        [e.replace(b"\n", b"\r\n") for e in (*tokens(chat, N), event(usage(N)), event("[DONE]"))]
    ),
    "comments and other fields": lambda chat, body: stream(
        [b": keep-alive\n\n", b"event: message\nid: 1\nretry: 5\n" + tokens(chat, 1)[0], b": ping\n"]
        + tokens(chat, N)[1:]
        + [event(usage(N)), b"event: done\n" + event("[DONE]")]
    ),
    "empty choices chunks": lambda chat, body: stream(
        [event({"choices": []}), *tokens(chat, N), event({"choices": []}), event(usage(N)), event("[DONE]")]
    ),
    # WHATWG SSE: a bare CR ends a line too (also split from a following LF across TCP writes)
    "bare CR line ends": lambda chat, body: stream(
        [e.replace(b"\n", b"\r") for e in (*tokens(chat, N), event(usage(N)), event("[DONE]"))]
    ),
    "CRLF line ends split between CR and LF": lambda chat, body: stream(
        _split([e.replace(b"\n", b"\r\n") for e in (*tokens(chat, N), event(usage(N)), event("[DONE]"))], 5)
    ),
    "usage in the last token's chunk": lambda chat, body: stream(
        [*tokens(chat, N - 1), event({**token(chat, " w9"), "usage": usage(N)["usage"]}), event("[DONE]")]
    ),
}


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("name", list(SOUND))
def test_sound_streams_are_counted(name: str, chat: bool) -> None:
    r = _send(SOUND[name], chat)
    assert r.success and r.error == "", r.error
    assert r.output_len == N and len(r.itl) == N - 1 and r.ttft > 0


def test_a_leading_role_chunk_does_not_count() -> None:
    r = _send(
        lambda chat, body: stream([_role(chat), *tokens(chat, N), event(usage(N)), event("[DONE]")]), True
    )
    assert r.success and r.output_len == N and len(r.itl) == N - 1


def test_a_stream_without_usage_is_counted_from_its_text() -> None:
    r = _send(_body([*tokens(True, N), event("[DONE]")]), True)
    assert r.success and r.output_len is None and r.generated_text == " w100 w101 w102"


def test_a_wrong_completion_tokens_fails_the_exact_length_check() -> None:
    r = _send(_body([*tokens(True, N), event(usage(N + 4)), event("[DONE]")]), True)
    assert r.success and r.output_len == N + 4  # the client takes the server's count ...
    validate_results([r], None, exact_length=True)  # ... the length check refuses it
    assert not r.success and r.error == f"completion_tokens {N + 4} != requested {N}"


def _no_answer(chat: bool, body: dict[str, Any]) -> list[Piece]:
    return []


# behaviours that must fail the request, with a piece of the reason
BROKEN: dict[str, tuple[Behaviour, str]] = {
    "HTTP 400 with an OpenAI error": (
        lambda chat, body: response(
            400,
            json.dumps(
                {"error": {"message": "bad max_tokens", "type": "BadRequestError", "code": 400}}
            ).encode(),
        ),
        "HTTP 400: bad max_tokens",
    ),
    "HTTP 500 with a text body": (
        lambda chat, body: response(500, b"<html>Internal\nServer Error</html>", "text/html"),
        "HTTP 500: <html>Internal Server Error</html>",
    ),
    "HTTP 500 with bytes that are not UTF-8": (
        lambda chat, body: response(500, b"\xff\xfeboom", "text/plain"),
        "HTTP 500: \ufffd\ufffdboom",
    ),
    "HTTP 503 with an empty body": (
        lambda chat, body: response(503, b"", reason="Service Unavailable"),
        "HTTP 503: Service Unavailable (empty body)",
    ),
    "an error object as a 200 JSON answer": (
        lambda chat, body: response(200, json.dumps({"object": "error", "message": "overloaded"}).encode()),
        "the server answered application/json, not an event stream: overloaded",
    ),
    "a whole completion as a 200 JSON answer": (
        lambda chat, body: response(200, json.dumps({"choices": [], "usage": usage(N)["usage"]}).encode()),
        'the server answered application/json, not an event stream: {"choices": [], "usage": {',
    ),
    "a stream cut inside an HTTP chunk": (
        lambda chat, body: stream([*tokens(chat, 2)], end=False),
        # not aiohttp's "TransferEncodingError: 400, message=...", which reads like an HTTP 400
        "the stream was cut off before data: [DONE] after 2 output chunk(s) (the server stopped or "
        "the connection dropped; aiohttp's ClientPayloadError)",
    ),
    # cut before any event stream began: aiohttp's own reason, not "the stream was cut off"
    "an HTTP 500 whose body is cut short": (
        lambda chat, body: [
            b"HTTP/1.1 500 X\r\nContent-Type: text/plain\r\nContent-Length: 100\r\nConnection: close\r\n\r\nshort"
        ],
        "ClientPayloadError: Response payload is not completed",
    ),
    "an error event": (
        lambda chat, body: stream(
            [*tokens(chat, 1), event({"error": {"message": "boom", "code": 500}}), event("[DONE]")]
        ),
        "error in stream: boom",
    ),
    "an error event without an error object": (
        lambda chat, body: stream(
            [*tokens(chat, 1), b'event: error\ndata: {"message": "overloaded", "code": 503}\n\n']
            + [event("[DONE]")]
        ),
        'error in stream: (event: error) {"message": "overloaded", "code": 503}',
    ),
    "an error event whose data is text": (
        lambda chat, body: stream(
            [*tokens(chat, 1), b"event: error\ndata: upstream gone\n\n", event("[DONE]")]
        ),
        "error in stream: (event: error) upstream gone",
    ),
    "an error event at the end without its blank line": (
        lambda chat, body: stream([*tokens(chat, N), b"event: error\ndata: null"]),
        "error in stream: (event: error) null",
    ),
    "an event stream without data lines": (
        lambda chat, body: response(200, b"<html>maintenance\nwindow</html>", "text/event-stream"),
        "after 0 output chunk(s); its body has no data: line: <html>maintenance window</html>",
    ),
    "a chunk that is not JSON": (
        lambda chat, body: stream([*tokens(chat, 1), b"data: hello\n\n", event("[DONE]")]),
        "malformed SSE data: 'hello'",
    ),
    "no output chunk": (
        lambda chat, body: stream([_role(chat)] * chat + [event(usage(0)), event("[DONE]")]),
        "no content chunk received",
    ),
    "a negative completion_tokens": (
        lambda chat, body: stream([*tokens(chat, N), event(usage(-N)), event("[DONE]")]),
        f"malformed chunk: usage.completion_tokens {-N} is not a token count",
    ),
    "a fractional completion_tokens": (
        lambda chat, body: stream([*tokens(chat, N), event(usage(N + 0.5)), event("[DONE]")]),
        f"malformed chunk: usage.completion_tokens {N + 0.5} is not a token count",
    ),
    "a text completion_tokens": (
        lambda chat, body: stream([*tokens(chat, N), event(usage("three")), event("[DONE]")]),
        "malformed chunk: usage.completion_tokens 'three' is not a token count",
    ),
    "a list prompt_tokens": (
        lambda chat, body: stream([*tokens(chat, N), event(usage(N, [5])), event("[DONE]")]),
        "malformed chunk: usage.prompt_tokens [5] is not a token count",
    ),
    "a usage that is not an object": (
        lambda chat, body: stream([*tokens(chat, N), event({"choices": [], "usage": N}), event("[DONE]")]),
        "malformed chunk: usage is not an object: '3'",
    ),
    "two choices in one chunk": (
        lambda chat, body: stream(
            [event({"choices": [token(chat, " w1")["choices"][0], token(chat, " w1", 1)["choices"][0]]})]
            + [event(usage(N)), event("[DONE]")]
        ),
        "malformed chunk: 2 choices in one chunk (the benchmark asks one choice per request)",
    ),
    "a chunk of choice index 1": (
        lambda chat, body: stream(
            [event(token(chat, " w1")), event(token(chat, " w1", 1)), *tokens(chat, N - 1)]
            + [event(usage(N)), event("[DONE]")]
        ),
        "malformed chunk: choice index 1 (the benchmark asks one choice per request)",
    ),
    "a null choice": (
        lambda chat, body: stream(
            [*tokens(chat, N), event({"choices": [None]}), event(usage(N)), event("[DONE]")]
        ),
        "malformed chunk: a choice is not an object: 'None'",
    ),
    "choices that are not a list": (
        lambda chat, body: stream(
            [event({"choices": {"0": token(chat, " w1")}}), event(usage(N)), event("[DONE]")]
        ),
        "malformed chunk: choices is not a list: ",
    ),
    "an empty 200 stream": (
        lambda chat, body: response(200, b"", "text/event-stream"),
        "the stream ended without data: [DONE] after 0 output chunk(s)",
    ),
    # aiohttp raises nothing for these two: the body ended where HTTP says it may
    "a close-delimited stream cut before [DONE]": (
        lambda chat, body: stream([*tokens(chat, N), event(usage(N))], chunked=False),
        f"the stream ended without data: [DONE] after {N} output chunk(s)",
    ),
    "a chunked stream ended before [DONE]": (
        lambda chat, body: stream([*tokens(chat, 2)]),
        "the stream ended without data: [DONE] after 2 output chunk(s)",
    ),
    "a last event without its blank line and no [DONE]": (
        lambda chat, body: stream([*tokens(chat, N), b"data: " + json.dumps(usage(N)).encode()]),
        f"the stream ended without data: [DONE] after {N} output chunk(s)",
    ),
    "closed without an answer": (_no_answer, "ServerDisconnectedError"),
    "not HTTP": (lambda chat, body: [b"NOT HTTP\r\n\r\n"], "ClientResponseError: 400, message="),
}


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_answers_fail_with_a_reason(name: str, chat: bool) -> None:
    behaviour, reason = BROKEN[name]
    r = _send(behaviour, chat)
    assert not r.success and reason in r.error, r.error


def test_an_answer_that_never_starts_times_out() -> None:
    r = _send(lambda chat, body: [3.0], True, timeout_s=0.5)
    assert not r.success and r.error == "the request timed out (--request-timeout 0.5 s)"


def test_failed_requests_give_no_latency() -> None:
    """A request cut after its first tokens has a TTFT and a gap; neither reaches the aggregates."""
    cut = _send(BROKEN["an error event"][0], True)
    assert not cut.success and cut.ttft > 0
    good = _send(ok, True)
    good.ttft, good.itl, good.latency = 0.5, [0.1, 0.1], 0.7
    cut.ttft, cut.itl = 9.0, [9.0]
    m = compute_metrics([good, cut], 1.0, (50.0,))
    assert (m.completed, m.failed) == (1, 1) and m.output_lens == [N, 0]
    assert m.latency_stats["mean_ttft_ms"] == pytest.approx(500.0)
    assert m.latency_stats["mean_itl_ms"] == pytest.approx(100.0)


def _run(script: list[Behaviour], tmp_path: Path, *flags: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "r.json"
    with HostileServer(script) as s:
        flags = ("--output-len", str(N), "--num-prompts", str(len(script)), *flags)
        rc = bench_main(
            ["bench", "serve", "--base-url", s.url, "--disable-tqdm", "--input-len", "8", *flags]
            + ["--max-concurrency", "1", "--warmup", "0", "--result-file", str(out)]
        )
    return rc, json.loads(out.read_text())


def test_a_cut_stream_fails_the_run_without_the_length_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --ignore-eos there is no exact-length check: a stream cut short (here close-delimited,
    which aiohttp reads to its end without complaint) must still fail, not count its 2 tokens."""
    cut: Behaviour = lambda chat, body: stream(tokens(chat, 2), chunked=False)  # noqa: E731
    rc, r = _run([ok, cut, ok], tmp_path, "--no-ignore-eos")
    assert rc == 1 and (r["completed"], r["failed"]) == (2, 1)
    assert r["errors"] == ["", "the stream ended without data: [DONE] after 2 output chunk(s)", ""]
    assert r["output_lens"] == [N, 0, N] and r["total_output_tokens"] == 2 * N
    assert "1 failed request(s)" in capsys.readouterr().out


def test_extra_body_n_is_refused_before_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    """A stream of n choices fails every request (above): say so at once, in one line."""
    with HostileServer([]) as s:
        rc = bench_main(["bench", "serve", "--base-url", s.url, "--extra-body", '{"n": 2}'])
        assert s.seen == 0
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert (
        err
        == "surge: error: --extra-body sets 'n' to 2: the benchmark times one choice per request (give no n)\n"
    )


def _fake_tokenize(body: dict[str, Any]) -> dict[str, Any]:
    toks = prompt_tokens(body, "messages" in body)
    return {"tokens": toks, "count": len(toks), "max_model_len": 4096}


# answers before the run that must stop it in one line naming what is wrong (not a traceback)
BAD_SETUP: dict[str, tuple[dict[str, Any], str]] = {
    "model names instead of objects": (
        {"models": {"data": ["m"]}},
        '/v1/models answered no list of models with ids: {"data": ["m"]}',
    ),
    "a model object instead of a list": (
        {"models": {"data": {"id": "m"}}},
        '/v1/models answered no list of models with ids: {"data": {"id": "m"}}',
    ),
    "a max_model_len in words": (
        {"models": {"data": [{"id": "m", "max_model_len": "big"}]}},
        'the server\'s /v1/models gives a max_model_len that is not a token count: "big"',
    ),
    "null token ids": (
        {"tokenize": lambda body: {"tokens": [None, *_fake_tokenize(body)["tokens"]]}},
        'the server\'s /tokenize answered no list of token ids: {"tokens": [null, ',
    ),
    "a max_model_len of /tokenize in words": (
        {"tokenize": lambda body: {**_fake_tokenize(body), "max_model_len": "x"}},
        'the server\'s /tokenize gives a max_model_len that is not a token count: "x"',
    ),
}


@pytest.mark.parametrize("name", list(BAD_SETUP))
def test_a_bad_answer_before_the_run_is_one_line(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    server_args, reason = BAD_SETUP[name]
    with HostileServer([], **server_args) as s:
        rc = bench_main(["bench", "serve", "--base-url", s.url, "--num-prompts", "1", "--input-len", "8"])
        assert s.seen == 0
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and reason in err, err


def test_a_failed_warm_up_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """aiohttp's message for a bad status line spans several lines: the error stays one."""
    with HostileServer([lambda chat, body: [b"NOT HTTP\r\n\r\n"]]) as s:
        rc = bench_main(
            [
                "bench",
                "serve",
                "--base-url",
                s.url,
                "--disable-tqdm",
                "--num-prompts",
                "1",
                "--input-len",
                "8",
            ]
        )
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("surge: error: warm-up request failed: ClientResponseError: 400")
    assert err.count("\n") == 1, err


def _done_then(after: list[Piece], end: bool = True) -> Behaviour:
    """A sound kept-alive stream up to ``[DONE]``, then ``after`` before the body's end."""

    def behaviour(chat: bool, body: dict[str, Any]) -> list[Piece]:
        pieces = stream([*tokens(chat, N), event(usage(N)), event("[DONE]")], keep_alive=True)
        return [*pieces[:-1], *after, *pieces[-1:]] if end else [*pieces[:-1], *after]

    return behaviour


def _send_many(server: HostileServer, n: int) -> list[RequestResult]:
    async def go() -> list[RequestResult]:
        connector = aiohttp.TCPConnector(limit=1)  # as make_session's, with --max-concurrency 1
        async with aiohttp.ClientSession(connector=connector) as session:
            req = RequestInput(server.url + "/v1/completions", "fake-model", "w1 w2", 3, N)
            return [await send_request(session, req) for _ in range(n)]

    return asyncio.run(go())


def test_the_connection_is_kept_when_the_body_ends_after_done() -> None:
    """Surge's server often sends the chunked body's end in a read after [DONE]: leaving then made
    aiohttp close the connection, and the next request paid a TCP connect inside its TTFT
    (vLLM's client reads every body to its end and keeps one connection)."""
    with HostileServer([], default=_done_then([0.03])) as s:
        results = _send_many(s, 3)
        assert s.connections == 1
    assert all(r.success for r in results), [r.error for r in results]


def test_what_follows_done_never_fails_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """After [DONE] the answer is whole: more data, a body that never ends, or a dropped
    connection cost at most the connection (and DRAIN_AFTER_DONE_S of waiting)."""
    monkeypatch.setattr(client, "DRAIN_AFTER_DONE_S", 0.2)
    chunk = event(token(False, " w9"))
    for behaviour in (
        _done_then([b"%x\r\n%s\r\n" % (len(chunk), chunk)]),  # an event after [DONE]
        _done_then([5.0], end=False),  # no end of the body
        _done_then([], end=False),  # the connection drops before the body's end
    ):
        with HostileServer([], default=behaviour) as s:
            results = _send_many(s, 2)
        assert all(r.success and r.output_len == N for r in results), [r.error for r in results]
