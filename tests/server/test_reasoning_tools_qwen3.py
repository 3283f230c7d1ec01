"""Forced tool calls and ``response_format`` with ``--reasoning-parser qwen3`` over HTTP, on a
tiny random Qwen3 with the real Qwen3 tokenizer and chat template (``--load-format dummy``).
The grammar starts after the first ``</think>`` token, which a random model writes without
``<think>``: everything before it must be ``reasoning_content`` and the answer after it the
calls or the content, JSON that validates; streamed the same. An output that never writes
``</think>`` reads as it would without the grammar. ``logit_bias`` on ``</think>``
decides where (or whether) it comes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest

from tests.server.conftest import Server, serve_tiny_qwen3
from tests.server.test_tools_api import _delta_carries, _entries, _events

THINK_END = 151668  # Qwen3's </think>
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]
SCHEMAS = {"get_time": TIME, "noop": TOOLS[1]["function"]["parameters"]}
NAMED = {"type": "function", "function": {"name": "get_time"}}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "t", "schema": TIME}}
BASE: dict[str, Any] = {"messages": [{"role": "user", "content": "Time?"}], "max_tokens": 40}


@pytest.fixture(scope="module")
def qwen3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve_tiny_qwen3(
        tmp_path_factory,
        "reasoning",
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "qwen3",
        "--trust-request-chat-template",
    )


def _post(srv: Server, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    r = httpx.post(srv.url + "/v1/chat/completions", json=BASE | body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"], choice["finish_reason"]


def _stream(srv: Server, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The message a client builds from the stream (``content`` stays null unless a delta
    after the role chunk carries it; with calls, an empty streamed content counts as null)."""
    r = httpx.post(srv.url + "/v1/chat/completions", json=BASE | body | {"stream": True}, timeout=120)
    assert r.status_code == 200, r.text
    msg: dict[str, Any] = {"role": "assistant", "content": None, "reasoning": None, "reasoning_content": None}
    calls: dict[int, dict[str, Any]] = {}
    finish = ""
    for event in r.text.strip().split("\n\n"):
        if event.startswith(":") or event == "data: [DONE]":
            continue
        for c in json.loads(event.removeprefix("data: "))["choices"]:
            d = c["delta"]
            finish = c["finish_reason"] or finish
            if "role" in d:  # each choice's first chunk, as vLLM: the role and empty content
                assert d == {"role": "assistant", "content": ""} and c["finish_reason"] is None
                continue
            if "content" in d:
                msg["content"] = (msg["content"] or "") + d["content"]
            assert d.get("reasoning") == d.get("reasoning_content"), d  # vLLM's name and the older one
            for key in ("reasoning", "reasoning_content"):
                if key in d:
                    msg[key] = (msg[key] or "") + d[key]
            for t in d.get("tool_calls", []):
                call = calls.setdefault(t["index"], {"type": "function", "function": {"arguments": ""}})
                if "id" in t:
                    call["id"] = t["id"]
                if "name" in t["function"]:
                    call["function"]["name"] = t["function"]["name"]
                call["function"]["arguments"] += t["function"]["arguments"]
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
        msg["content"] = msg["content"] or None
    return msg, finish


