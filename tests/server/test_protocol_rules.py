"""Protocol details (issue 16): 405 with Allow, an OpenAPI schema that tells the truth, strict
types instead of coercions, finite bounds on every numeric field, bounded stop lists."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from fastapi.testclient import TestClient

from surge.server.api_server import build_app
from surge.server.drain import InFlight
from surge.server.serving_common import ServerState
from tests.server.conftest import Server

CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
NUMERIC_FIELDS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "min_tokens",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


def test_405_names_the_allowed_methods(server: Server) -> None:
    r = httpx.get(server.url + CMPL)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["code"] == 405
    r = httpx.post(server.url + "/health")
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"GET", "HEAD"}


def test_openapi_documents_what_the_server_does(server: Server) -> None:
    schema = httpx.get(server.url + "/openapi.json").json()
    text = json.dumps(schema)
    assert '"422"' not in text and "HTTPValidationError" not in text
    ids = [op["operationId"] for ops in schema["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)), "operation ids are unique"
    for path in (CMPL, CHAT):
        responses = schema["paths"][path]["post"]["responses"]
        assert {"200", "400", "401", "404", "408", "413", "415", "500", "503"} <= set(responses)
        assert "text/event-stream" in responses["200"]["content"]
    assert "503" in schema["paths"]["/health"]["get"]["responses"]
    assert "404" in schema["paths"]["/v1/models/{model}"]["get"]["responses"]
    props = schema["components"]["schemas"]["CompletionRequest"]["properties"]
    temperature = next(s for s in props["temperature"]["anyOf"] if s.get("type") == "number")
    assert temperature["maximum"] == 2.0, "real constraints are in the schema"
    # null is accepted for the fields OpenAI declares nullable ("not set"), and the schema says so
    for name in ("n", "echo", "stream", "seed"):
        assert {"type": "null"} in props[name]["anyOf"], name
    n = next(s for s in props["n"]["anyOf"] if s.get("type") == "integer")
    assert (n["minimum"], n["maximum"]) == (1, 128)
    chat = schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"type": "null"} in chat["n"]["anyOf"] and chat["echo"]["type"] == "boolean"


def test_openapi_builds_without_warnings() -> None:
    """/health and /metrics answer GET and HEAD; the schema gives each method its own operation
    id, so building it (the first /openapi.json or /docs) warns of no duplicate operation id."""
    state = SimpleNamespace(  # building the schema never touches the engine (no lifespan here)
        client=SimpleNamespace(is_ready=True),
        api_keys=(),
        in_flight=InFlight(),
        metrics_require_key=False,
        max_request_body_bytes=1 << 20,
        body_read_timeout=10.0,
    )
    client = TestClient(build_app(cast(ServerState, state), web_ui=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        schema = client.get("/openapi.json").json()
    assert client.get("/docs").status_code == 200
    for path in ("/health", "/metrics"):
        ops = schema["paths"][path]
        assert set(ops) == {"get", "head"}, path
        name = path.strip("/")
        assert [ops[m]["operationId"] for m in ("get", "head")] == [
            f"{name}_{name}_get",
            f"{name}_{name}_head",
        ]
    # /metrics answers Prometheus text (the schema said application/json)
    assert set(schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    # /reset_prefix_cache's query parameters and the 400 a bad one gets, and its 503 (engine down)
    reset = schema["paths"]["/reset_prefix_cache"]["post"]
    assert {p["name"] for p in reset["parameters"]} == {"reset_running_requests", "reset_external"}
    assert {"200", "400", "401", "503"} <= set(reset["responses"]), reset["responses"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CMPL, {"prompt": "x", "echo": 0}, "echo"),
        (CMPL, {"prompt": "x", "stream": 1}, "stream"),
        (CMPL, {"prompt": "x", "max_tokens": 4.5}, "max_tokens"),
        (CMPL, {"prompt": "x", "max_tokens": "4"}, "max_tokens"),
        (CMPL, {"prompt": "x", "n": True}, "n"),
        (CMPL, {"prompt": [False, True]}, "prompt"),
        (CMPL, {"prompt": "x", "temperature": "0.5"}, "temperature"),
        ("/detokenize", {"tokens": [False]}, "tokens"),
        (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages"),
    ],
)
def test_no_coercion_between_json_types(server: Server, path: str, body: dict[str, Any], param: str) -> None:
    r = httpx.post(server.url + path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param


def test_integers_are_numbers(server: Server) -> None:
    r = httpx.post(server.url + CMPL, json={"prompt": "x", "max_tokens": 2, "temperature": 0, "top_p": 1})
    assert r.status_code == 200, r.text


def test_counts_take_numbers_equal_to_integers(server: Server) -> None:
    """A count, limit or seed given as ``16.0`` (a client computing it in floating point) is
    the integer, as vLLM's lax models read it; it was a 400."""
    body = {"prompt": "x", "max_tokens": 3.0, "n": 2.0, "seed": 7.0, "min_tokens": 3.0, "logprobs": 1.0}
    r = httpx.post(server.url + CMPL, json=body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 2 and r.json()["usage"]["completion_tokens"] == 6, r.text
    assert all(len(c["logprobs"]["top_logprobs"]) == 3 for c in choices), r.text  # one per token
    chat = {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 2.0, "top_logprobs": 2.0}
    r = httpx.post(server.url + CHAT, json=chat | {"logprobs": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2
    assert len(r.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2
    r = httpx.post(server.url + "/v1/responses", json={"input": "x", "max_output_tokens": 2.0})
    assert r.status_code == 200, r.text
    r = httpx.post(server.url + "/v1/messages", json={"messages": chat["messages"], "max_tokens": 2.0})
    assert r.status_code == 200, r.text
    thinking = {"type": "enabled", "budget_tokens": 1024.0}
    body = {"messages": chat["messages"], "max_tokens": 2, "thinking": thinking}
    r = httpx.post(server.url + "/v1/messages", json=body)
    assert r.status_code == 200, r.text
    thinking["budget_tokens"] = 1024.5
    r = httpx.post(server.url + "/v1/messages", json=body)
    assert r.status_code == 400 and "thinking.budget_tokens" in r.text, r.text


@pytest.mark.parametrize("field", NUMERIC_FIELDS)
@pytest.mark.parametrize("path", [CMPL, CHAT])
def test_huge_numbers_are_refused(server: Server, path: str, field: str) -> None:
    body: dict[str, Any] = {"max_tokens": 4, field: 2**70}
    body |= {"prompt": "x"} if path == CMPL else {"messages": [{"role": "user", "content": "x"}]}
    r = httpx.post(server.url + path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": [2**70], "max_tokens": 2}, "prompt"),
        ({"prompt": "x", "stop_token_ids": [2**70]}, "stop_token_ids"),
        ({"prompt": "x", "temperature": 101.0}, "temperature"),
        ({"prompt": "x", "temperature": 2.01}, "temperature"),  # OpenAI's and vLLM 0.26's bound: [0, 2]
        ({"prompt": "x", "repetition_penalty": 101.0}, "repetition_penalty"),
        ({"prompt": "x", "stop": [f"s{i}" for i in range(65)]}, "stop"),
        ({"prompt": "x", "stop": ["y" * 257]}, "stop"),
    ],
)
def test_bounds(server: Server, body: dict[str, Any], param: str) -> None:
    r = httpx.post(server.url + CMPL, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_bounded_stop_list_still_works(server: Server) -> None:
    stops = [f"zz{i:03d}" for i in range(63)] + [" "]
    r = httpx.post(server.url + CMPL, json={"prompt": "Once upon", "max_tokens": 20, "stop": stops})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        (CMPL, b'{"prompt": "\\ud800"}', "prompt"),
        (CMPL, b'{"prompt": "x", "stop": ["a\\udc00"]}', "stop"),
        (CMPL, b'{"prompt": "x", "model": "\\udfff"}', "model"),
        (CMPL, b'{"prompt": "\xed\xa0\x80"}', "prompt"),
        (CHAT, b'{"messages": [{"role": "\\ud800", "content": "x"}]}', "messages"),
        (
            CHAT,
            b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
            "messages",
        ),
        ("/tokenize", b'{"prompt": "\\ud800"}', "prompt"),
        ("/detokenize", b'{"tokens": [1], "model": "\\ud800"}', "model"),
        # in a field's name: the name written out (was "body", which named no field)
        (CMPL, b'{"prompt": "x", "a\\udc00b": 1}', "a\\udc00b"),
        ("/tokenize", b'{"prompt": "x", "\\ud800": 1}', "\\ud800"),
        (CMPL, b'{"prompt": "x", "": "\\ud800"}', ""),
    ],
)
def test_lone_surrogates(server: Server, path: str, raw: bytes, param: str) -> None:
    r = httpx.post(server.url + path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and "surrogate" in err["message"]
    assert err["message"].startswith(f"{param or repr(param)}: "), err  # an empty name: "'': ..."


def test_surrogate_pair_is_fine(server: Server) -> None:
    raw = b'{"prompt": "\\ud83d\\ude00 once", "max_tokens": 2}'
    r = httpx.post(server.url + CMPL, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


def test_body_limit_and_context_bound(server: Server) -> None:
    r = httpx.post(server.url + CMPL, json={"prompt": "a " * 3_000_000})
    assert r.status_code == 413 and "--max-request-body-bytes" in r.json()["error"]["message"]
    long_text = "hello world " * 100_000
    r = httpx.post(server.url + CMPL, json={"prompt": long_text})
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]
    r = httpx.post(server.url + CHAT, json={"messages": [{"role": "user", "content": long_text}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    # /tokenize counts a text of any length under the body limit
    r = httpx.post(server.url + "/tokenize", json={"prompt": "hello world " * 2_000}, timeout=60)
    assert r.status_code == 200 and r.json()["count"] > 512


@pytest.mark.parametrize("n", [1, 3])
def test_seed_minus_one_is_no_seed(n: int) -> None:
    """``seed: -1`` is vLLM's "no seed" (its SamplingParams turns -1 into None): the engine gets
    an unseeded request, one choice or several. A request of one choice reached the engine with
    seed -1, so every such request gave the same text."""
    from surge.engine.llm_engine import choice_params
    from surge.server.protocol import CompletionRequest
    from surge.server.serving_common import build_sampling_params

    req = CompletionRequest.model_validate({"prompt": "x", "seed": -1, "n": n, "temperature": 1.0})
    params = build_sampling_params(req, 4, None, token_rules={})
    assert params.seed is None and [p.seed for p in choice_params(params)] == [None] * n
    seeded = CompletionRequest.model_validate({"prompt": "x", "seed": -2, "n": n})
    assert build_sampling_params(seeded, 4, None, token_rules={}).seed == -2


@pytest.mark.parametrize("encoding", ["gzip", "br", "GZIP", "identity, gzip"])
def test_a_compressed_body_gets_a_415_naming_the_header(server: Server, encoding: str) -> None:
    """A body sent with ``Content-Encoding: gzip`` (or any coding but identity) is a 415 that
    names the coding, not a 400 "invalid JSON" about bytes the server never decompressed; the
    connection still serves the next request."""
    import gzip

    body = json.dumps({"prompt": "Once", "max_tokens": 2}).encode()
    with httpx.Client(base_url=server.url) as client:
        r = client.post(
            CMPL,
            content=gzip.compress(body),
            headers={"content-type": "application/json", "content-encoding": encoding},
        )
        assert r.status_code == 415, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == 415, err
        coding = encoding.split(",")[-1].strip().lower()
        assert f"Content-Encoding {coding!r} is not supported" in err["message"], err
        r = client.post(CMPL, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text


def test_content_encodings_that_mean_no_coding_pass(server: Server) -> None:
    """``identity`` (also in a list, or with an empty item) and a request without a body pass; a
    second header naming gzip counts as much as the first (the last header alone was read)."""
    body = json.dumps({"prompt": "Once", "max_tokens": 2}).encode()
    json_type = ("content-type", "application/json")
    with httpx.Client(base_url=server.url) as client:
        for value in ("identity", "identity, ,identity", "identity,identity"):
            r = client.post(CMPL, content=body, headers=[json_type, ("content-encoding", value)])
            assert r.status_code == 200, (value, r.text)
        r = client.get("/v1/models", headers={"content-encoding": "gzip"})
        assert r.status_code == 200, r.text
        twice = [json_type, ("content-encoding", "gzip"), ("content-encoding", "identity")]
        r = client.post(CMPL, content=body, headers=twice)
        assert r.status_code == 415 and "'gzip'" in r.json()["error"]["message"], r.text


def test_a_bad_prompt_of_a_list_is_named_by_its_index(server: Server) -> None:
    """An empty, too long or out-of-vocabulary prompt of a list is ``prompt[j]`` in the message
    (the message said "The prompt is empty" whichever it was); a single prompt's keeps vLLM's."""

    def error(prompt: Any) -> str:
        r = httpx.post(server.url + CMPL, json={"prompt": prompt, "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
        return str(r.json()["error"]["message"])

    assert error([[1, 2], []]) == "prompt[1] is empty (it must contain at least one token)."
    assert error([[1], [2], []]) == "prompt[2] is empty (it must contain at least one token)."
    assert error([]) == "prompt must not be empty"
    # vLLM 0.26's refusal of the empty string (it used to generate from the BOS alone)
    assert error("") == "Either prompt or prompt_embeds must be provided and non-empty."
    assert error([[]]) == "prompt[0] is empty (it must contain at least one token)."
    assert error([[10**6]]).startswith("prompt[0]: Prompt token ids must be in [0, ")
    assert error([10**6]).startswith("Prompt token ids must be in [0, ")
    long = error([[1, 2], [1] * 100_000])
    assert "However, prompt[1] has 100000 input tokens" in long and long.endswith("length of prompt[1]."), (
        long
    )
    assert "However, your prompt has 100000 input tokens" in error([1] * 100_000)
    # a prompt that fits, but not with the max_tokens asked for
    r = httpx.post(server.url + CMPL, json={"prompt": [[1], [1] * 300], "max_tokens": 300})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
    assert r.json()["error"]["message"].startswith("prompt[1]: "), r.text


def test_equal_to_one_counts_as_one_for_refused_fields(server: Server) -> None:
    """``best_of: 1.0`` is best_of 1 (with n 1, the only value served), as ``n: 1.0`` is n 1."""
    r = httpx.post(server.url + CMPL, json={"prompt": "x", "max_tokens": 2, "best_of": 1.0})
    assert r.status_code == 200, r.text
    r = httpx.post(server.url + CMPL, json={"prompt": "x", "max_tokens": 2, "best_of": 2.0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of", r.text


def _guarded(headers: list[tuple[bytes, bytes]], body: bytes) -> tuple[int, dict[str, Any], bool, bool]:
    """Send one POST /v1/completions with ``headers`` and a ``body`` through :class:`RequestGuard`
    alone: the status, the JSON answer (``{}`` when the app answered), whether the answer closes
    the connection and whether the app was reached."""
    import asyncio

    from surge.server.guard import GuardConfig, RequestGuard

    reached = False

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal reached
        reached = True
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers}
    asyncio.run(RequestGuard(app, GuardConfig())(scope, receive, send))
    start = sent[0]
    answer = json.loads(b"".join(m.get("body", b"") for m in sent[1:]) or b"{}")
    return start["status"], answer, (b"connection", b"close") in start["headers"], reached


@pytest.mark.parametrize("coding", [b"gzip, chunked", b"GZIP,chunked", b"deflate , chunked", b"br"])
def test_a_transfer_coding_other_than_chunked_is_a_415_naming_it(coding: bytes) -> None:
    """A body sent with ``Transfer-Encoding: gzip, chunked`` reached the app still gzipped (the HTTP
    parser undoes the chunking alone) and got a 400 "Invalid JSON body ... at byte 0": it is a 415
    naming the coding, as a ``Content-Encoding`` is, and its connection is closed, its body
    unread; ``chunked`` (any case, also after ``identity``) passes."""
    import gzip

    body = json.dumps({"prompt": "Once", "max_tokens": 2}).encode()
    json_type = (b"content-type", b"application/json")
    status, answer, close, reached = _guarded(
        [json_type, (b"transfer-encoding", coding)], gzip.compress(body)
    )
    assert (status, close, reached) == (415, True, False), answer
    first = coding.split(b",")[0].strip().lower().decode()
    assert answer["error"]["message"].startswith(f"Transfer-Encoding {first!r} is not supported"), answer
    assert answer["error"]["type"] == "invalid_request_error", answer
    for fine in (b"chunked", b"Chunked", b"identity, chunked"):
        status, _, _, reached = _guarded([json_type, (b"transfer-encoding", fine)], body)
        assert (status, reached) == (200, True), fine
