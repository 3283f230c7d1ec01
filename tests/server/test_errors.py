"""Malformed requests: each gets a 4xx OpenAI error body, and the server keeps serving."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.server.conftest import Server

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]

# (path, body (dict, or raw bytes), expected status, a word the message must contain)
BAD_REQUESTS: list[tuple[str, Any, int, str]] = [
    (CHAT, b"{not json", 400, "JSON"),
    (CHAT, b"", 400, ""),
    (CHAT, b"[1, 2, 3]", 400, ""),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {}, 400, "messages"),
    (CHAT, {"messages": "hello"}, 400, "messages"),
    (CHAT, {"messages": [{"content": "no role"}]}, 400, "role"),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        400,
        "text",
    ),
    (CHAT, {"messages": MSGS, "temperature": "hot"}, 400, "temperature"),
    (CHAT, {"messages": MSGS, "temperature": -1}, 400, "temperature"),
    (CHAT, {"messages": MSGS, "top_k": 2**64 - 1}, 400, "top_k"),
    (CHAT, {"messages": MSGS, "seed": 2**64}, 400, "seed"),
    (CHAT, {"messages": MSGS, "stop_token_ids": [2**40]}, 400, "stop_token_ids"),
    (CHAT, {"messages": MSGS, "top_p": 0}, 400, "top_p"),
    (CHAT, {"messages": MSGS, "top_p": 1.5}, 400, "top_p"),
    (CHAT, {"messages": MSGS, "max_tokens": 0}, 400, "max_tokens"),
    (CHAT, {"messages": MSGS, "max_tokens": 1.5}, 400, "max_tokens"),
    (CHAT, {"messages": MSGS, "max_tokens": 100000}, 400, "maximum context length is 512 tokens"),
    (CHAT, {"messages": MSGS, "n": 0}, 400, "n"),
    (CHAT, {"messages": MSGS, "presence_penalty": 3}, 400, "presence_penalty"),
    (CHAT, {"messages": MSGS, "frequency_penalty": -5}, 400, "frequency_penalty"),
    (CHAT, {"messages": MSGS, "repetition_penalty": 0}, 400, "repetition_penalty"),
    # 0 in float32: every penalized logit became inf or NaN and the output "<s><s><s>"
    (CMPL, {"prompt": "Once upon", "repetition_penalty": 1e-300}, 400, "repetition_penalty"),
    (CMPL, {"prompt": "Once upon", "repetition_penalty": 0.009}, 400, "repetition_penalty"),
    (CHAT, {"messages": MSGS, "min_tokens": 50, "max_tokens": 10}, 400, "min_tokens"),
    (CHAT, {"messages": MSGS, "stop": 5}, 400, "stop: expected a string or a list of strings, got a number"),
    (CMPL, {"prompt": 5}, 400, "prompt: expected a string, a list of strings, a list of token ids"),
    (CMPL, {"prompt": ["Once", [1, 403]]}, 400, "(prompt[1]: Input should be a valid string)"),
    (CMPL, {"prompt": {"text": "Once"}}, 400, "got an object"),
    (CHAT, {"messages": MSGS, "stop": [""]}, 400, "stop"),
    (CHAT, {"messages": MSGS, "stop_token_ids": [-1]}, 400, "stop_token_ids"),
    (CHAT, {"messages": MSGS, "stream": "yes please"}, 400, "stream"),
    (CHAT, {"messages": MSGS, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    (CHAT, {"messages": MSGS, "response_format": {"type": "json_schema"}}, 400, "json_schema"),
    (CHAT, {"messages": MSGS, "response_format": {"type": "json_schema", "schema": {}}}, 400, "json_schema"),
    (
        CHAT,
        {
            "messages": MSGS,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "x"}}},
        },
        400,
        "schema",
    ),
    (
        CHAT,
        {"messages": MSGS, "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
        400,
        "name",
    ),
    (CHAT, {"messages": MSGS, "response_format": {"type": "xml"}}, 400, "response_format"),
    (CHAT, {"messages": MSGS, "response_format": "json"}, 400, "response_format"),
    (CHAT, {"messages": MSGS, "guided_regex": "([a-z"}, 400, "guided_regex"),
    (CHAT, {"messages": MSGS, "guided_choice": []}, 400, "guided_choice"),
    (CHAT, {"messages": MSGS, "guided_json": "{bad"}, 400, "guided_json"),
    (CHAT, {"messages": MSGS, "guided_grammar": "root ::= foo"}, 400, "guided_grammar"),
    (CHAT, {"messages": MSGS, "structured_outputs": {}}, 400, "structured_outputs"),
    # JSON text nested past the parser's depth: a RecursionError, once a 500
    (CHAT, {"messages": MSGS, "guided_json": "[" * 100_000}, 400, "guided_json is nested too deeply"),
    (
        CMPL,
        {"prompt": "x", "structured_outputs": {"json": "[" * 100_000}},
        400,
        "structured_outputs.json is nested too deeply",
    ),
    (
        CHAT,
        {
            "messages": [
                *MSGS,
                {
                    "role": "assistant",
                    "tool_calls": [{"function": {"name": "f", "arguments": "[" * 100_000}}],
                },
            ]
        },
        400,
        "arguments are nested too deeply",
    ),
    (CHAT, {"messages": MSGS, "structured_outputs": {"regex": "a", "choice": ["b"]}}, 400, "exactly one"),
    (
        CHAT,
        {"messages": MSGS, "structured_outputs": {"json": {"type": "nonsense"}}},
        400,
        "structured_outputs.json",
    ),
    (CHAT, {"messages": MSGS, "structured_outputs": {"structural_tag": "x"}}, 400, "structural_tag"),
    (CMPL, {"prompt": "x", "structured_outputs": {"regex": "(("}}, 400, "structured_outputs.regex"),
    (CMPL, {"prompt": "x", "guided_regex": "a", "guided_choice": ["b"]}, 400, "only one"),
    (
        CHAT,
        {"messages": MSGS, "tools": [{"type": "function", "function": {"name": "f"}}]},
        400,
        "tool-call-parser",
    ),
    (CHAT, {"messages": MSGS, "tools": [{"type": "function"}], "tool_choice": "none"}, 400, "tools"),
    (CHAT, {"messages": MSGS, "top_logprobs": 3}, 400, "logprobs"),
    (CHAT, {"messages": MSGS, "logit_bias": {"5": 500}}, 400, "logit_bias"),
    (CHAT, {"messages": MSGS, "chat_template_kwargs": {"tokenize": True}}, 400, "tokenize"),
    (CHAT, {"messages": MSGS, "model": "no-such-model"}, 404, "does not exist"),
    (CMPL, {"prompt": "x", "max_tokens": 600}, 400, "maximum context length is 512 tokens"),
    (CMPL, {"prompt": []}, 400, "prompt"),
    (CMPL, {"prompt": [1, 2, 100000]}, 400, "token ids"),
    (CMPL, {"prompt": [[1, 2], [-3]]}, 400, "token ids"),
    (CMPL, {"prompt": {"text": "x"}}, 400, "prompt"),
    (CMPL, {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    (CMPL, {"prompt": "x", "suffix": "end"}, 400, "suffix"),
    (CMPL, {"prompt": "x", "best_of": 3}, 400, "best_of"),
    (CMPL, {"prompt": "x", "seed": "abc"}, 400, "seed"),
    (CMPL, {"prompt": "x", "stream": True, "max_tokens": 100000}, 400, "maximum context length"),
    ("/v1/nowhere", {"prompt": "x"}, 404, ""),
    ("/tokenize", {}, 400, "prompt"),
    ("/detokenize", {"tokens": [99999]}, 400, "token ids"),
]


def _post(srv: Server, path: str, body: Any) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(
            srv.url + path, content=body, headers={"content-type": "application/json"}, timeout=60
        )
    return httpx.post(srv.url + path, json=body, timeout=60)


@pytest.mark.parametrize(("path", "body", "status", "word"), BAD_REQUESTS)
def test_bad_request_gets_openai_error(server: Server, path: str, body: Any, status: int, word: str) -> None:
    r = _post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert word.lower() in err["message"].lower()
    assert "Traceback" not in r.text


@pytest.mark.parametrize("path", [CHAT, CMPL, "/v1/responses"])
def test_a_wrong_model_name_says_which_names_are_served(server: Server, path: str) -> None:
    """A wrong model name got "The model `gpt-4` does not exist.", which left the client to guess
    the served name (by default the --model path, which an OpenAI client must send); the 404 now
    names it."""
    served = httpx.get(server.url + "/v1/models", timeout=60).json()["data"][0]["id"]
    bodies: dict[str, dict[str, Any]] = {
        CHAT: {"messages": MSGS, "max_tokens": 1},
        CMPL: {"prompt": "x", "max_tokens": 1},
        "/v1/responses": {"input": "x", "max_output_tokens": 16},
    }
    r = _post(server, path, {"model": "gpt-4", **bodies[path]})
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == ("model", "model_not_found"), err
    assert err["message"].startswith(f"The model `gpt-4` does not exist. This server serves `{served}` "), err


EMPTY_MODEL_BODIES: dict[str, dict[str, Any]] = {
    CHAT: {"messages": MSGS, "max_tokens": 1},
    CMPL: {"prompt": "x", "max_tokens": 1},
    "/v1/responses": {"input": "x", "max_output_tokens": 16},
    "/v1/messages": {"messages": MSGS, "max_tokens": 1},
    "/v1/messages/count_tokens": {"messages": MSGS},
    "/tokenize": {"prompt": "x"},
    "/detokenize": {"tokens": [1]},
}


@pytest.mark.parametrize("path", list(EMPTY_MODEL_BODIES))
def test_an_empty_model_name_is_the_served_model(server: Server, path: str) -> None:
    """``"model": ""`` was a 404 model_not_found; vLLM takes a falsy name as the served model
    (``_is_model_supported``: ``if not model_name: return True``), and so does Surge now, on
    every endpoint that checks the name, answering with the served name as when it is left out."""
    served = httpx.get(server.url + "/v1/models", timeout=60).json()["data"][0]["id"]
    r = _post(server, path, {"model": "", **EMPTY_MODEL_BODIES[path]})
    assert r.status_code == 200, r.text
    if "model" in r.json():
        assert r.json()["model"] == served, r.json()


UNIQUE_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 3}, "uniqueItems": True}
TOOL_SCHEMA = {"type": "object", "properties": {"step": {"type": "number", "multipleOf": 0.5}}}

# (path, body, the field named by param, what the message says after "<param>: ")
UNENFORCEABLE_GRAMMARS: list[tuple[str, dict[str, Any], str, str]] = [
    (
        CHAT,
        {
            "messages": MSGS,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"ids": UNIQUE_IDS}}},
            },
        },
        "response_format.json_schema.schema",
        "keyword 'uniqueItems' at #/properties/ids is not supported",
    ),
    (
        CMPL,
        {"prompt": "x", "structured_outputs": {"json": {"type": "string", "pattern": "^(?=x)x+$"}}},
        "structured_outputs.json",
        "keyword 'pattern' at # is not supported: a lookahead",
    ),
    (
        CHAT,
        {
            "messages": MSGS,
            "guided_json": {"type": "object", "patternProperties": {"^a": {"type": "integer"}}},
        },
        "guided_json",
        "keyword 'patternProperties' at # is not supported",
    ),
    (CMPL, {"prompt": "x", "guided_regex": "a^b"}, "guided_regex", "unsupported regex: '^' at position 1"),
    (
        CMPL,
        {"prompt": "x", "structured_outputs": {"choice": [str(i) for i in range(3000)]}},
        "structured_outputs.choice",
        "invalid choice: at most 2,048 options, got 3,000",
    ),
    (
        CHAT,
        {
            "messages": MSGS,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": TOOL_SCHEMA}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
        "tools",
        "keyword 'multipleOf' at #/properties/step is not supported",
    ),
]


@pytest.mark.parametrize(("path", "body", "param", "says"), UNENFORCEABLE_GRAMMARS)
def test_schema_the_grammar_cannot_enforce_is_a_400_naming_the_field(
    server: Server, path: str, body: dict[str, Any], param: str, says: str
) -> None:
    """A JSON-schema keyword or regex feature xgrammar would drop is refused, never ignored."""
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert err["message"].startswith(f"{param}: {says}"), err["message"]


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "text/json", "application/jsonx"],
)
def test_json_body_without_a_json_content_type_says_so(server: Server, content_type: str | None) -> None:
    """curl -d sends a JSON body as a form: the 400 names the missing JSON Content-Type."""
    headers = {"content-type": content_type} if content_type else {}
    r = httpx.post(
        server.url + CMPL, content=b'{"prompt": "x", "max_tokens": 2}', headers=headers, timeout=60
    )
    assert r.status_code == 400, r.text  # vLLM's status and first words
    message = r.json()["error"]["message"]
    assert message.startswith("Unsupported Media Type: Only 'application/json' is allowed")
    assert "Content-Type: application/json" in message


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "application/vnd.api+json"])
def test_json_content_types_fastapi_parses_are_served(server: Server, content_type: str) -> None:
    r = httpx.post(
        server.url + CMPL,
        content=b'{"prompt": "x", "max_tokens": 2}',
        headers={"content-type": content_type},
        timeout=60,
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", [CMPL, "/v1/chat/completions"])
def test_an_empty_json_body_says_so(server: Server, path: str) -> None:
    r = httpx.post(server.url + path, content=b"", headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "The request body is empty: send a JSON object", r.text


def test_server_still_serves_after_bad_requests(server: Server) -> None:
    assert len(BAD_REQUESTS) >= 15
    for path, body, status, _ in BAD_REQUESTS:
        assert _post(server, path, body).status_code == status
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.head(server.url + "/health").status_code == 200
    r = httpx.post(
        server.url + CMPL, json={"prompt": "Once", "max_tokens": 5, "ignore_eos": True}, timeout=60
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
    r = httpx.post(server.url + CHAT, json={"messages": MSGS, "max_tokens": 3, "stream": True}, timeout=60)
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    assert "Traceback" not in server.log()


def test_a_client_string_cannot_forge_a_log_line(server: Server) -> None:
    """A model name, a field name or a percent-decoded path with a newline, a NUL or U+2028 went
    raw into the rejection's log line: a client could write a line that looked like the
    server's own ("... ERROR [surge.server] FORGED") or make grep read the log as binary. They are
    logged as escapes; the answer still echoes the client's text as it was."""
    forged = "x\n2026-12-06 18:00:00,000 ERROR [surge.server] FORGED\u2028\x00"
    r = _post(server, CMPL, {"prompt": "a", "max_tokens": 1, "model": forged})
    assert r.status_code == 404 and forged in r.json()["error"]["message"], r.text
    r2 = _post(server, CMPL, {"prompt": "a", forged: 1})
    assert r2.status_code == 400, r2.text
    r3 = httpx.get(server.url + "/v1/models/%0AFORGED%00")
    assert r3.status_code == 404, r3.text
    log = server.log()
    assert not any(
        line.lstrip().startswith(("2026-12-06 18:00:00,000", "FORGED")) for line in log.splitlines()
    )
    assert "\x00" not in log and "\u2028" not in log
    for rid in (r.headers["x-request-id"], r2.headers["x-request-id"]):
        (line,) = [line for line in log.splitlines() if f"(request id {rid})" in line]
        assert "x\\n2026-12-06 18:00:00,000 ERROR [surge.server] FORGED\\u2028\\x00" in line, line
    assert "FORGED\\x00 -> 404" in log  # the path's NUL (its newline does not reach the log)


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        (CMPL, {"prompt": "x", "k" * 1_000_000: 1}, 400),  # an unknown field: message and param
        (CMPL, {"prompt": "x", "model": "m" * 1_000_000}, 404),
        (CMPL, {"prompt": "x", "logit_bias": {"9" * 1_000_000: 1}}, 400),
        (CMPL, {"prompt": "x", "stream": True, "stream_options": {"s" * 1_000_000: 1}}, 400),
        (CHAT, {"messages": MSGS, "response_format": {"type": "json_object", "r" * 1_000_000: 1}}, 400),
    ],
)
def test_an_error_echoing_a_huge_client_string_is_clipped(
    server: Server, path: str, body: dict[str, Any], status: int
) -> None:
    """A message or param that echoes what the client sent is clipped (2,048 and 256 characters,
    ending in "..."), in the answer and in the server's log line: a 1 MB field name made a 2 MB
    answer and a 2 MB log line per request (a 4 MiB body, 8 MB)."""
    from surge.server.errors import MAX_MESSAGE_CHARS, MAX_PARAM_CHARS

    r = _post(server, path, body)
    assert r.status_code == status, r.text[:300]
    err = r.json()["error"]
    assert len(r.content) < MAX_MESSAGE_CHARS + MAX_PARAM_CHARS + 200
    assert err["message"].endswith("...") and len(err["message"]) == MAX_MESSAGE_CHARS
    assert err["param"] is not None and len(err["param"]) <= MAX_PARAM_CHARS
    request_id = r.headers["x-request-id"]
    lines = [line for line in server.log().splitlines() if f"(request id {request_id})" in line]
    assert len(lines) == 1 and len(lines[0]) < MAX_MESSAGE_CHARS + MAX_PARAM_CHARS + 300, lines[0][:300]
    assert httpx.get(server.url + "/health").status_code == 200


