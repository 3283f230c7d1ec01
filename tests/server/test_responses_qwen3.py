"""``POST /v1/responses`` with ``--reasoning-parser qwen3 --tool-call-parser hermes`` on a tiny
random Qwen3 with the real Qwen3 tokenizer and chat template: forced function calls
(``tool_choice`` named or ``required``, grammar-driven, so random weights write valid
arguments) as ``function_call`` items, their round trip (``function_call`` and
``function_call_output`` input items), and the reasoning as a ``reasoning`` item with its
token count; every streamed event parsed by the openai SDK."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.server.conftest import Server, serve_tiny_qwen3

THINK_END = 151668  # Qwen3's </think>
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
TOOLS: list[Any] = [
    {"type": "function", "name": "get_time", "description": "The time.", "parameters": TIME, "strict": True},
    {"type": "function", "name": "noop", "parameters": {"type": "object", "properties": {}}},
]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS]
# </think> first: the grammar (after it) writes the calls at once
FORCED: dict[str, Any] = {"logit_bias": {str(THINK_END): 100}, "seed": 0}


@pytest.fixture(scope="module")
def qwen3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve_tiny_qwen3(
        tmp_path_factory,
        "responses",
        "--tool-call-parser",
        "hermes",
        "--enable-auto-tool-choice",
        "--reasoning-parser",
        "qwen3",
    )


@pytest.fixture(scope="module")
def client(qwen3_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen3_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _calls(response: Any) -> list[Any]:
    return [item for item in response.output if item.type == "function_call"]


def _stream(client: openai.OpenAI, **kw: Any) -> tuple[list[Any], Any]:
    """The SDK's stream helper: its events and the final response (an ``incomplete`` one ends
    with ``response.incomplete``, as OpenAI sends it, whose response is the final one)."""
    with client.responses.stream(**kw) as stream:
        events = list(stream)
        last = events[-1]
        final = last.response if last.type == "response.incomplete" else stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events, final


def test_named_function_call_and_its_round_trip(
    qwen3_server: Server, client: openai.OpenAI, model: str
) -> None:
    kw: dict[str, Any] = dict(
        model=model,
        input="What time is it?",
        tools=TOOLS,
        tool_choice={"type": "function", "name": "get_time"},
        max_output_tokens=40,
        temperature=1.0,
        extra_body=FORCED,
    )
    r = client.responses.create(**kw)
    [call] = _calls(r)
    assert call.name == "get_time" and call.status == "completed" and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), TIME)
    assert r.status == "completed" and r.output_text == ""
    assert [t.name for t in r.tools] == ["get_time", "noop"] and r.tool_choice.name == "get_time"

    events, final = _stream(client, **kw)
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = events[-3]
    [streamed] = _calls(final)
    assert done.arguments == streamed.arguments == call.arguments and done.name == "get_time"
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(deltas) == call.arguments and events[2].item.call_id == streamed.call_id

    # the round trip: the call and its output as input items render as the chat messages
    output = {"type": "function_call_output", "call_id": call.call_id, "output": '{"time": "12:00"}'}
    items = [
        {"role": "user", "content": "What time is it?"},
        call.model_dump(exclude_none=True),
        output,
    ]
    answer = client.responses.create(
        model=model, input=items, tools=TOOLS, tool_choice="none", max_output_tokens=5
    )
    assert answer.status in ("completed", "incomplete") and answer.output
    fn = {"name": "get_time", "arguments": call.arguments}
    messages = [
        {"role": "user", "content": "What time is it?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call.call_id, "type": "function", "function": fn}],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": '{"time": "12:00"}'},
    ]
    # tool_choice "none": the Responses API renders no tools (vLLM 0.26's construct_tool_dicts)
    count = httpx.post(qwen3_server.url + "/tokenize", json={"messages": messages}, timeout=60).json()[
        "count"
    ]
    assert answer.usage.input_tokens == count
    # the same turn through the store: previous_response_id brings the call back
    again = client.responses.create(
        model=model,
        input=[output],
        previous_response_id=r.id,
        tools=TOOLS,
        tool_choice="none",
        max_output_tokens=5,
    )
    assert again.usage.input_tokens == count


def test_required_calls_one_when_not_parallel(client: openai.OpenAI, model: str) -> None:
    r = client.responses.create(
        model=model,
        input="Time?",
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=60,
        extra_body=FORCED,
    )
    [call] = _calls(r)
    assert call.name in ("get_time", "noop") and r.parallel_tool_calls is False
    if call.name == "get_time":
        jsonschema.validate(json.loads(call.arguments), TIME)


def test_required_calls_cut_by_max_output_tokens_are_calls_streamed_or_not(
    client: openai.OpenAI, model: str
) -> None:
    """A ``required`` array cut by ``max_output_tokens`` used to be a ``message`` with the array's
    text unstreamed but ``function_call`` items streamed, and with a strict tool the SDK's stream
    helper raised ``JSONDecodeError`` at ``response.completed`` (it parses a strict tool's
    arguments there). Now both are the calls, the cut one ``incomplete``, and the stream ends
    with ``response.incomplete``."""
    kw: dict[str, Any] = dict(
        model=model,
        input="Time?",
        tools=[TOOLS[0]],  # strict
        tool_choice="required",
        max_output_tokens=12,
        temperature=1.0,
        extra_body=FORCED,
    )
    r = client.responses.create(**kw)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output and all(o.type == "function_call" and o.name == "get_time" for o in r.output)
    *done, cut = r.output
    assert cut.status == "incomplete" and all(o.status == "completed" for o in done)
    events, final = _stream(client, **kw)  # the helper parses nothing: no JSONDecodeError
    assert events[-1].type == "response.incomplete"

    def shape(items: list[Any]) -> list[tuple[str, str, str, str]]:
        return [(o.type, o.name, o.arguments, o.status) for o in items]

    assert shape(final.output) == shape(r.output)
    assert shape([e.item for e in events if e.type == "response.output_item.done"]) == shape(r.output)
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == "".join(
        o.arguments for o in r.output
    )


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_time"}])
def test_a_call_cut_by_a_stop_string_is_incomplete_streamed_or_not(
    client: openai.OpenAI, model: str, choice: Any
) -> None:
    """A forced call that a stop string cuts inside its arguments was a ``function_call`` marked
    ``completed`` in a ``completed`` response, with arguments that are not JSON: the OpenAI
    Agents SDK runs the calls of a completed response and its parse of the arguments failed,
    and the SDK's stream helper raised ``JSONDecodeError`` at ``response.completed`` (it parses a
    strict tool's arguments there). Now the call and the response are ``incomplete``
    (``incomplete_details.reason`` null: not the length limit), streamed or not, and the stream
    ends with ``response.incomplete``."""
    kw: dict[str, Any] = dict(
        model=model,
        input="Time?",
        tools=[TOOLS[0]],  # strict
        tool_choice=choice,
        max_output_tokens=60,
        extra_body=FORCED | {"stop": ['"zone"']},
    )
    r = client.responses.create(**kw)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason is None
    *done, cut = r.output
    assert cut.type == "function_call" and cut.name == "get_time" and cut.status == "incomplete", r.output
    assert all(o.status == "completed" for o in done)
    with pytest.raises(ValueError):
        json.loads(cut.arguments)
    events, final = _stream(client, **kw)  # the helper parses nothing: no JSONDecodeError
    assert events[-1].type == "response.incomplete" and final.incomplete_details.reason is None

    def shape(items: list[Any]) -> list[tuple[str, str | None, str | None, str]]:
        return [(o.type, getattr(o, "name", None), getattr(o, "arguments", None), o.status) for o in items]

    assert shape(final.output) == shape(r.output)
    assert shape([e.item for e in events if e.type == "response.output_item.done"]) == shape(r.output)


@pytest.mark.parametrize("cut", [{"max_output_tokens": 38}, {"extra_body": {"stop": ['"zone"']}}])
def test_an_auto_call_cut_short_is_the_same_items_streamed_or_not(
    client: openai.OpenAI, model: str, cut: dict[str, Any]
) -> None:
    """A hermes call (``tool_choice: "auto"``) cut inside its arguments: the stream sends the text
    before it as a ``message`` and the call as a ``function_call`` item, and the unstreamed
    answer used to be one ``message`` holding the raw ``<tool_call>`` markup instead (chat's
    unstreamed answer, as vLLM's): the same request gave different items streamed and not. Both
    are now the stream's items, the cut call ``incomplete`` and the response ``incomplete``."""
    regex = r'Sure\. <tool_call>\n\{"name": "get_time", "arguments": \{"zone": "(UTC|CET)"\}\}\n</tool_call>'
    body = FORCED | {"structured_outputs": {"regex": regex}} | cut.get("extra_body", {})
    kw: dict[str, Any] = dict(
        model=model,
        input="Time?",
        tools=[TOOLS[0]],
        tool_choice="auto",
        max_output_tokens=cut.get("max_output_tokens", 80),
        extra_body=body,
    )
    r = client.responses.create(**kw)
    assert r.status == "incomplete" and [o.type for o in r.output] == ["message", "function_call"], r.output
    message, call = r.output
    assert message.content[0].text == "Sure. " and call.name == "get_time" and call.status == "incomplete"
    assert call.arguments.startswith("{")  # '{"zone": "UTC' (38 tokens) or '{' (the stop string)
    with pytest.raises(ValueError):
        json.loads(call.arguments)
    events, final = _stream(client, **kw)
    assert events[-1].type == "response.incomplete"

    def shape(items: list[Any]) -> list[tuple[Any, ...]]:
        return [
            (
                o.type,
                o.status,
                getattr(o, "arguments", None),
                o.content[0].text if o.type == "message" else None,
            )
            for o in items
        ]

    assert shape(final.output) == shape(r.output)
    assert final.incomplete_details == r.incomplete_details


def test_reasoning_item_and_reasoning_tokens(client: openai.OpenAI, model: str) -> None:
    """An assistant message left ``incomplete`` after ``<think>`` is continued (as vLLM), inside
    the reasoning: with ``</think>`` banned, the output is all reasoning."""
    kw: dict[str, Any] = dict(
        model=model,
        input=[
            {"role": "user", "content": "Think."},
            {"type": "message", "role": "assistant", "content": "<think>\n", "status": "incomplete"},
        ],
        max_output_tokens=6,
        extra_body={"logit_bias": {str(THINK_END): -100}, "ignore_eos": True, "seed": 1},
        temperature=1.0,
    )
    r = client.responses.create(**kw)
    [item] = r.output
    assert item.type == "reasoning" and item.content[0].type == "reasoning_text" and item.content[0].text
    assert r.usage.output_tokens_details.reasoning_tokens == 6 == r.usage.output_tokens
    assert r.status == "incomplete" and r.output_text == ""
    events, final = _stream(client, **kw)
    kinds = [e.type for e in events]
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    text = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert final.output[0].content[0].text == text == item.content[0].text
    assert final.usage.output_tokens_details.reasoning_tokens == 6
    # Codex's stateless loop (store false, the encrypted reasoning asked for): taken as vLLM takes
    # it; the reasoning comes as plain content, which is what goes back in the next input
    stateless = client.responses.create(**kw, store=False, include=["reasoning.encrypted_content"])
    [item] = stateless.output
    assert item.type == "reasoning" and item.encrypted_content is None
    assert item.content[0].text == r.output[0].content[0].text


def test_reasoning_then_answer(client: openai.OpenAI, model: str) -> None:
    """``</think>`` after some reasoning: a reasoning item, then the message (json_schema
    constrains the answer after ``</think>``), streamed the same. ``logit_bias`` makes
    ``</think>`` likely but not certain: the first seed that writes some reasoning first is
    checked (seeded sampling: the same seeds every run)."""
    fmt = {"type": "json_schema", "name": "t", "schema": TIME, "strict": True}
    for seed in range(8):
        kw: dict[str, Any] = dict(
            model=model,
            input="Time zone?",
            text={"format": fmt},
            max_output_tokens=40,
            extra_body={"logit_bias": {str(THINK_END): 3}, "seed": seed},
            temperature=1.0,
        )
        r = client.responses.create(**kw)
        if [item.type for item in r.output] == ["reasoning", "message"]:
            break
    else:
        raise AssertionError(f"no seed wrote reasoning then </think>: {r.output}")
    jsonschema.validate(json.loads(r.output_text), TIME)
    reasoning_tokens = r.usage.output_tokens_details.reasoning_tokens
    assert 2 <= reasoning_tokens < r.usage.output_tokens
    events, final = _stream(client, **kw)
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == r.output_text
    assert final.output[0].content[0].text == r.output[0].content[0].text
    assert final.usage.output_tokens_details.reasoning_tokens == reasoning_tokens
    kinds = [e.type for e in events]
    first_text = kinds.index("response.output_text.delta")
    assert kinds.index("response.reasoning_text.done") < first_text


def test_an_output_without_think_starts_inside_the_reasoning(client: openai.OpenAI, model: str) -> None:
    """vLLM 0.26's qwen3 parser starts inside the reasoning: a model that writes ``X</think>Y``
    without ``<think>`` (as a Qwen3 "Thinking-2507" model does after its template's ``<think>``)
    answers a reasoning item ``X`` and a message ``Y``, streamed the same, no ``</think>`` in
    either (it was one message with the tag in its text). ``logit_bias`` makes ``</think>`` likely
    but not certain: the first seed that writes reasoning and then an answer is checked."""
    for seed in range(8):
        kw: dict[str, Any] = dict(
            model=model,
            input="Hi",
            max_output_tokens=12,
            extra_body={"logit_bias": {str(THINK_END): 3}, "seed": seed},
            temperature=1.0,
        )
        r = client.responses.create(**kw)
        if [item.type for item in r.output] == ["reasoning", "message"] and r.output_text.strip():
            break
    else:
        raise AssertionError(f"no seed wrote reasoning, </think> and an answer: {r.output}")
    assert "</think>" not in r.output_text + r.output[0].content[0].text
    events, final = _stream(client, **kw)
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == r.output_text
    assert final.output[0].content[0].text == r.output[0].content[0].text


def test_empty_reasoning_counts_its_end_token(client: openai.OpenAI, model: str) -> None:
    """``</think>`` as the first generated token: no reasoning item, but the token that ended the
    (empty) reasoning is a reasoning token, as the docs define them."""
    r = client.responses.create(
        model=model,
        input="Hi",
        max_output_tokens=4,
        temperature=0.0,
        extra_body={"logit_bias": {str(THINK_END): 100}, "ignore_eos": True},
    )
    assert [item.type for item in r.output] == ["message"]
    assert r.usage.output_tokens_details.reasoning_tokens == 1
    assert r.usage.output_tokens == 4


def test_tool_choice_none_renders_no_tools_without_the_flag(qwen3_server: Server) -> None:
    """vLLM 0.26's Responses API never renders its tools under ``tool_choice: "none"``
    (``construct_tool_dicts``), with or without ``--exclude-tools-when-tool-choice-none``, which
    this server does not run; chat completions still render them there."""
    body: dict[str, Any] = {"input": "Hi", "tools": TOOLS, "max_output_tokens": 1}
    url = qwen3_server.url
    none = httpx.post(url + "/v1/responses", json=body | {"tool_choice": "none"}, timeout=120).json()
    auto = httpx.post(url + "/v1/responses", json=body | {"tool_choice": "auto"}, timeout=120).json()
    bare = httpx.post(url + "/v1/responses", json={"input": "Hi", "max_output_tokens": 1}, timeout=120).json()
    assert none["usage"]["input_tokens"] == bare["usage"]["input_tokens"] < auto["usage"]["input_tokens"]
    chat = {"messages": [{"role": "user", "content": "Hi"}], "tools": CHAT_TOOLS, "tool_choice": "none"}
    rendered = httpx.post(url + "/v1/chat/completions/render", json=chat, timeout=120).json()
    assert len(rendered["token_ids"]) == auto["usage"]["input_tokens"]


def test_the_response_has_the_temperature_and_top_p_in_force(client: openai.OpenAI, model: str) -> None:
    """A Response's ``temperature`` and ``top_p`` were the request's, null when left out, while
    the model's generation_config.json (Qwen3's 0.6 and 0.95) sampled it; they are the values in
    force, as vLLM's ``ResponsesResponse.from_request`` reports its sampling parameters'."""
    r = client.responses.create(model=model, input="Hi", max_output_tokens=2, reasoning={"effort": "none"})
    assert (r.temperature, r.top_p) == (0.6, 0.95)
    r = client.responses.create(
        model=model, input="Hi", max_output_tokens=2, temperature=0.3, top_p=0.5, reasoning={"effort": "none"}
    )
    assert (r.temperature, r.top_p) == (0.3, 0.5)
    stored = client.responses.retrieve(r.id)
    assert (stored.temperature, stored.top_p) == (0.3, 0.5)
