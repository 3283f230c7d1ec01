"""Tool calling over HTTP with the openai SDK against `surge serve --tool-call-parser hermes`
(bundled model): forced calls (required, named) always parse with valid arguments, streamed
calls arrive name first and join to the non-streamed ones, auto calls go through the hermes
parser. The bundled model has no ``<think>`` token, so a reasoning parser is refused for it:
tests/server/test_reasoning_tools_qwen3.py tests tools with the reasoning parser."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from surge.server.chat_tools import check_tools
from surge.server.errors import ApiError
from tests.server.conftest import Server, start_server

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "pattern": "^[A-Z][a-z]{1,6}$"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MSGS: list[Any] = [{"role": "user", "content": "Weather?"}]


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("serve-tools"), "--tool-call-parser", "hermes")
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


@pytest.fixture(scope="module")
def client(tool_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=tool_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _valid(calls: list[Any]) -> list[tuple[str, str]]:
    out = []
    for call in calls:
        assert call.type == "function" and call.id
        name, args = call.function.name, call.function.arguments
        jsonschema.validate(json.loads(args), SCHEMAS[name])
        out.append((name, args))
    return out


def _stream_calls(stream: Any) -> tuple[list[tuple[str, str]], str | None, str]:
    calls: dict[int, list[str]] = {}
    finish, content = None, ""
    for chunk in stream:
        for c in chunk.choices:
            content += c.delta.content or ""
            for t in c.delta.tool_calls or []:
                if t.function.name is not None:
                    assert t.index not in calls and t.id
                    calls[t.index] = [t.function.name, ""]
                calls[t.index][1] += t.function.arguments or ""
            finish = c.finish_reason or finish
    return [(n, a) for n, a in (calls[i] for i in sorted(calls))], finish, content


def test_required_tool_choice_always_valid(client: openai.OpenAI) -> None:
    model = _model(client)
    for seed in range(8):
        kwargs: dict[str, Any] = dict(
            model=model,
            messages=MSGS,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=seed % 2 == 0,
            temperature=1.0,
            seed=seed,
            max_tokens=120,
        )
        r = client.chat.completions.create(**kwargs)
        msg = r.choices[0].message
        if r.choices[0].finish_reason == "length":  # parallel calls of a random model may go on
            assert kwargs["parallel_tool_calls"]
            continue
        assert r.choices[0].finish_reason == "tool_calls"
        assert msg.content == ""  # a forced tool_choice's answer is "" next to its calls, as vLLM 0.26
        calls = _valid(msg.tool_calls or [])
        assert calls and (len(calls) == 1 or kwargs["parallel_tool_calls"])
        streamed, finish, content = _stream_calls(client.chat.completions.create(**kwargs, stream=True))
        assert streamed == calls and finish == "tool_calls" and content == ""


def test_named_tool_choice(client: openai.OpenAI) -> None:
    """A complete forced named call finishes with "stop" (OpenAI and vLLM give "tool_calls"
    only for auto and required calls), streamed and not."""
    choice: Any = {"type": "function", "function": {"name": "get_time"}}
    for seed in range(4):
        kwargs: dict[str, Any] = dict(
            model=_model(client), messages=MSGS, tools=TOOLS, tool_choice=choice, seed=seed, max_tokens=60
        )
        r = client.chat.completions.create(**kwargs)
        calls = _valid(r.choices[0].message.tool_calls or [])
        assert [n for n, _ in calls] == ["get_time"] and r.choices[0].finish_reason == "stop"
        streamed, finish, _ = _stream_calls(client.chat.completions.create(**kwargs, stream=True))
        assert streamed == calls and finish == "stop"


def test_named_call_cut_by_max_tokens(client: openai.OpenAI) -> None:
    """A named call that max_tokens cuts is still that call, as vLLM answers it: not streamed,
    ``tool_calls`` holds the function with the arguments written so far (JSON that does not
    parse), ``content`` is ``""`` (vLLM's forced tool_choice) and finish_reason "length"; streamed, the same call's pieces
    join to the same arguments, with the same finish reason (also for each of n choices)."""
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    for seed, n in ((0, 1), (1, 2)):
        kwargs: dict[str, Any] = dict(
            model=_model(client), messages=MSGS, tools=TOOLS, tool_choice=named, seed=seed, max_tokens=3, n=n
        )
        r = client.chat.completions.create(**kwargs)
        assert len(r.choices) == n
        for choice in r.choices:
            msg = choice.message
            assert choice.finish_reason == "length" and msg.content == ""
            [call] = msg.tool_calls or []
            assert call.type == "function" and call.id and call.function.name == "get_weather"
            assert call.function.arguments.lstrip().startswith("{")
            with pytest.raises(ValueError):
                json.loads(call.function.arguments)
        if n == 1:
            streamed, finish, content = _stream_calls(client.chat.completions.create(**kwargs, stream=True))
            assert streamed == [("get_weather", call.function.arguments)]
            assert finish == "length" and content == ""


KEYS = ['"city"', '"unit"', '"zone"']
"""Stop strings that cut a forced call inside its arguments: the first key of either tool."""


@pytest.mark.parametrize(
    ("choice", "cut"),
    [
        ("required", {"max_tokens": 40}),
        ("required", {"max_tokens": 80, "stop": KEYS}),
        ({"type": "function", "function": {"name": "get_weather"}}, {"max_tokens": 80, "stop": KEYS}),
    ],
    ids=["required-length", "required-stop", "named-stop"],
)
def test_forced_calls_cut_short_read_the_same_streamed_and_not(
    client: openai.OpenAI, choice: Any, cut: dict[str, Any]
) -> None:
    """A forced call that ``max_tokens`` or a stop string cuts inside its arguments: not
    streamed, ``tool_calls`` holds the calls written so far, the last with the arguments written
    so far (JSON that does not parse), ``content`` is ``""`` (as vLLM), and the finish reason is the
    engine's ("length" or "stop", never "tool_calls": the calls are not complete); streamed, the
    same calls with the same finish reason. (A ``required`` array used to come back as
    ``content`` with no calls when not streamed, while the stream sent the calls.)"""
    kwargs: dict[str, Any] = dict(
        model=_model(client), messages=MSGS, tools=TOOLS, tool_choice=choice, seed=0, **cut
    )
    r = client.chat.completions.create(**kwargs)
    msg = r.choices[0].message
    calls = [(t.function.name, t.function.arguments) for t in msg.tool_calls or []]
    reason = "stop" if "stop" in cut else "length"
    assert r.choices[0].finish_reason == reason and msg.content == "" and calls, msg
    assert calls[-1][1].lstrip().startswith("{")
    with pytest.raises(ValueError):
        json.loads(calls[-1][1])
    streamed, finish, content = _stream_calls(client.chat.completions.create(**kwargs, stream=True))
    assert streamed == calls and finish == reason and content == ""


def _hermes_call_request(client: openai.OpenAI, max_tokens: int) -> dict[str, Any]:
    """A chat request whose answer a regex forces to ``Sure. `` and one hermes get_weather call."""
    regex = r'Sure\. <tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)", "unit": "c"\}\}\n</tool_call>'
    return dict(
        model=_model(client),
        messages=MSGS,
        tools=TOOLS,
        max_tokens=max_tokens,
        temperature=1.0,
        seed=1,
        extra_body={"structured_outputs": {"regex": regex}},
    )


def test_auto_goes_through_the_hermes_parser(client: openai.OpenAI) -> None:
    kwargs = _hermes_call_request(client, max_tokens=100)
    r = client.chat.completions.create(**kwargs)
    msg = r.choices[0].message
    assert msg.content == "Sure. "
    assert r.choices[0].finish_reason == "tool_calls"
    calls = _valid(msg.tool_calls or [])
    assert calls[0][0] == "get_weather"
    streamed, finish, content = _stream_calls(client.chat.completions.create(**kwargs, stream=True))
    assert streamed == calls and finish == "tool_calls" and content == "Sure. "
    none = client.chat.completions.create(**kwargs | {"tool_choice": "none"})
    assert none.choices[0].message.tool_calls is None
    assert "<tool_call>" in (none.choices[0].message.content or "")


def test_auto_call_cut_by_max_tokens(client: openai.OpenAI) -> None:
    """A hermes call cut by max_tokens: not streamed, the answer is the raw text as content with
    no tool_calls (as vLLM; no arguments that do not parse); streamed, the call's deltas went out
    as generated (a stream cannot take them back)."""
    kwargs = _hermes_call_request(client, max_tokens=60)
    raw = client.chat.completions.create(**kwargs | {"tool_choice": "none"}).choices[0].message.content
    assert raw is not None and raw.startswith('Sure. <tool_call>\n{"name": "get_weather", "arguments": {')
    r = client.chat.completions.create(**kwargs)
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == raw
    streamed, finish, content = _stream_calls(client.chat.completions.create(**kwargs, stream=True))
    assert finish == "length" and content == "Sure. "
    assert [name for name, _ in streamed] == ["get_weather"]
    assert raw.endswith(streamed[0][1])


def test_auto_call_complete_but_cut_before_the_end_is_length(client: openai.OpenAI) -> None:
    """A hermes call written whole (``</tool_call>`` included) that max_tokens cuts before the
    model's end: the call is in ``tool_calls``, streamed and not, and finish_reason is "length"
    in both: "tool_calls" means the model ended on its own with every call complete (vLLM 0.26
    says "tool_calls" here, and streamed for any call it began, cut or not); after the cut the
    model might have written more calls."""
    whole = client.chat.completions.create(**_hermes_call_request(client, max_tokens=100))
    assert whole.choices[0].finish_reason == "tool_calls" and whole.usage is not None
    calls = _valid(whole.choices[0].message.tool_calls or [])
    kwargs = _hermes_call_request(client, max_tokens=whole.usage.completion_tokens - 1)  # all but the EOS
    r = client.chat.completions.create(**kwargs)
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content == "Sure. "
    assert _valid(r.choices[0].message.tool_calls or []) == calls
    streamed, finish, content = _stream_calls(client.chat.completions.create(**kwargs, stream=True))
    assert streamed == calls and finish == "length" and content == "Sure. "


def _events(srv: Server, body: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The streamed choices of a chat request (one choice per chunk) and its final usage."""
    body = body | {"stream": True, "stream_options": {"include_usage": True}}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    events = [e.removeprefix("data: ") for e in r.text.strip().split("\n\n") if not e.startswith(":")]
    assert events.pop() == "[DONE]"
    chunks = [json.loads(e) for e in events]
    return [c["choices"][0] for c in chunks if c["choices"]], chunks[-1]["usage"]


def _delta_carries(choice: dict[str, Any]) -> bool:
    d = choice["delta"]
    return bool(d.get("content") or d.get("reasoning_content") or d.get("tool_calls"))


def _entries(choice: dict[str, Any]) -> list[dict[str, Any]]:
    return (choice["logprobs"] or {}).get("content") or []


def test_parsed_streams_send_no_empty_chunks(tool_server: Server) -> None:
    """Through a parser (forced tool calls, the hermes parser; the reasoning parser's test is in
    tests/server/test_reasoning_tools_qwen3.py) a chunk
    whose delta carries nothing is not sent (vLLM skips them): only the first chunk (the role)
    and the final one (finish_reason) may carry no text. With logprobs, every token's entry
    still arrives, in a chunk of its own when the parser kept the text."""
    forced: dict[str, Any] = dict(
        messages=MSGS, tools=TOOLS, tool_choice="required", temperature=1.0, seed=1, max_tokens=60
    )
    auto_regex = r'<tool_call>\n\{"name": "get_time", "arguments": \{"zone": "UTC"\}\}\n</tool_call>'
    auto = dict(messages=MSGS, tools=TOOLS, max_tokens=60, seed=2, structured_outputs={"regex": auto_regex})
    for body in (forced, auto):
        choices, usage = _events(tool_server, body)
        assert choices[0]["delta"]["role"] == "assistant" and choices[-1]["finish_reason"] is not None
        assert all(_delta_carries(c) for c in choices[1:-1]), [c["delta"] for c in choices]
        assert len(choices) < usage["completion_tokens"], "the parser's empty chunks are gone"
        # with logprobs, the chunks that carry only entries stay: every token has its entry
        choices, usage = _events(tool_server, body | {"logprobs": True})
        middle = choices[1:-1]
        assert all(_delta_carries(c) or _entries(c) for c in middle)
        assert any(_entries(c) and not _delta_carries(c) for c in middle)
        streamed = [e["token"] for c in choices for e in _entries(c)]
        full = httpx.post(
            tool_server.url + "/v1/chat/completions", json=body | {"logprobs": True}, timeout=120
        )
        assert streamed == [e["token"] for e in full.json()["choices"][0]["logprobs"]["content"]]
        assert len(streamed) == usage["completion_tokens"]


def test_held_chunks_carry_no_content_key(tool_server: Server) -> None:
    """A chunk sent while the hermes parser holds a call's markup (it carries logprobs entries or
    return_token_ids ids) has the delta ``{}``, as vLLM's empty DeltaMessage, not
    ``{"content": ""}``; nor does the final chunk of a choice with calls: after the role chunk no
    delta carries an empty content, so the joined content stays null as the message's."""
    regex = r'<tool_call>\n\{"name": "get_time", "arguments": \{"zone": "UTC"\}\}\n</tool_call>'
    body: dict[str, Any] = dict(
        messages=MSGS, tools=TOOLS, max_tokens=120, seed=2, structured_outputs={"regex": regex}
    )
    for extra in ({"logprobs": True}, {"return_token_ids": True}):
        full = httpx.post(tool_server.url + "/v1/chat/completions", json=body | extra, timeout=120).json()
        msg = full["choices"][0]["message"]
        assert msg["content"] is None and msg["tool_calls"][0]["function"]["name"] == "get_time"
        choices, _ = _events(tool_server, body | extra)
        assert choices[-1]["finish_reason"] == "tool_calls"
        held = [c["delta"] for c in choices[1:] if not _delta_carries(c)]
        assert held and all(d == {} for d in held), held
        joined = None
        for c in choices[1:]:
            if "content" in c["delta"]:
                joined = (joined or "") + c["delta"]["content"]
        assert joined is None


def test_history_with_tool_messages(client: openai.OpenAI) -> None:
    """A conversation with an assistant's tool call and the tool's answer renders and answers."""
    history: list[Any] = [
        *MSGS,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    r = client.chat.completions.create(model=_model(client), messages=history, tools=TOOLS, max_tokens=5)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_tool_errors(client: openai.OpenAI, server: Server) -> None:
    plain = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    deep = [{"type": "function", "function": {"name": "f", "parameters": _nested(200)}}]
    cases: list[tuple[openai.OpenAI, dict[str, Any], str]] = [
        (plain, {"tools": TOOLS}, "tool_choice"),  # auto without --tool-call-parser
        (client, {"tools": [{"type": "function", "function": {}}]}, "tools"),
        (
            client,
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        (client, {"tool_choice": "required"}, "tool_choice"),
        (
            client,
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "tool_choice",
        ),
        (
            client,
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "bad"}}}],
                "tool_choice": "required",
            },
            "tools",
        ),
        (client, {"tools": deep, "tool_choice": "required"}, "tools"),  # was a 500 (RecursionError)
        # arguments that are not an object, and two tools of one name, were accepted
        (
            client,
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
            "tools",
        ),
        (client, {"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
        # a root that chooses its own values: a forced call's arguments were 5988288238
        (
            client,
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"anyOf": [{"type": "integer"}]}},
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
        ),
        (
            client,
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "object", "enum": [1]}},
                    }
                ]
            },
            "tools",
        ),
        (
            client,
            {"tools": [{"type": "function", "function": {"name": "f", "foo": 1}}]},
            "tools",
        ),  # was ignored
        (client, {"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}, "tools"),
        (client, {"tools": [{"type": "function", "function": {"name": "f", "description": 7}}]}, "tools"),
        (client, {"tools": []}, "tools"),  # was taken as no tools (OpenAI and vLLM refuse it)
        (client, {"tools": [], "tool_choice": "none"}, "tools"),
        # keys beside the SDK's were ignored: a tool's (ChatCompletionFunctionToolParam) and a
        # named choice's (ChatCompletionNamedToolChoiceParam)
        (client, {"tools": [{**TOOLS[0], "strict": True}], "tool_choice": "required"}, "tools"),
        (
            client,
            {
                "tools": TOOLS,
                "tool_choice": {"type": "function", "function": {"name": "get_time"}, "strict": True},
            },
            "tool_choice",
        ),
        (
            client,
            {
                "tools": TOOLS,
                "tool_choice": {"type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            },
            "tool_choice",
        ),
    ]
    for c, extra, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=_model(c), messages=MSGS, max_tokens=5, **extra)
        assert e.value.body["param"] == param, e.value.body  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=_model(client), prompt="x", extra_body={"tools": TOOLS})
    assert e.value.body["param"] == "tools"  # type: ignore[index]


def test_tokenize_counts_messages_with_tools_as_chat_completions_do(tool_server: Server) -> None:
    """/tokenize refused a `tools` field (chat prompts with tools could not be counted); as in
    vLLM it renders them through the chat template, and the count is the chat completion's
    prompt_tokens; the same checks apply, and with a plain prompt tools are a 400."""
    url = tool_server.url
    with_tools = httpx.post(url + "/tokenize", json={"messages": MSGS, "tools": TOOLS}, timeout=60)
    assert with_tools.status_code == 200, with_tools.text
    plain = httpx.post(url + "/tokenize", json={"messages": MSGS}, timeout=60).json()
    assert with_tools.json()["count"] > plain["count"]
    for choice in ("none", "required"):
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"messages": MSGS, "tools": TOOLS, "tool_choice": choice, "max_tokens": 1},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == with_tools.json()["count"]
    for bad in ([{"type": "function", "function": {"name": ""}}], {"get_weather": {}}):
        r = httpx.post(url + "/tokenize", json={"messages": MSGS, "tools": bad}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    r = httpx.post(url + "/tokenize", json={"prompt": "Weather?", "tools": TOOLS}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    assert httpx.post(url + "/tokenize", json={"messages": MSGS, "tools": None}, timeout=60).json() == plain


def test_an_empty_tools_list_is_refused_on_chat_only() -> None:
    """``tools: []`` on a chat completion is a 400 naming ``tools``, as OpenAI and vLLM answer it;
    where an empty list is the API's own "no tools" (the Responses API's default, Anthropic's
    Messages API, the batch endpoint, which vLLM gives no tools field), it still means no tools."""
    from surge.server import protocol_messages, protocol_responses
    from surge.server.chat_tools import plan_chat
    from surge.server.errors import ApiError
    from surge.server.protocol import BatchChatCompletionRequest, ChatCompletionRequest

    body = ChatCompletionRequest.model_validate({"messages": MSGS, "tools": []})
    with pytest.raises(ApiError) as e:
        plan_chat(body, None, "hermes", None)
    assert e.value.param == "tools" and "empty" in str(e.value)
    assert protocol_responses.chat_tools([]) is None
    assert protocol_messages._chat_tools([]) is None
    batch = BatchChatCompletionRequest.model_validate({"messages": [MSGS], "tools": []})
    assert batch.conversation(0).tools is None


@pytest.mark.parametrize(
    ("path", "body", "param", "tool"),
    [
        ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 2}, "messages", TOOLS[0]),
        ("/v1/chat/completions/render", {"messages": MSGS}, "messages", TOOLS[0]),
        (
            "/v1/responses",
            {"input": "Weather?", "max_output_tokens": 16},
            "input",
            {"type": "function", "name": "get_weather", "parameters": WEATHER},
        ),
        (
            "/v1/messages",
            {"messages": MSGS, "max_tokens": 2},
            None,
            {"name": "get_weather", "input_schema": WEATHER},
        ),
    ],
)
@pytest.mark.parametrize("description_words", [300, 30_000])  # over the context; over the cheap bound
def test_a_prompt_too_long_for_its_tools_says_so(
    tool_server: Server,
    path: str,
    body: dict[str, Any],
    param: str | None,
    tool: dict[str, Any],
    description_words: int,
) -> None:
    """Tools make the prompt (the chat template renders them): a prompt too long because of a
    tool's description blamed the messages alone (found by test_fuzz_requests.py)."""
    described = json.loads(json.dumps(tool))
    target = described.get("function", described)
    target["description"] = "very " * description_words
    r = httpx.post(tool_server.url + path, json={**body, "tools": [described]}, timeout=60)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert "maximum context length" in err["message"], err
    assert err["message"].endswith(" The chat template renders the 1 tool of 'tools' into the prompt too."), (
        err
    )
    assert err.get("param") == param
    r = httpx.post(tool_server.url + path, json=body, timeout=60)  # without tools: no note
    assert r.status_code == 200, r.text[:300]