_DEEP_LIST = b"[" * 5000 + b"]" * 5000
_DEEP_OBJECT = b'{"a":' * 3000 + b"1" + b"}" * 3000
_BATCH_MSGS = b'[[{"role": "user", "content": "hi"}]]'

# (path, raw JSON body, param, what the message says after "<param>: ")
UNPARSABLE_FIELDS: list[tuple[str, bytes, str, str]] = [
    (CMPL, b'{"prompt": "x", "metadata": ' + _DEEP_LIST + b"}", "metadata", "nested too deeply"),
    (CHAT, b'{"messages": ' + _DEEP_LIST + b"}", "messages", "nested too deeply"),
    # once a 500: /invocations let the parser's RecursionError through
    (
        "/invocations",
        b'{"prompt": "x", "vllm_xargs": ' + _DEEP_OBJECT + b"}",
        "vllm_xargs",
        "nested too deeply",
    ),
    ("/tokenize", b'{"prompt": "x", "zz": ' + _DEEP_OBJECT + b"}", "zz", "nested too deeply"),
    # valid JSON msgspec cannot hold: once "Invalid JSON body: JSON decode error", no field named
    (CMPL, b'{"prompt": "x", "temperature": 1e999}', "temperature", "not a JSON value"),
    (CHAT, b'{"messages": [], "seed": ' + b"9" * 5000 + b"}", "seed", "not a JSON value"),
    (CMPL, b'{"prompt": "x", "top_p": NaN}', "top_p", "not a JSON value"),
    # a lone surrogate in a field's name, in a body too deep for the guard's check: the name is
    # written out (an error body echoing it as is cannot be encoded: a 500)
    (
        "/v1/chat/completions/batch",
        b'{"messages": ' + _BATCH_MSGS + b', "\\ud800": ' + _DEEP_OBJECT + b"}",
        "\\ud800",
        "not a JSON value Surge can parse (JSON is malformed: unexpected end of escaped utf-16",
    ),
]


