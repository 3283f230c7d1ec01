"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic's Messages API) on the
bundled model, served with ``--api-key``: text answers, the streamed event grammar (parsed here
as Anthropic's SDK reads it: ``event:`` lines and their JSON; the SDK itself is not installed),
``stop_sequences``, ``max_tokens``, the assistant prefill, ``count_tokens``, ``x-api-key`` and
the Anthropic error bodies that name the field at fault."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from surge.server.drain import DrainMiddleware, InFlight
from surge.server.protocol_messages import MessagesBody, MessagesRequest, chat_messages
from surge.server.serving_messages import _Blocks
from tests.server.conftest import Server, start_server

KEY = "sk-anthropic-test"
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
BASE: dict[str, Any] = {"messages": [{"role": "user", "content": "Once upon a time"}], "temperature": 0}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("serve-messages"), "--api-key", KEY)
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def _post(srv: Server, body: dict[str, Any], path: str = "/v1/messages", **kw: Any) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers=kw.pop("headers", HEADERS), timeout=120, **kw)


def _message(srv: Server, body: dict[str, Any]) -> dict[str, Any]:
    r = _post(srv, BASE | body)
    assert r.status_code == 200, r.text
    return r.json()


def _events(srv: Server, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The stream's events as (``event:`` name, JSON), checked against each other: every
    ``data`` names its event's type, and SSE comments (``: queued``) are skipped."""
    r = _post(srv, BASE | body | {"stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    out = []
    for raw in r.text.strip().split("\n\n"):
        lines = [line for line in raw.split("\n") if not line.startswith(":")]
        if not lines:
            continue
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ") and len(lines) == 2, raw
        name, data = lines[0].removeprefix("event: "), json.loads(lines[1].removeprefix("data: "))
        assert data["type"] == name
        out.append((name, data))
    return out


def _assembled(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The message a client builds from the events (as the SDK's stream accumulator does)."""
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    message = dict(events[0][1]["message"])
    blocks: list[dict[str, Any]] = []
    open_index = None
    for name, data in events[1:-2]:
        if name == "content_block_start":
            assert open_index is None and data["index"] == len(blocks)
            blocks.append(dict(data["content_block"]))
            open_index = data["index"]
        elif name == "content_block_delta":
            assert data["index"] == open_index
            block, delta = blocks[open_index], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                assert delta["type"] == "input_json_delta"
                block["partial"] = block.get("partial", "") + delta["partial_json"]
        else:
            assert name == "content_block_stop" and data["index"] == open_index, (name, data)
            open_index = None
    assert open_index is None
    for block in blocks:
        if block["type"] == "tool_use":  # arguments cut short are no object: {} as unstreamed
            partial = block.pop("partial", "{}")
            try:
                block["input"] = json.loads(partial)
            except ValueError:
                block["input"] = {}
    delta = events[-2][1]
    message.update(delta["delta"], content=blocks, usage=delta["usage"])
    return message


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two answers say the same (message and tool call ids, thinking signatures aside)."""

    def strip(m: dict[str, Any]) -> dict[str, Any]:
        blocks = [{k: v for k, v in b.items() if k not in ("signature", "id")} for b in m["content"]]
        return {k: v for k, v in m.items() if k != "id"} | {"content": blocks}

    assert strip(a) == strip(b)


def test_text_answer_streamed_and_not(srv: Server) -> None:
    m = _message(srv, {"max_tokens": 12})
    assert m["type"] == "message" and m["role"] == "assistant" and m["id"].startswith("msg_")
    assert [b["type"] for b in m["content"]] == ["text"] and m["content"][0]["text"]
    assert m["stop_reason"] == "max_tokens" and m["stop_sequence"] is None
    assert m["usage"]["output_tokens"] == 12
    events = _events(srv, {"max_tokens": 12})
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"] == {"input_tokens": m["usage"]["input_tokens"], "output_tokens": 0}
    assert start["model"] == m["model"] and start["id"].startswith("msg_")
    _same(_assembled(events), m)


def test_stop_sequence_names_the_sequence(srv: Server) -> None:
    """A stop sequence the output reaches ends it with ``stop_reason: stop_sequence`` and the
    sequence (Anthropic's answer; vLLM says ``end_turn``), the text before it; streamed the same."""
    free = _message(srv, {"max_tokens": 40})["content"][0]["text"]
    word = free.split()[4]
    body = {"max_tokens": 40, "stop_sequences": ["zzzq", word]}
    m = _message(srv, body)
    assert m["stop_reason"] == "stop_sequence" and m["stop_sequence"] == word
    assert free.startswith(m["content"][0]["text"]) and word not in m["content"][0]["text"]
    _same(_assembled(_events(srv, body)), m)
    done = _message(srv, {"max_tokens": 40, "stop_sequences": ["zzzq"]})
    assert done["stop_reason"] == "max_tokens" and done["stop_sequence"] is None


def test_prefill_is_continued_and_count_tokens_matches(srv: Server) -> None:
    """A last assistant message is continued (Anthropic's prefill): the answer is the text after
    it. ``count_tokens`` of the same body (sampling fields included) is the answer's
    ``input_tokens``; a system prompt (text blocks with ``cache_control``, inert) counts;
    ``metadata``, ``service_tier`` and the top-level ``cache_control`` are inert."""
    body = {
        "system": [{"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Once upon a time"}]},
            {"role": "assistant", "content": "there was a"},
        ],
        "max_tokens": 6,
        "metadata": {"user_id": "u1"},
        "cache_control": {"type": "ephemeral"},
        "service_tier": "standard_only",
    }
    m = _message(srv, body)
    counted = _post(srv, body, "/v1/messages/count_tokens")
    assert counted.status_code == 200 and counted.json() == {"input_tokens": m["usage"]["input_tokens"]}
    plain = _post(srv, {"messages": body["messages"]}, "/v1/messages/count_tokens").json()["input_tokens"]
    assert plain < m["usage"]["input_tokens"]
    tokenized = httpx.post(
        srv.url + "/tokenize",
        json={
            "messages": [{"role": "system", "content": "Be kind."}, *body["messages"]],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
        headers={"authorization": f"Bearer {KEY}"},
        timeout=60,
    ).json()
    assert tokenized["count"] == m["usage"]["input_tokens"]


def test_api_key_in_x_api_key_or_bearer_only_on_messages_routes(srv: Server) -> None:
    body = BASE | {"max_tokens": 1}
    assert _post(srv, body, headers={"authorization": f"Bearer {KEY}"}).status_code == 200
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = _post(srv, body, path, headers={"x-api-key": "wrong"})
        assert r.status_code == 401
        assert r.json() == {
            "type": "error",
            "error": {"type": "authentication_error", "message": "Invalid or missing API key."},
        }
        assert _post(srv, body, path).status_code == 200
    # the OpenAI routes keep their bearer token and their error body
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, headers=HEADERS, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0]",
        ),
        ({"max_tokens": 5, "top_logprobs": 2}, "top_logprobs"),
        ({"max_tokens": 5, "stop_sequences": "x"}, "stop_sequences"),
        ({"max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "s"}]}, "tools[0].type"),
        ({"max_tokens": 5, "thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
        ({"max_tokens": 5, "tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"max_tokens": 5, "thinking": {"type": "between_tools"}}, "thinking.type"),
        ({"max_tokens": 5, "thinking": {"type": "adaptive", "display": "full"}}, "thinking.display"),
        ({"max_tokens": 5, "speed": "fast"}, "speed"),
        ({"max_tokens": 5, "system": [{"type": "image"}]}, "system[0]"),
        ({"max_tokens": 5, "tools": [{"input_schema": {"type": "object"}}]}, "tools[0].name"),
        (
            {"max_tokens": 5, "output_config": {"format": {"type": "json_schema", "schema": {"type": "x"}}}},
            "output_config.format.schema:",
        ),
        # chat's tools[0].function.parameters is the Messages API's tools[0].input_schema
        (
            {"max_tokens": 5, "tools": [{"name": "f", "input_schema": {"type": "string"}}]},
            "tools[0].input_schema",
        ),
        # a type that is a list or an object (unhashable) is refused as any unknown type
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": []}]}]},
            "messages[0].content[0]",
        ),
        ({"max_tokens": 5, "system": [{"type": {}}]}, "system[0]"),
        ({"max_tokens": 5, "tool_choice": {"type": ["auto"]}}, "tool_choice.type"),
        ({"max_tokens": 5, "thinking": {"type": {"enabled": True}}}, "thinking.type"),
        (
            {
                "max_tokens": 5,
                "messages": [
                    {"role": "user", "content": "Time?"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                    },
                ],
            },
            "messages[1]",
        ),
        # a tool_result that answers no tool_use of the assistant message before it (Anthropic's 400)
        (
            {
                "max_tokens": 5,
                "messages": [
                    {"role": "user", "content": "Time?"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "WRONG", "content": "x"}],
                    },
                ],
            },
            "messages[2].content[0].tool_use_id",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}
                ],
            },
            "messages[0].content[0].tool_use_id",
        ),
        # metadata has user_id only, as Anthropic's
        ({"max_tokens": 5, "metadata": {"user_id": "u", "x": 1}}, "metadata.x"),
    ],
)
def test_bad_requests_are_anthropic_errors_naming_the_field(
    srv: Server, body: dict[str, Any], named: str
) -> None:
    request = {k: v for k, v in (BASE | body).items() if v is not None}
    r = _post(srv, request)
    assert r.status_code == 400, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert named in error["error"]["message"], error


def test_tool_choice_errors_speak_anthropic(srv: Server) -> None:
    """Tools ask for ``{"type": "auto"}`` by default, as in Anthropic's API (and vLLM), which needs
    ``--tool-call-parser``: the 400 says so in the Messages API's words, not chat's."""
    tools = [{"name": "get_time", "input_schema": {"type": "object"}}]
    r = _post(srv, BASE | {"max_tokens": 5, "tools": tools})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and '{"type": "auto"}' in message and '{"type": "any"}' in message, message
    assert '"required"' not in message
    schema_format = {"format": {"type": "json_schema", "schema": {"type": "object"}}}
    r = _post(
        srv,
        BASE
        | {"max_tokens": 5, "tools": tools, "tool_choice": {"type": "any"}, "output_config": schema_format},
    )
    message = r.json()["error"]["message"]
    assert (
        r.status_code == 400 and "output_config.format" in message and "structured output" not in message
    ), message


def test_a_bad_tool_name_is_an_anthropic_400(srv: Server) -> None:
    """A tool name outside ``^[a-zA-Z0-9_-]{1,64}$`` (Anthropic's pattern, and OpenAI's) is a 400
    in Anthropic's body naming the Messages API's path, ``tools[0].name``."""
    tools = [{"name": "get time", "input_schema": {"type": "object"}}]
    r = _post(srv, BASE | {"max_tokens": 5, "tools": tools, "tool_choice": {"type": "any"}})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error", error
    assert error["message"].startswith(
        "tools[0].name 'get time' does not match the pattern '^[a-zA-Z0-9_-]{1,64}$'"
    ), error


def test_unknown_model_is_an_anthropic_404(srv: Server) -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = _post(srv, BASE | {"model": "claude-nope", "max_tokens": 5}, path)
        assert r.status_code == 404
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "not_found_error"
        assert "claude-nope" in r.json()["error"]["message"]


def test_chat_messages_render_tool_results_and_thinking() -> None:
    """The conversation a request renders: the system prompt first (an inline system turn
    joins it, and Claude Code's billing header, a hash that changes every request, is dropped,
    as vLLM does both), an assistant's thinking, text and tool_use blocks as one message, a
    user's tool results as ``tool`` messages before its text (``is_error`` said in the text);
    only a last assistant turn is continued."""
    body = MessagesBody.model_validate(
        {
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=ab12;"},
                {"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}},
            ],
            "messages": [
                {"role": "user", "content": "Time?"},
                {"role": "system", "content": [{"type": "text", "text": "T"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "x"},
                        {"type": "redacted_thinking", "data": "opaque"},
                        {"type": "text", "text": "Let me see.", "citations": None},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {"zone": "UTC"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {"zone": "X"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "12:00"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_2",
                            "content": [{"type": "text", "text": "no such zone"}],
                            "is_error": True,
                        },
                        {"type": "text", "text": "Thanks"},
                    ],
                },
            ],
        }
    )
    messages, continues = chat_messages(body)
    call = {
        "id": "toolu_1",
        "type": "function",
        "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'},
    }
    call2 = {
        "id": "toolu_2",
        "type": "function",
        "function": {"name": "get_time", "arguments": '{"zone": "X"}'},
    }
    assert messages == [
        {"role": "system", "content": [{"type": "text", "text": "S"}, {"type": "text", "text": "T"}]},
        {"role": "user", "content": "Time?"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Let me see."}],
            "reasoning": "hmm",
            "tool_calls": [call, call2],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "12:00"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such zone"},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
    ]
    assert not continues


def test_every_field_is_in_the_docs() -> None:
    """Every field of the Messages body is honoured, inert or refused in the docs' section."""
    doc = (Path(__file__).parents[2] / "docs" / "openai-api.md").read_text()
    section = doc[doc.index("## Messages API (Anthropic)") : doc.index("## `/tokenize`")]
    for name in MessagesRequest.model_fields:
        assert f"`{name}`" in section, f"MessagesRequest.{name} is not in docs/openai-api.md"


def test_openapi_documents_anthropic_errors(srv: Server) -> None:
    schema = httpx.get(srv.url + "/openapi.json", timeout=60).json()
    ref = {"$ref": "#/components/schemas/AnthropicErrorResponse"}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        responses = schema["paths"][path]["post"]["responses"]
        for status in ("400", "401", "404"):
            assert responses[status]["content"]["application/json"]["schema"] == ref, (path, status)
    assert "text/event-stream" in schema["paths"]["/v1/messages"]["post"]["responses"]["200"]["content"]
    chat = schema["paths"]["/v1/chat/completions"]["post"]["responses"]["400"]["content"]
    assert chat["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}


def test_a_draining_server_answers_the_messages_routes_with_anthropic_errors() -> None:
    """The drain gate's 503 (a shutdown under way) is Anthropic's body on the Messages API's
    routes (``overloaded_error``: a client retries elsewhere), OpenAI's elsewhere."""
    in_flight = InFlight()
    in_flight.draining = True

    async def never(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("a draining server does not serve")

    def answer(path: str) -> dict[str, Any]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        scope = {"type": "http", "path": path, "method": "POST", "headers": []}
        asyncio.run(DrainMiddleware(never, in_flight)(scope, receive, send))
        assert sent[0]["status"] == 503
        return json.loads(sent[1]["body"])

    message = {"type": "overloaded_error", "message": "The server is shutting down."}
    assert (
        answer("/v1/messages") == answer("/v1/messages/count_tokens") == {"type": "error", "error": message}
    )
    assert answer("/v1/chat/completions")["error"]["code"] == "server_shutting_down"


def _call(index: int, arguments: str, name: str | None = None) -> dict[str, Any]:
    fn: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        fn["name"] = name
    call: dict[str, Any] = {"index": index, "function": fn}
    if name is not None:
        call["id"] = f"call_{index}"
    return call


@pytest.mark.parametrize(
    ("finish", "stop", "arguments", "reason"),
    [
        ("tool_calls", None, ['{"zone": ', '"UTC"}'], ("tool_use", None)),  # an "auto" call
        ("stop", None, ['{"zone": "UTC"}'], ("tool_use", None)),  # a named call keeps chat's "stop"
        ("length", None, ['{"zone": "U'], ("max_tokens", None)),
        ("stop", "UT", ['{"zone": "'], ("stop_sequence", "UT")),
        ("stop", None, ["[1, 2]"], ("end_turn", None)),  # no JSON object: no input to run
    ],
)
def test_blocks_and_stop_reason_of_an_answer(
    finish: str, stop: str | None, arguments: list[str], reason: tuple[str, str | None]
) -> None:
    """Text, then a tool call: a text block, then a ``tool_use`` block whose ``input`` is the
    arguments' JSON object (``{}`` when they are none), and the stop reason the engine's finish
    and the call decide; the events index the blocks in order."""
    blocks = _Blocks()
    events = blocks.feed({"content": "Let me check."})
    events += blocks.feed({"tool_calls": [_call(0, arguments[0], "get_time")]})
    for piece in arguments[1:]:
        events += blocks.feed({"tool_calls": [_call(0, piece)]})
    events += blocks.close()
    parsed = [json.loads(e.split(b"\ndata: ")[1]) for e in events]
    assert [(p["type"], p.get("index")) for p in parsed] == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        *[("content_block_delta", 1)] * len(arguments),
        ("content_block_stop", 1),
    ]
    try:
        expected = json.loads("".join(arguments))
    except ValueError:
        expected = {}
    assert blocks.blocks == [
        {"type": "text", "text": "Let me check."},
        {
            "type": "tool_use",
            "id": "call_0",
            "name": "get_time",
            "input": expected if isinstance(expected, dict) else {},
        },
    ]
    assert blocks.stop_reason(finish, stop) == reason


def test_unstreamed_answer_drops_blank_text_next_to_tool_use() -> None:
    """Qwen3's ``"\\n\\n"`` between ``</think>`` and its calls is no text block of an unstreamed
    answer with a ``tool_use`` block (it was one, holding only the whitespace, where chat's answer
    has ``content: null``); without a call, blank text stays the answer."""
    blocks = _Blocks()
    blocks.feed({"reasoning": "think"})
    blocks.feed({"content": "\n\n"})
    blocks.feed({"tool_calls": [_call(0, '{"zone": "UTC"}', "get_time")]})
    blocks.feed({"content": " "})
    blocks.close()
    blocks.drop_blank_text()
    assert [b["type"] for b in blocks.blocks] == ["thinking", "tool_use"]
    assert blocks.stop_reason("tool_calls", None) == ("tool_use", None)
    plain = _Blocks()
    plain.feed({"content": "\n\n"})
    plain.close()
    plain.drop_blank_text()
    assert plain.blocks == [{"type": "text", "text": "\n\n"}]


def test_count_tokens_refuses_the_stop_sequences_a_message_refuses(srv: Server) -> None:
    """An empty stop sequence is a 400 naming stop_sequences on both routes (count_tokens said
    200 to a body /v1/messages refuses)."""
    body = BASE | {"max_tokens": 4, "stop_sequences": [""]}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = _post(srv, body, path)
        assert r.status_code == 400, (path, r.text)
        # in the Messages API's words (it said "stop must not contain an empty string", chat's field)
        assert "stop_sequences must not contain an empty string" in r.json()["error"]["message"], (
            path,
            r.text,
        )


def test_a_bad_role_is_refused_naming_the_roles_taken() -> None:
    """A role other than the three taken is a 400 that lists them: it said 'user' or 'assistant'
    only, though vLLM's 'system' is taken too (docs/openai-api.md)."""
    from surge.server.errors import ApiError

    with pytest.raises(ApiError) as e:
        chat_messages(
            MessagesBody.model_validate({"max_tokens": 1, "messages": [{"role": "tool", "content": "x"}]})
        )
    assert e.value.param == "messages[0].role", e.value.param
    assert "'user', 'assistant' or (vLLM's) 'system'" in e.value.message, e.value.message


@pytest.mark.parametrize(
    ("block", "param", "says"),
    [
        (None, "messages[0].content[0]", "must be an object with a 'type'"),
        ("hi", "messages[0].content[0]", "must be an object with a 'type'"),
        ({"text": "hi"}, "messages[0].content[0].type", "must be a string"),
        ({"type": ["text"], "text": "hi"}, "messages[0].content[0].type", "must be a string"),
    ],
)
def test_a_block_that_is_not_an_object_with_a_type_says_so(block: Any, param: str, says: str) -> None:
    """A content block that is not an object, or has no string ``type``, was refused as a block
    "of type None" that Surge "does not take" (``does not take None blocks``): the 400 says what
    is wrong with it."""
    from surge.server.errors import ApiError

    body = {"max_tokens": 1, "messages": [{"role": "user", "content": [block]}]}
    with pytest.raises(ApiError) as e:
        chat_messages(MessagesBody.model_validate(body))
    assert (e.value.param, e.value.status) == (param, 400), e.value.message
    assert e.value.message == f"{param} {says}" + (
        " (a content block)" if says.startswith("must be an object") else " (the block's type)"
    ), e.value.message