@pytest.mark.parametrize(
    ("path", "body", "param", "part"),
    [
        ("/v1/messages", {"messages": MSGS, "max_tokens": 2, "system": "very " * 30_000}, None, "system"),
        (
            "/v1/messages",
            {"messages": MSGS, "max_tokens": 2, "system": [{"type": "text", "text": "very " * 700}]},
            None,
            "system",
        ),
        ("/v1/responses", {"input": "Weather?", "instructions": "very " * 700}, "input", "instructions"),
    ],
)
def test_a_prompt_too_long_for_its_system_prompt_says_so(
    tool_server: Server, path: str, body: dict[str, Any], param: str | None, part: str
) -> None:
    """The Messages API's ``system`` and the Responses API's ``instructions`` are rendered into the
    prompt as a system message: a prompt too long because of them blamed the messages (the
    input) alone (found by test_fuzz_requests.py)."""
    r = httpx.post(tool_server.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert "maximum context length" in err["message"], err
    assert err["message"].endswith(f" The chat template renders '{part}' into the prompt too."), err
    assert err.get("param") == param


@pytest.mark.parametrize(
    "name", ["get.weather", "get weather", "wetter_für", "f\n", "f/g", "a" * 65, "<tool_call>"]
)
def test_tool_names_outside_openais_pattern_are_refused(name: str) -> None:
    """OpenAI refuses a function name outside ``^[a-zA-Z0-9_-]{1,64}$`` with a 400 naming
    ``tools[i].function.name``; Surge took any non-empty string (a dot, a space, a newline, markup
    of the tool-call format) and rendered it into the prompt. The message names the field and the
    pattern; names of the pattern, 64 characters long too, stay accepted."""
    tools = [TOOLS[0], {"type": "function", "function": {"name": name}}]
    with pytest.raises(ApiError) as e:
        check_tools(tools)
    assert e.value.status == 400 and e.value.param == "tools", e.value
    assert e.value.message.startswith(f"tools[1].function.name {name!r} does not match the pattern"), e.value
    assert "'^[a-zA-Z0-9_-]{1,64}$'" in e.value.message, e.value.message
    for good in ("f", "get_weather", "Get-Time-2", "_", "-", "a" * 64):
        assert check_tools([{"type": "function", "function": {"name": good}}])
    with pytest.raises(ApiError) as e:  # a huge name is not echoed whole
        check_tools([{"type": "function", "function": {"name": name * 10_000}}])
    assert len(e.value.message) < 300 and "'... does not match the pattern" in e.value.message


def test_a_bad_tool_name_is_an_openai_400_body(tool_server: Server) -> None:
    """Over HTTP the name check is the OpenAI error body of the other tool errors, on chat
    completions and on /tokenize (which checks tools as chat does)."""
    bad = [{"type": "function", "function": {"name": "get.weather", "parameters": WEATHER}}]
    for path, body in (
        ("/v1/chat/completions", {"messages": MSGS, "tools": bad, "max_tokens": 2}),
        ("/tokenize", {"messages": MSGS, "tools": bad}),
    ):
        r = httpx.post(tool_server.url + path, json=body, timeout=60)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "tools", error
        assert error["message"] == (
            "tools[0].function.name 'get.weather' does not match the pattern '^[a-zA-Z0-9_-]{1,64}$' "
            "(ASCII letters, digits, underscores and dashes, at most 64)"
        ), error


@pytest.mark.parametrize("keyword", ["$ref", "anyOf", "oneOf", "allOf", "enum", "const"])
def test_tool_parameters_refuse_root_keywords_that_choose_other_values(keyword: str) -> None:
    """A root ``anyOf`` (or ``$ref``, ``enum``, ...) let a forced call's arguments be a number or a
    string: xgrammar follows it and ignores a ``"type": "object"`` beside it. Refused with a 400
    naming ``tools``, with or without the type; inside a property it stays allowed."""
    values: dict[str, Any] = {
        "$ref": "#/$defs/A",
        "anyOf": [{"type": "integer"}],
        "oneOf": [{"type": "array"}],
        "allOf": [{"type": "boolean"}],
        "enum": [1, 2],
        "const": "x",
    }
    for params in ({keyword: values[keyword]}, {"type": "object", keyword: values[keyword]}):
        tool = {"type": "function", "function": {"name": "f", "parameters": params}}
        with pytest.raises(ApiError) as e:
            check_tools([tool])
        assert e.value.param == "tools" and f"{keyword!r} at its root" in e.value.message, e.value.message
    inner = {
        "type": "object",
        "properties": {"a": {keyword: values[keyword]}},
        "$defs": {"A": {"type": "string"}},
    }
    assert check_tools([{"type": "function", "function": {"name": "f", "parameters": inner}}])