@pytest.mark.parametrize(
    ("path", "raw", "param", "says"),
    UNPARSABLE_FIELDS,
    ids=[f"{p}-{param}" for p, _, param, _ in UNPARSABLE_FIELDS],
)
def test_a_field_the_json_parser_refuses_is_a_400_naming_it(
    server: Server, path: str, raw: bytes, param: str, says: str
) -> None:
    """A value nested past the parser's depth got "There was an error parsing the body" (and a
    500 on /invocations); a number out of range, "Invalid JSON body: JSON decode error": now
    the 400 names the top-level field (found by the fuzz of test_fuzz_requests.py)."""
    r = _post(server, path, raw)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == param, err
    assert err["message"].startswith(f"{param}: {says}"), err
    assert httpx.get(server.url + "/health").status_code == 200


INVALID_JSON_BODIES: list[tuple[bytes, str]] = [
    (b'{"prompt": "x",\n "max_tokens" 2}', "expected ':' at byte 30 (line 2, column 15)"),
    (b'{"prompt": "x"', "the body ends before its JSON does at byte 14 (line 1, column 15)"),
    (b'{"prompt": "x"} {}', "trailing characters at byte 16 (line 1, column 17)"),
    # a missing comma was blamed on the field before it ("prompt: not a JSON value Surge can parse")
    (b'{"prompt": "x" "max_tokens": 2}', "expected ',' or '}' at byte 15 (line 1, column 16)"),
]