def _both(srv: Server, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The non-streamed message and finish reason; the stream (same seed) must match."""
    msg, finish = _post(srv, body)
    streamed, streamed_finish = _stream(srv, body)
    if body.get("tool_choice") == "required" or isinstance(body.get("tool_choice"), dict):
        streamed["content"] = streamed["content"] or ""  # a forced tool_choice's message: "" (vLLM)
    for a, b in zip(msg.get("tool_calls", []), streamed.get("tool_calls", []), strict=True):
        b["id"] = a["id"]
    assert (streamed, streamed_finish) == (msg, finish)
    return msg, finish


def _valid_calls(msg: dict[str, Any]) -> list[str]:
    names = []
    for call in msg.get("tool_calls") or []:
        name, args = call["function"]["name"], call["function"]["arguments"]
        jsonschema.validate(json.loads(args), SCHEMAS[name])
        names.append(name)
    return names


def test_forced_calls_after_think_end_without_think_start(qwen3_server: Server) -> None:
    """``</think>`` first (no ``<think>``): no reasoning, the calls are the grammar's JSON."""
    bias = {"logit_bias": {str(THINK_END): 100}, "temperature": 1.0, "seed": 0}
    required = bias | {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    msg, finish = _both(qwen3_server, required)
    assert finish == "tool_calls" and msg["content"] == "" and msg["reasoning_content"] is None
    assert len(_valid_calls(msg)) == 1
    msg, finish = _both(qwen3_server, bias | {"tools": TOOLS, "tool_choice": NAMED})
    assert finish == "stop" and _valid_calls(msg) == ["get_time"]  # a named call keeps "stop"
    msg, finish = _both(qwen3_server, bias | {"response_format": JSON_SCHEMA})
    assert finish == "stop" and msg["reasoning_content"] is None
    jsonschema.validate(json.loads(msg["content"]), TIME)


def test_leading_think_end_is_an_empty_reasoning_with_or_without_a_grammar(qwen3_server: Server) -> None:
    """``</think>`` first, then more of them (no ``<think>``): vLLM 0.26's qwen3 parser starts
    inside the reasoning, which the first ``</think>`` ends (empty), and drops the later ones from
    the answer. Without a grammar the answer used to be ``"</think></think>..."`` while the
    forced grammar's reading (reasoning up to the first ``</think>``) had none; both now read
    the output as vLLM does, streamed or not."""
    body = {"logit_bias": {str(THINK_END): 100}, "max_tokens": 4, "seed": 0}
    for extra in ({}, {"tools": TOOLS, "tool_choice": "auto"}):
        msg, finish = _post(qwen3_server, body | extra)
        assert finish == "length" and "tool_calls" not in msg
        assert msg["content"] is None and msg["reasoning_content"] is None  # four </think>, all tags
        streamed, finish = _stream(qwen3_server, body | extra)  # its last chunk may carry content ""
        assert finish == "length" and streamed["content"] in (None, "") and streamed["reasoning"] is None
    required = body | {"tools": TOOLS, "tool_choice": "required"}
    msg, finish = _post(qwen3_server, required)
    assert finish == "length" and msg["reasoning_content"] is None and "</think>" not in json.dumps(msg)
    # the cut array reads as the stream sends it: the calls begun, none yet here, no content
    # (vLLM's forced tool_choice answers "")
    streamed, streamed_finish = _stream(qwen3_server, required)
    assert msg["content"] == "" and streamed["content"] in (None, "") and streamed_finish == finish
    assert msg.get("tool_calls") == streamed.get("tool_calls") is None


def test_named_call_cut_by_max_tokens_after_think_end(qwen3_server: Server) -> None:
    """``</think>`` first, then ``max_tokens`` cuts the named call's arguments: streamed and not
    alike (vLLM's answer), the call with the arguments written so far, ``content`` ``""`` and
    finish_reason "length"."""
    body = {"logit_bias": {str(THINK_END): 100}, "temperature": 1.0, "seed": 0, "max_tokens": 4}
    msg, finish = _both(qwen3_server, body | {"tools": TOOLS, "tool_choice": NAMED})
    assert finish == "length" and msg["content"] == "" and msg["reasoning_content"] is None
    [call] = msg["tool_calls"]
    assert call["function"]["name"] == "get_time" and call["function"]["arguments"].startswith("{")


def test_reasoning_text_then_forced_calls(qwen3_server: Server) -> None:
    """A milder bias: some choices write text before ``</think>``; whatever they write, it is
    reasoning and the calls (or the JSON content) validate."""
    reasoned = 0
    for seed in range(6):
        body = {"logit_bias": {str(THINK_END): 4}, "temperature": 1.0, "seed": seed}
        for extra in (
            {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
            {"tools": TOOLS, "tool_choice": NAMED},
            {"response_format": JSON_SCHEMA},
        ):
            msg, finish = _both(qwen3_server, body | extra)
            assert "</think>" not in json.dumps(msg)
            if finish == "length" and not msg["content"] and "tool_calls" not in msg:
                continue  # cut inside the reasoning
            reasoned += bool(msg["reasoning_content"])
            if "response_format" in extra:
                assert finish == "stop"
                jsonschema.validate(json.loads(msg["content"]), TIME)
            else:
                named = extra["tool_choice"] == NAMED  # a named call keeps "stop"
                assert finish == ("stop" if named else "tool_calls")
                assert msg["content"] == "" and _valid_calls(msg)
    assert reasoned, "some choices reasoned before </think>"


def test_the_answer_after_think_end_is_unstripped_and_streams_no_empty_chunk(qwen3_server: Server) -> None:
    """Reasoning, ``</think>``, then a grammar's answer: the content is the text after
    ``</think>``, unstripped (vLLM), streamed the same; no chunk between the role's and the last
    carries nothing (the ``</think>`` token's is not sent), except with logprobs, where every
    token's entry still arrives. (This ran on the bundled model in test_tools_api.py, whose
    tokenizer has no ``<think>`` token, which a reasoning parser now refuses.)"""
    body: dict[str, Any] = {
        "logit_bias": {str(THINK_END): 4},
        "temperature": 1.0,
        "structured_outputs": {"regex": r"\n\n(yes|no)"},
    }
    for seed in range(8):
        msg, finish = _both(qwen3_server, body | {"seed": seed})
        if finish == "stop" and msg["reasoning_content"]:
            break
    else:
        pytest.fail("no seed reasoned, then answered")
    assert msg["content"] in ("\n\nyes", "\n\nno") and msg["reasoning"] == msg["reasoning_content"]
    body = BASE | body | {"seed": seed}
    choices, _ = _events(qwen3_server, body)
    assert choices[0]["delta"]["role"] == "assistant" and choices[-1]["finish_reason"] == "stop"
    assert all(_delta_carries(c) for c in choices[1:-1]), [c["delta"] for c in choices]
    choices, usage = _events(qwen3_server, body | {"logprobs": True})
    middle = choices[1:-1]
    assert all(_delta_carries(c) or _entries(c) for c in middle)
    assert any(_entries(c) and not _delta_carries(c) for c in middle)  # </think>'s entry alone
    assert len([e for c in choices for e in _entries(c)]) == usage["completion_tokens"]


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": TOOLS, "tool_choice": "required"},
        {"tools": TOOLS, "tool_choice": NAMED},
        {"response_format": JSON_SCHEMA},
    ],
)
def test_reasoning_that_never_ends(qwen3_server: Server, extra: dict[str, Any]) -> None:
    """No ``</think>`` (nor ``<think>``) before ``max_tokens``: the grammar never started, so
    the answer is the plain chat path's (the same request without the grammar: ``tool_choice``
    "none"), streamed or not: all reasoning, as vLLM 0.26's qwen3 parser starts inside it,
    no calls, ``content`` null (``""`` under a forced tool_choice, as vLLM)."""
    body = extra | {"logit_bias": {str(THINK_END): -100}, "max_tokens": 8, "seed": 0}
    msg, finish = _both(qwen3_server, body)
    assert finish == "length"
    assert msg["content"] == ("" if "tools" in extra else None)
    assert msg["reasoning_content"] and "tool_calls" not in msg
    plain = {k: v for k, v in body.items() if k != "response_format"}
    if "tools" in plain:
        plain["tool_choice"] = "none"
    assert _both(qwen3_server, plain) == (msg | {"content": None}, finish)


def test_prompt_that_opens_or_closes_think(qwen3_server: Server) -> None:
    """vLLM 0.26's qwen3 parser starts inside the reasoning: under a template that writes
    ``<think>`` into the prompt (Qwen3 "Thinking-2507") and under the stock one (no tag in the
    prompt) alike, an output without ``</think>`` is all reasoning, with or without a grammar
    that never started. A template that closes the reasoning in the prompt (``<think>\n\n</think>``,
    as thinking turned off writes it) makes it all answer, and a grammar then applies from the
    first token (vLLM's chat reads the prompt): the JSON is the content."""
    opens = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n<think>\n"
    )
    closes = opens + "\n</think>\n\n"
    body = {"logit_bias": {str(THINK_END): -100}, "max_tokens": 8, "seed": 0}
    msg, finish = _both(qwen3_server, body | {"chat_template": opens})
    assert finish == "length" and msg["content"] is None and msg["reasoning_content"]
    stock, _ = _both(qwen3_server, body)
    assert stock["content"] is None and stock["reasoning_content"]
    for extra in ({"tools": TOOLS, "tool_choice": NAMED}, {"response_format": JSON_SCHEMA}):
        # a grammar that never started reads the same
        forced = {"content": ""} if "tools" in extra else {}  # a forced tool_choice answers "" (vLLM)
        assert _both(qwen3_server, body | extra | {"chat_template": opens}) == (msg | forced, finish)
    answer, _ = _both(qwen3_server, body | {"chat_template": closes})
    assert answer["content"] and answer["reasoning_content"] is None
    fmt, fmt_finish = _both(
        qwen3_server, body | {"chat_template": closes, "response_format": JSON_SCHEMA, "max_tokens": 40}
    )
    assert fmt_finish == "stop" and fmt["reasoning_content"] is None
    jsonschema.validate(json.loads(fmt["content"]), TIME)