@pytest.mark.parametrize("path", [CMPL, "/invocations"])
@pytest.mark.parametrize(("raw", "where"), INVALID_JSON_BODIES)
def test_invalid_json_says_what_and_where(server: Server, path: str, raw: bytes, where: str) -> None:
    """The 400 for a body that is not JSON said "Invalid JSON body: JSON decode error" alone: the
    parser's byte offset was dropped (found by test_fuzz_requests.py)."""
    r = _post(server, path, raw)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert (err["param"], err["message"]) == (None, f"Invalid JSON body: JSON decode error: {where}"), err


@pytest.mark.parametrize("path", [CMPL, "/invocations"])
def test_a_body_after_a_utf8_byte_order_mark_is_served(server: Server, path: str) -> None:
    """A body after a UTF-8 byte order mark got a bare "Invalid JSON body: JSON decode error";
    vLLM 0.26 serves it (its ``json.loads`` of the bytes reads them as utf-8-sig), and so does Surge."""
    r = _post(server, path, b'\xef\xbb\xbf{"prompt": "x", "max_tokens": 2}')
    assert r.status_code == 200, r.text[:300]
    assert r.json()["usage"]["completion_tokens"] == 2
    r = _post(server, path, b'\xef\xbb\xbf{"prompt": "x", "max_tokens": 0}')  # fields still checked
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text[:300]


def test_a_prompt_too_long_for_the_requests_chat_template_says_so(server: Server) -> None:
    """A request's own ``chat_template`` (the server trusts them) that renders a prompt too long for
    the context blamed ``messages`` alone; the 400 now says the request's template renders it."""
    template = "{% for i in range(2000) %}{{ messages[0]['content'] }} {% endfor %}"
    body = {"messages": MSGS, "max_tokens": 2, "chat_template": template}
    r = _post(server, CHAT, body)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert "maximum context length" in err["message"], err
    assert err["message"].endswith(" The request's 'chat_template' renders the prompt."), err
    assert err["param"] == "messages"
    r = _post(server, CHAT, {**body, "chat_template": "{{ messages[0]['content'] }}"})  # fits: served
    assert r.status_code == 200, r.text[:300]
    r = _post(server, CHAT, {"messages": [{"role": "user", "content": "hi " * 2000}], "max_tokens": 2})
    assert r.status_code == 400 and "chat_template" not in r.json()["error"]["message"], r.text[:300]


def test_a_body_nested_too_deeply_that_is_not_an_object(server: Server) -> None:
    r = _post(server, CMPL, _DEEP_LIST)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert (err["param"], err["message"]) == (None, "body: nested too deeply to parse as JSON"), err


def test_messages_api_names_a_field_nested_too_deeply(server: Server) -> None:
    raw = (
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "metadata": ' + _DEEP_LIST + b"}"
    )
    r = _post(server, "/v1/messages", raw)
    assert r.status_code == 400, r.text[:300]
    assert r.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "metadata: nested too deeply to parse as JSON"},
    }