def test_reasoning_effort_switches_qwen3_thinking(qwen3_server: Server) -> None:
    """``reasoning_effort`` reaches Qwen3's template as vLLM passes it: ``"none"`` renders the
    prompt of ``enable_thinking: false`` (its empty think block) and turns the parser off (a
    ``<think>`` the model writes stays in ``content``); another effort is the thinking prompt,
    parsed (the model's ``<think>`` tags dropped). A value outside OpenAI's is a 400 naming the field."""
    think = {"logit_bias": {str(THINK_END - 1): 100}, "max_tokens": 3}  # <think>, then more of it

    def answer(extra: dict[str, Any]) -> tuple[dict[str, Any], int]:
        r = httpx.post(qwen3_server.url + "/v1/chat/completions", json=BASE | think | extra, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"], r.json()["usage"]["prompt_tokens"]

    default_msg, default_len = answer({})
    off_msg, off_len = answer({"chat_template_kwargs": {"enable_thinking": False}})
    none_msg, none_len = answer({"reasoning_effort": "none"})
    high_msg, high_len = answer({"reasoning_effort": "high"})
    assert none_len == off_len > default_len == high_len
    assert none_msg == off_msg and none_msg["content"].startswith("<think>") and none_msg["reasoning"] is None
    # parsed: the <think> tags are the reasoning's, each dropped (vLLM 0.26's qwen3), so nothing is left
    assert high_msg == default_msg and high_msg["content"] is None and high_msg["reasoning"] is None
    r = httpx.post(qwen3_server.url + "/v1/chat/completions", json=BASE | {"reasoning_effort": "huge"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort", r.text


def test_include_reasoning_false_over_http(qwen3_server: Server) -> None:
    """vLLM's ``include_reasoning: false``: the reasoning is parsed out and not returned, streamed
    or not; a stream of reasoning alone is the role chunk and the final one."""
    body = {"logit_bias": {str(THINK_END - 1): 100}, "max_tokens": 4, "include_reasoning": False}
    msg, finish = _both(qwen3_server, body)
    assert finish == "length" and msg["content"] is None and msg["reasoning"] is None
    r = httpx.post(
        qwen3_server.url + "/v1/chat/completions", json=BASE | body | {"stream": True}, timeout=120
    )
    events = [e for e in r.text.strip().split("\n\n") if not e.startswith(":")]
    assert events.pop() == "data: [DONE]" and len(events) == 2, events
    deltas = [json.loads(e.removeprefix("data: "))["choices"][0]["delta"] for e in events]
    assert deltas == [{"role": "assistant", "content": ""}, {}], deltas
    r = httpx.post(qwen3_server.url + "/v1/chat/completions", json=BASE | {"include_reasoning": "no"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "include_reasoning", r.text


def test_detokenize_takes_the_padded_vocabulary(qwen3_server: Server) -> None:
    """Ids past the tokenizer (151,669) but inside the model's vocabulary (151,936) are valid in
    prompts and can be sampled; ``/detokenize`` decodes them to "" as vLLM does, and refuses ids
    past the model's vocabulary."""
    r = httpx.post(qwen3_server.url + "/detokenize", json={"tokens": [151900, 9707, 151935]})
    assert r.status_code == 200 and r.json() == {"prompt": "Hello"}, r.text
    r = httpx.post(qwen3_server.url + "/detokenize", json={"tokens": [151936]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens", r.text
    assert "[0, 151936)" in r.json()["error"]["message"]


def test_tokenize_returns_token_strs_as_vllm(qwen3_server: Server) -> None:
    """vLLM's ``return_token_strs`` (prompt and messages forms): ``token_strs`` are the
    vocabulary's strings of the ids (byte-level BPE's ``Ġ``/``Ċ`` kept); null when not asked, as
    vLLM answers; a non-boolean is a 400 naming it. It was an unknown field (a 400)."""
    url = qwen3_server.url + "/tokenize"
    r = httpx.post(url, json={"prompt": "Hello world", "return_token_strs": True}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "tokens": [9707, 1879],
        "count": 2,
        "max_model_len": 1024,
        "token_strs": ["Hello", "Ġworld"],
    }
    for asked in ({}, {"return_token_strs": False}, {"return_token_strs": None}):
        r = httpx.post(url, json={"prompt": "Hello world"} | asked, timeout=60)
        assert r.status_code == 200 and r.json()["token_strs"] is None, r.text
    chat = {"messages": [{"role": "user", "content": "hi"}], "return_token_strs": True}
    r = httpx.post(url, json=chat, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["token_strs"] == [
        "<|im_start|>",
        "user",
        "Ċ",
        "hi",
        "<|im_end|>",
        "Ċ",
        "<|im_start|>",
        "assistant",
        "Ċ",
    ]
    assert len(body["token_strs"]) == body["count"] == len(body["tokens"])
    r = httpx.post(url, json={"prompt": "x", "return_token_strs": 1}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "return_token_strs", r.text


def _deep_tool_body(levels: int, path: str) -> bytes:
    """A request to ``path`` whose one tool's ``parameters`` nest ``levels`` objects, as JSON
    text (``json.dumps`` of the client runs out of recursion first; the server's parser takes it)."""
    inner = (
        '{"type": "object", "properties": {"a": ' * (levels - 1) + '{"type": "object"}' + "}}" * (levels - 1)
    )
    if path == "/v1/responses":
        tool = f'{{"type": "function", "name": "f", "parameters": {inner}}}'
        return f'{{"input": "hi", "max_output_tokens": 2, "tools": [{tool}]}}'.encode()
    tool = f'{{"type": "function", "function": {{"name": "f", "parameters": {inner}}}}}'
    limit = "" if path == "/tokenize" else '"max_tokens": 2, '
    return f'{{"messages": [{{"role": "user", "content": "hi"}}], {limit}"tools": [{tool}]}}'.encode()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/tokenize"])
def test_tool_parameters_nested_too_deeply_name_the_tool(qwen3_server: Server, path: str) -> None:
    """A tool whose ``parameters`` nest 400 objects (800 JSON levels) ran Qwen3's chat template
    out of Python's recursion limit: a 400 "chat template error: maximum recursion depth
    exceeded" naming ``messages`` (``input`` on the Responses API). It is a 400 naming ``tools``
    and the tool; a deep but bounded one still renders."""
    headers = {"Content-Type": "application/json"}
    r = httpx.post(qwen3_server.url + path, content=_deep_tool_body(400, path), headers=headers, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    where = "tools[0].parameters" if path == "/v1/responses" else "tools[0].function.parameters"
    assert error["param"] == "tools" and error["message"].startswith(f"{where} is nested too deeply"), error
    # 127 objects (254 levels, within the limit) render (counted by /tokenize: the prompt is
    # longer than the tiny model's context)
    ok = httpx.post(
        qwen3_server.url + "/tokenize", content=_deep_tool_body(127, "/tokenize"), headers=headers, timeout=60
    )
    assert ok.status_code == 200 and ok.json()["count"] > 1024, ok.text