def test_a_union_field_of_the_wrong_type_lists_its_forms() -> None:
    """A value of the wrong type in ``stop`` or ``prompt`` (fields of several JSON forms) gets a
    400 that lists the forms, not pydantic's first member alone (``stop.str: Input should be a
    valid string (and 1 more error)``); errors of other fields are still counted, and a value
    out of range in the right form keeps pydantic's own words."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError

    from surge.server.api_server import _validation_message
    from surge.server.protocol import CompletionRequest

    def message(body: dict[str, Any]) -> tuple[str, str | None]:
        with pytest.raises(ValidationError) as info:
            CompletionRequest.model_validate(body)
        errors = [{**e, "loc": ("body", *e["loc"])} for e in info.value.errors()]
        return _validation_message(RequestValidationError(errors))

    assert message({"prompt": "x", "stop": 5}) == (
        "stop: expected a string or a list of strings, got a number",
        "stop",
    )
    msg, param = message({"prompt": "x", "stop": {"a": 1}, "ignore_eos": "yes"})
    assert msg == "stop: expected a string or a list of strings, got an object (and 1 more error)"
    assert param == "stop"
    msg, _ = message({"prompt": "x", "stop": [1, 2]})
    assert msg.startswith("stop: expected a string or a list of strings (stop[0]:")


def test_a_message_content_of_the_wrong_type_lists_its_forms() -> None:
    """A message's ``content`` of the wrong type (a field of several forms inside a list) is named
    as a client writes it and its forms listed, in a chat body and in a batch's conversation, not
    as ``messages.0.content.str: Input should be a valid string (and 1 more error)``; the
    count of other errors leaves out the same content's other members."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import BaseModel, ValidationError

    from surge.server.api_server import _validation_message
    from surge.server.protocol import BatchChatCompletionRequest, ChatCompletionRequest

    def message(model: type[BaseModel], body: dict[str, Any], batch: bool = False) -> tuple[str, str | None]:
        with pytest.raises(ValidationError) as info:
            model.model_validate(body)
        errors = [{**e, "loc": ("body", *e["loc"])} for e in info.value.errors()]
        return _validation_message(RequestValidationError(errors), batch=batch)

    forms = "a string, a list of content parts or null"
    ok = {"role": "user", "content": "hi"}
    assert message(ChatCompletionRequest, {"messages": [ok, {"role": "user", "content": 5}]}) == (
        f"messages[1].content: expected {forms}, got a number",
        "messages",
    )
    msg, _ = message(ChatCompletionRequest, {"messages": [{"role": "user", "content": [5]}]})
    assert (
        msg
        == f"messages[0].content: expected {forms} (messages[0].content[0]: Input should be a valid dictionary)"
    )
    msg, _ = message(
        ChatCompletionRequest, {"messages": [{"role": "user", "content": {"a": 1}}, {"content": "x"}]}
    )
    assert msg == f"messages[0].content: expected {forms}, got an object (and 1 more error)"
    # another wrong union value counts once, not once per member pydantic tried
    two = {"messages": [{"role": "user", "content": 5}, {"role": "user", "content": 6}]}
    assert message(ChatCompletionRequest, two)[0].endswith("got a number (and 1 more error)")
    assert message(ChatCompletionRequest, {"messages": two["messages"][:1], "stop": 5})[0].endswith(
        "(and 1 more error)"
    )
    # also when the first error is not a union field's: the bad content counts once
    assert message(ChatCompletionRequest, {"messages": two["messages"][:1], "seed": "x"}) == (
        "seed: Input should be a valid integer (and 1 more error)",
        "seed",
    )
    batch = {"messages": [[ok], [{"role": "user", "content": 7}]]}
    assert message(BatchChatCompletionRequest, batch, batch=True) == (
        f"messages[1][0].content: expected {forms}, got a number",
        "messages[1]",
    )


@pytest.mark.parametrize("key", ["name", "tool_call_id", "reasoning", "reasoning_content"])
@pytest.mark.parametrize("value", [5, ["x"], {"a": 1}, True])
def test_a_message_key_vllm_types_as_a_string_is_refused_of_another_type(key: str, value: Any) -> None:
    """A chat message's ``name``, ``tool_call_id`` and reasoning (both names) of another JSON type
    than a string were passed to the chat template as they came (``"name": 5`` was rendered or
    dropped: a 200), where vLLM's message types refuse them: a 400 naming ``messages`` and the
    key; a string, null or leaving it out is served as before, on chat, batch and ``/tokenize``."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import BaseModel, ValidationError

    from surge.server.api_server import _validation_message
    from surge.server.protocol import BatchChatCompletionRequest, ChatCompletionRequest, TokenizeRequest

    def message(model: type[BaseModel], body: dict[str, Any], batch: bool = False) -> tuple[str, str | None]:
        with pytest.raises(ValidationError) as info:
            model.model_validate(body)
        errors = [{**e, "loc": ("body", *e["loc"])} for e in info.value.errors()]
        return _validation_message(RequestValidationError(errors), batch=batch)

    ok = {"role": "user", "content": "hi"}
    bad = {"role": "assistant", "content": "a", key: value}
    msg, param = message(ChatCompletionRequest, {"messages": [ok, bad]})
    assert (msg.split(":")[0], param) == (f"messages.1.{key}", "messages"), msg
    assert "valid string" in msg, msg
    assert message(TokenizeRequest, {"messages": [bad]})[1] == "messages"
    assert message(BatchChatCompletionRequest, {"messages": [[ok], [bad]]}, batch=True)[1] == "messages[1]"
    for fine in ("text", None):
        body = ChatCompletionRequest.model_validate({"messages": [ok, {**bad, key: fine}]})
        dumped = body.messages[1].model_dump(exclude_none=True)
        assert dumped.get(key) == fine and (key in dumped) == (fine is not None)
