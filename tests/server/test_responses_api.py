"""``POST /v1/responses`` (OpenAI's Responses API) through the official openai SDK against a
live `surge serve` of the bundled model: text, streamed and not, exact lengths and the
``incomplete`` status, instructions and input items, structured outputs, logprobs, the
in-memory store (``GET`` / ``DELETE``, ``previous_response_id``) and the refused fields."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import types
from collections import OrderedDict
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from surge.server.errors import ApiError
from surge.server.protocol_responses import ResponsesRequest
from surge.server.response_store import MAX_STORED_BYTES, ResponseStore, StoredResponse
from surge.server.serving_responses import _ends_in_cut_call
from tests.server.conftest import Server, start_server, wait_engine_idle

PROMPT = "Once upon a time"
CHOICE = {
    "type": "object",
    "properties": {"name": {"enum": ["Lily", "Tom"]}, "age": {"enum": [3, 4]}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _stream(client: openai.OpenAI, **kw: Any) -> tuple[list[ResponseStreamEvent], Response]:
    """Every typed event of a streamed response (the SDK's helper) and its final response (an
    ``incomplete`` one ends with ``response.incomplete``, as OpenAI sends it: the helper's
    ``get_final_response()`` wants ``response.completed``, so it comes from that event)."""
    with client.responses.stream(**kw) as stream:
        events = list(stream)
        last = events[-1]
        final = last.response if last.type == "response.incomplete" else stream.get_final_response()
    return events, final


def _comparable(response: Response) -> dict[str, Any]:
    """A response without what differs between two runs of one request (ids, time, cache hits)."""
    out = response.model_dump()
    for key in ("id", "created_at"):
        out.pop(key)
    out["usage"]["input_tokens_details"].pop("cached_tokens")
    for item in out["output"]:
        item.pop("id")
        for part in item.get("content") or ():
            part.pop("parsed", None)  # the SDK's stream helper adds it
    return out


@pytest.mark.parametrize(
    ("output", "cut"),
    [
        ([{"type": "function_call", "arguments": '{"zone": "UTC"}'}], False),
        (
            [{"type": "function_call", "arguments": "{}"}, {"type": "function_call", "arguments": '{"zone'}],
            True,
        ),
        ([{"type": "function_call", "arguments": ""}], True),  # cut right after its name
        ([{"type": "function_call", "arguments": "[" * 5000}], True),  # past json's depth: no RecursionError
        ([{"type": "message", "content": []}], False),
        ([], False),
    ],
)
def test_only_a_last_call_whose_arguments_are_not_json_is_cut(
    output: list[dict[str, Any]], cut: bool
) -> None:
    """What makes a response that a stop string ended ``incomplete``: its last item is a
    ``function_call`` whose arguments are not JSON; a stop string after a whole call (or in
    text) leaves it ``completed``."""
    assert _ends_in_cut_call(output) is cut


def test_every_field_is_in_the_docs() -> None:
    """Every field of the Responses body is honoured, inert or refused in the docs' table."""
    doc = (Path(__file__).parents[2] / "docs" / "openai-api.md").read_text()
    section = doc[doc.index("## Responses API") : doc.index("**The response**")]
    for name in ResponsesRequest.model_fields:
        assert f"`{name}`" in section, f"ResponsesRequest.{name} is not in docs/openai-api.md"


@pytest.mark.parametrize("max_tokens", [1, 7])
def test_non_streamed_exact_length_is_incomplete(client: openai.OpenAI, model: str, max_tokens: int) -> None:
    r = client.responses.create(
        model=model,
        input=PROMPT,
        max_output_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert r.id.startswith("resp_") and r.object == "response" and r.model == model
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == max_tokens and r.max_output_tokens == max_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + max_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    # OpenAI's defaults echoed: tool_choice "auto" without tools, the tier that served it
    assert r.tool_choice == "auto" and r.service_tier == "default"
    [item] = r.output
    assert item.type == "message" and item.role == "assistant"
    assert item.status == "incomplete"  # the item the cut happened in, as OpenAI marks it
    [part] = item.content
    assert part.type == "output_text" and part.annotations == [] and part.text == r.output_text
    assert r.output_text and r.temperature == 0 and r.tools == [] and r.text.format.type == "text"
    # the chat path serves it: the same prompt (a user message) and greedy tokens
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        max_completion_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert chat.choices[0].message.content == r.output_text
    assert chat.usage.prompt_tokens == r.usage.input_tokens


def test_completed_status_when_the_model_stops(client: openai.OpenAI, model: str) -> None:
    r = client.responses.create(
        model=model, input=PROMPT, max_output_tokens=200, temperature=0, extra_body={"stop": ["."]}
    )
    assert r.status == "completed" and r.incomplete_details is None
    assert 0 < r.usage.output_tokens < 200 and "." not in r.output_text


def test_streamed_events_parse_and_end_in_the_non_streamed_response(
    client: openai.OpenAI, model: str
) -> None:
    kw: dict[str, Any] = dict(
        model=model,
        input=PROMPT,
        instructions="Tell a story.",
        max_output_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    full = client.responses.create(**kw)
    events, final = _stream(client, **kw)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # as OpenAI ends an incomplete response (vLLM: response.completed)
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created = events[0].response
    assert created.status == "in_progress" and created.id == final.id and created.output == []
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    item_id = events[2].item.id
    assert all(d.item_id == item_id and d.output_index == 0 and d.content_index == 0 for d in deltas)
    assert "".join(d.delta for d in deltas) == full.output_text == final.output_text
    assert events[-4].text == full.output_text and events[-2].item.id == item_id == final.output[0].id
    assert events[-2].item.status == final.output[0].status == full.output[0].status == "incomplete"
    assert final.status == "incomplete" and final.usage.output_tokens == 12
    assert _comparable(final) == _comparable(full)
    # create(stream=True) gives the same typed events
    raw = list(client.responses.create(**kw, stream=True))
    assert [e.type for e in raw] == kinds


def test_instructions_and_input_items_render_as_chat_messages(
    server: Server, client: openai.OpenAI, model: str
) -> None:
    """``instructions`` is a system message first; message items of every role and content
    form are the chat messages they name (the prompt counts as /tokenize counts them)."""
    items = [
        {"role": "developer", "content": "Use short words."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": " there was a cat.", "annotations": []}],
        },
        {"role": "user", "content": "What next?"},
    ]
    r = client.responses.create(
        model=model, input=items, instructions="Be kind.", max_output_tokens=4, temperature=0
    )
    messages = [
        {"role": "system", "content": "Be kind."},
        {"role": "developer", "content": "Use short words."},
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": " there was a cat."},
        {"role": "user", "content": "What next?"},
    ]
    count = httpx.post(server.url + "/tokenize", json={"messages": messages}, timeout=60).json()["count"]
    assert r.usage.input_tokens == count and r.instructions == "Be kind."
    chat = client.chat.completions.create(
        model=model, messages=messages, max_completion_tokens=4, temperature=0
    )
    assert chat.choices[0].message.content == r.output_text


def test_json_schema_text_format(client: openai.OpenAI, model: str) -> None:
    fmt = {"type": "json_schema", "name": "child", "schema": CHOICE, "strict": True}
    r = client.responses.create(model=model, input=PROMPT, max_output_tokens=60, text={"format": fmt})
    assert r.status == "completed" and r.text.format.type == "json_schema"
    jsonschema.validate(json.loads(r.output_text), CHOICE)
    events, final = _stream(client, model=model, input=PROMPT, max_output_tokens=60, text={"format": fmt})
    jsonschema.validate(json.loads(final.output_text), CHOICE)
    obj = client.responses.create(
        model=model,
        input=PROMPT,
        max_output_tokens=60,
        text={"format": {"type": "json_object"}},
        temperature=0,
    )
    assert obj.status == "incomplete" or isinstance(json.loads(obj.output_text), dict)


def test_output_text_logprobs(client: openai.OpenAI, model: str) -> None:
    kw: dict[str, Any] = dict(
        model=model,
        input=PROMPT,
        max_output_tokens=6,
        temperature=0,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    r = client.responses.create(**kw)
    lps = r.output[0].content[0].logprobs
    assert len(lps) == 6 and all(len(lp.top_logprobs) == 2 for lp in lps)
    assert "".join(lp.token for lp in lps) == r.output_text
    events, final = _stream(client, **kw)
    streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert [lp.token for lp in streamed] == [lp.token for lp in lps]
    assert [lp.token for lp in final.output[0].content[0].logprobs] == [lp.token for lp in lps]
    plain = client.responses.create(model=model, input=PROMPT, max_output_tokens=2)
    assert plain.output[0].content[0].logprobs is None


def test_store_retrieve_continue_and_delete(server: Server, client: openai.OpenAI, model: str) -> None:
    first = client.responses.create(model=model, input=PROMPT, max_output_tokens=5, temperature=0)
    assert first.store is True
    got = client.responses.retrieve(first.id)
    assert got.model_dump() == first.model_dump()
    second = client.responses.create(
        model=model, input="And then?", previous_response_id=first.id, max_output_tokens=3, temperature=0
    )
    assert second.previous_response_id == first.id
    messages = [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And then?"},
    ]
    count = httpx.post(server.url + "/tokenize", json={"messages": messages}, timeout=60).json()["count"]
    assert second.usage.input_tokens == count
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(first.id)
    assert e.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=model, input="x", previous_response_id=first.id)
    assert e.value.body["param"] == "previous_response_id"
    unstored = client.responses.create(model=model, input=PROMPT, max_output_tokens=2, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    events, final = _stream(client, model=model, input=PROMPT, max_output_tokens=3)
    assert client.responses.retrieve(final.id).output_text == final.output_text


def _finished(client: openai.OpenAI, response_id: str) -> Response:
    """Poll ``GET /v1/responses/{id}`` until the background response is no longer queued."""
    deadline = time.monotonic() + 60
    while True:
        got = client.responses.retrieve(response_id)
        if got.status not in ("queued", "in_progress"):
            return got
        assert time.monotonic() < deadline, got
        time.sleep(0.05)


def test_a_background_response_is_queued_then_retrieved(
    server: Server, client: openai.OpenAI, model: str
) -> None:
    """``background: true`` was a 400; as OpenAI and vLLM, it answers the ``queued`` response at
    once and ``GET`` returns it finished: the same response the request gets in the foreground,
    which ``previous_response_id`` continues; a repeated cancel returns it unchanged."""
    kw: dict[str, Any] = {"model": model, "input": PROMPT, "max_output_tokens": 6, "temperature": 0}
    queued = client.responses.create(background=True, **kw)
    assert queued.status == "queued" and queued.background is True
    assert queued.output == [] and queued.usage is None
    done = _finished(client, queued.id)
    foreground = client.responses.create(**kw)
    assert done.background is True and foreground.background is False
    want, got = _comparable(foreground), _comparable(done)
    want.pop("background")
    got.pop("background")
    assert got == want
    assert done.status == "incomplete" and done.usage.output_tokens == 6
    assert client.responses.cancel(done.id).model_dump() == done.model_dump()
    later = client.responses.create(
        model=model, input="And?", previous_response_id=done.id, max_output_tokens=2
    )
    assert later.usage.input_tokens > done.usage.input_tokens + done.usage.output_tokens
    wait_engine_idle(server.url, "a background response left its engine request running")


def test_cancelling_a_background_response_aborts_it(
    server: Server, client: openai.OpenAI, model: str
) -> None:
    """A running background response is ``in_progress`` (``queued`` until the engine's first
    output); ``POST /v1/responses/{id}/cancel`` answers it ``cancelled``, keeps it so, and aborts
    its engine request; ``DELETE`` of one does too."""
    seen = set()
    for _ in range(20):  # the tiny model may finish 480 tokens before the cancel arrives
        queued = client.responses.create(
            model=model, input=PROMPT, max_output_tokens=480, background=True, extra_body={"ignore_eos": True}
        )
        status = "queued"
        while status == "queued":
            status = client.responses.retrieve(queued.id).status
        seen.add(status)
        try:
            cancelled = client.responses.cancel(queued.id)
        finally:
            _finished(client, queued.id)
        if cancelled.status == "cancelled":
            break
    assert cancelled.status == "cancelled" and cancelled.background is True
    assert "in_progress" in seen, seen
    time.sleep(0.2)
    assert client.responses.retrieve(queued.id).status == "cancelled"
    # its input is kept (it has no output turn): continued, it comes before the new input
    later = client.responses.create(
        model=model, input="And?", previous_response_id=queued.id, max_output_tokens=1
    )
    messages = [{"role": "user", "content": PROMPT}, {"role": "user", "content": "And?"}]
    count = httpx.post(server.url + "/tokenize", json={"messages": messages}, timeout=60).json()["count"]
    assert later.usage.input_tokens == count
    wait_engine_idle(server.url, "a cancelled background response kept its engine request")
    running = client.responses.create(
        model=model, input=PROMPT, max_output_tokens=480, background=True, extra_body={"ignore_eos": True}
    )
    client.responses.delete(running.id)
    time.sleep(0.2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(running.id)
    wait_engine_idle(server.url, "a deleted background response kept its engine request")


def test_a_streamed_background_response_is_replayed_and_cancelled(
    server: Server, client: openai.OpenAI, model: str
) -> None:
    """``background`` with ``stream`` (as vLLM serves it): the events stream as in the
    foreground (``response.created`` with the response ``queued``), the response is stored
    finished, ``GET ...?stream=true&starting_after=N`` replays the events after ``N`` while it
    runs and follows it to its end, and a cancel ends its streams and aborts it."""
    long: dict[str, Any] = {
        "model": model,
        "input": PROMPT,
        "max_output_tokens": 480,
        "extra_body": {"ignore_eos": True},
    }
    events = list(
        client.responses.create(model=model, input=PROMPT, max_output_tokens=5, background=True, stream=True)
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[0].response.status == "queued"
    assert events[0].response.background is True
    assert events[-1].type == "response.incomplete"
    assert client.responses.retrieve(events[0].response.id).model_dump() == events[-1].response.model_dump()
    for _ in range(10):  # the tiny model may finish 480 tokens before the replay starts
        stream = iter(client.responses.create(background=True, stream=True, **long))
        head = [next(stream) for _ in range(4)]
        try:
            replayed = list(client.responses.retrieve(head[0].response.id, stream=True, starting_after=2))
        except openai.BadRequestError:  # finished already
            list(stream)
            continue
        rest = list(stream)
        assert [e.sequence_number for e in replayed] == list(range(3, 3 + len(replayed)))
        assert [e.model_dump() for e in replayed] == [e.model_dump() for e in [head[3], *rest]]
        assert replayed[-1].type == "response.incomplete"
        break
    else:
        raise AssertionError("no streamed background response was still running to replay")
    with pytest.raises(openai.BadRequestError) as e:  # finished: no events to replay
        client.responses.retrieve(head[0].response.id, stream=True)
    assert e.value.body["param"] == "stream"
    url = f"{server.url}/v1/responses/{head[0].response.id}"
    for bad in ("x", "-2"):
        r = httpx.get(url, params={"stream": "true", "starting_after": bad}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "starting_after", r.text
    for _ in range(10):
        stream = iter(client.responses.create(background=True, stream=True, **long))
        head = [next(stream) for _ in range(4)]
        cancelled = client.responses.cancel(head[0].response.id)
        rest = list(stream)
        if cancelled.status == "cancelled":
            break
    assert cancelled.status == "cancelled"
    assert not [
        e for e in rest if e.type.startswith("response.") and e.type.endswith(("completed", "incomplete"))
    ]
    assert client.responses.retrieve(cancelled.id).status == "cancelled"
    wait_engine_idle(server.url, "a cancelled streamed background response kept its engine request")


def test_the_store_is_bounded_in_bytes_not_only_in_count() -> None:
    """The store keeps at most ``max_bytes`` of JSON, the oldest forgotten first (the newest
    alone may be larger): bounded only by its 1,024 responses, 1,024 requests each echoing a
    4 MiB ``metadata`` (or ``user``, or a schema's ``description``) held 4 GiB of the API
    process, several times that for metadata of many tiny strings (Python objects)."""
    assert 0 < MAX_STORED_BYTES <= 512 * 1024 * 1024
    store = ResponseStore(capacity=8, max_bytes=100)
    for i in range(3):
        store.put(f"r{i}", StoredResponse(b"x" * 30, b"[]"))  # 32 bytes each
    assert len(store) == 3 and store.nbytes == 96
    store.put("r3", StoredResponse(b"x" * 30, b"[]"))
    assert "r0" not in store and len(store) == 3 and store.nbytes == 96
    store.put("r3", StoredResponse(b"x" * 10, b"[]"))  # replaced: counted once
    assert len(store) == 3 and store.nbytes == 76
    store.put("big", StoredResponse(b"x" * 500, b"[]"))
    assert list(store._items) == ["big"] and store.nbytes == 502
    assert store.get("big") == StoredResponse(b"x" * 500, b"[]")
    assert store.delete("big") and not store.delete("big") and store.nbytes == 0
    store = ResponseStore(capacity=2, max_bytes=10**6)
    for i in range(3):
        store.put(f"r{i}", StoredResponse(b"{}", b"[]"))
    assert list(store._items) == ["r1", "r2"] and store.nbytes == 8


class _BlockedGen:
    """An engine request that produces nothing until cancelled."""

    def __init__(self) -> None:
        self.aborted = False

    async def deltas(self) -> Any:
        await asyncio.Event().wait()
        yield []

    def abort(self) -> None:
        self.aborted = True


class _Shape:
    """The parts of a background response's shape that starting and cancelling it read."""

    def __init__(self, response_id: str) -> None:
        self.id = response_id
        self.prepared = types.SimpleNamespace(gen=_BlockedGen())

    def base(self, status: str, output: list[Any]) -> dict[str, Any]:
        return {"id": self.id, "object": "response", "status": status, "background": True, "output": output}


def test_a_running_background_response_is_never_forgotten() -> None:
    """Finished responses filling the store used to push out a background response still
    running: GET and POST .../cancel answered 404 while its task ran on. A running one is now
    pinned until its task ends (then forgotten as any other, the store back to its bounds);
    while the running ones alone fill the store, another background request is a 429 naming
    ``background`` (its engine request aborted), streamed or not."""
    import surge.server.serving_responses as serving

    async def main() -> None:
        state = types.SimpleNamespace(
            responses=ResponseStore(capacity=2, max_bytes=10**6), background={}, background_streams={}
        )
        body = types.SimpleNamespace(store=True)
        serving._start_background(state, body, _Shape("resp_a"), [])
        for i in range(5):  # finished responses fill the store past it
            state.responses.put(f"resp_{i}", StoredResponse(b'{"background": false}', b"[]"))
        assert "resp_a" in state.responses and len(state.responses) == 2
        got = await serving.retrieve_response(state, "resp_a", {})
        assert json.loads(bytes(got.body))["status"] == "queued"

        async def silent() -> Any:
            await asyncio.Event().wait()
            yield b""

        serving._start_background_stream(state, _Shape("resp_b"), [], silent())
        assert "resp_a" in state.responses and "resp_b" in state.responses and len(state.responses) == 2
        state.responses.put("resp_5", StoredResponse(b'{"background": false}', b"[]"))  # the newest stays
        assert list(state.responses._items) == ["resp_a", "resp_b", "resp_5"]
        for start in (
            lambda shape: serving._start_background(state, body, shape, []),
            lambda shape: serving._start_background_stream(state, shape, [], silent()),
        ):
            refused = _Shape("resp_c")
            with pytest.raises(ApiError) as e:
                start(refused)
            assert e.value.status == 429 and e.value.param == "background", e.value.message
            assert "Too many background responses running" in e.value.message and refused.prepared.gen.aborted
        assert "resp_c" not in state.responses
        cancelled = serving.cancel_response(state, "resp_a")
        assert json.loads(bytes(cancelled.body))["status"] == "cancelled"
        task = state.background["resp_a"]
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)  # the done callback
        assert "resp_a" not in state.background  # finished: no longer pinned, forgotten as any other
        assert list(state.responses._items) == ["resp_b", "resp_a"]  # stored cancelled, the newest
        got = await serving.retrieve_response(state, "resp_a", {})
        assert json.loads(bytes(got.body))["status"] == "cancelled"
        serving._start_background(state, body, _Shape("resp_c"), [])  # room again
        assert list(state.responses._items) == ["resp_b", "resp_c"]
        tasks = list(state.background.values())
        for response_id in ("resp_b", "resp_c"):  # DELETE cancels a running one
            serving.delete_response(state, response_id)
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)
        assert not state.background and len(state.responses) == 0

    asyncio.run(main())
    store = ResponseStore(capacity=8, max_bytes=100)  # running ones fill it by their bytes too
    for i in range(2):
        assert not store.pinned_full
        store.put(f"r{i}", StoredResponse(b"x" * 58, b"[]"))
        store.pin(f"r{i}")
    assert store.pinned_full and store.nbytes == 120 and len(store) == 2
    store.unpin("r0")  # kept while over the bound (test_a_background_response_that_finishes_...)
    assert not store.pinned_full and list(store._items) == ["r0", "r1"]
    store.put("r2", StoredResponse(b"{}", b"[]"))
    assert list(store._items) == ["r1", "r2"]


def test_a_background_response_that_finishes_is_not_forgotten_at_once() -> None:
    """A background response's task stores its final response (still pinned), then unpins it.
    When the final response is larger than the queued one and the other running ones pinned
    the rest of the store's bytes, the unpin forgot the response that had just finished (the
    newest, which the store otherwise always keeps): its GET answered 404 at the moment it
    completed. It is kept until a later response takes its room."""
    store = ResponseStore(capacity=8, max_bytes=100)
    for response_id in ("a", "b"):  # two running: queued, pinned
        store.put(response_id, StoredResponse(b"x" * 8, b"[]"))
        store.pin(response_id)
    store.put("a", StoredResponse(b"x" * 93, b"[]"))  # a finishes: 95 bytes, over the bound with b
    store.unpin("a")
    assert store.get("a") == StoredResponse(b"x" * 93, b"[]") and list(store._items) == ["b", "a"]
    store.put("c", StoredResponse(b"{}", b"[]"))  # the next one stored takes its room
    assert list(store._items) == ["b", "c"] and store.nbytes == 14


class _CountedItems(OrderedDict):  # type: ignore[type-arg]
    """The store's responses, counting the ids its scans visit (work, not time)."""

    visited = 0

    def __iter__(self) -> Any:
        for key in super().__iter__():
            self.visited += 1
            yield key

    def items(self) -> Any:  # type: ignore[override]
        for key in self:
            yield key, self[key]


def test_storing_into_a_full_store_reads_only_the_oldest_responses() -> None:
    """Storing one more response into a full store forgets the oldest: it looked at every
    stored id (a copy of the 1,024 ids, 18 us per Responses request on the event loop, on
    every request once the store had filled); it reads from the oldest on only until it has
    found enough to forget (the pinned ones it passes are read too)."""
    store = ResponseStore(capacity=64, max_bytes=10**6)
    store._items = _CountedItems()
    for i in range(64):
        store.put(f"r{i}", StoredResponse(b"{}", b"[]"))
    store._items.visited = 0
    for i in range(64, 164):
        store.put(f"r{i}", StoredResponse(b"{}", b"[]"))
    assert store._items.visited <= 2 * 100 and len(store) == 64
    for response_id in ("r100", "r101", "r102"):  # three pinned among the oldest
        store.pin(response_id)
    store._items.visited = 0
    for i in range(164, 264):
        store.put(f"r{i}", StoredResponse(b"{}", b"[]"))
    assert store._items.visited <= 5 * 100 and len(store) == 64
    assert list(store._items)[:4] == ["r100", "r101", "r102", "r203"]


def test_a_repeated_request_id_never_replaces_a_stored_response(client: openai.OpenAI, model: str) -> None:
    """The id is ``resp_<X-Request-Id>``: a second request with the same header (a client's fixed
    id, a proxy's retry) used to replace the stored response, so ``previous_response_id``
    continued another conversation; it now gets a suffixed id."""
    headers = {"X-Request-Id": "fixed-id"}
    first = client.responses.create(
        model=model, input=PROMPT, max_output_tokens=3, temperature=0, extra_headers=headers
    )
    assert first.id == "resp_fixed-id"
    second = client.responses.create(
        model=model, input="Another story.", max_output_tokens=4, temperature=0, extra_headers=headers
    )
    assert second.id.startswith("resp_fixed-id-") and second.id != first.id
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
    assert client.responses.retrieve(second.id).model_dump() == second.model_dump()


def test_a_request_id_with_a_slash_is_refused_as_a_response_id(server: Server, model: str) -> None:
    """``X-Request-Id: a/b`` stored a response ``resp_a/b`` that ``GET`` and ``DELETE
    /v1/responses/{id}`` could not reach (``/`` splits the path, encoded or not): a 400 naming the
    header (or the body's ``request_id``). Chat completions take such an id as before."""
    url = server.url + "/v1/responses"
    body = {"model": model, "input": PROMPT, "max_output_tokens": 2}
    for headers, extra, param in [
        ({"X-Request-Id": "a/b"}, {}, "X-Request-Id"),
        ({}, {"request_id": "a/b"}, "request_id"),
    ]:
        r = httpx.post(url, json=body | extra, headers=headers, timeout=60)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and "must not contain '/'" in error["message"], error
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(
        server.url + "/v1/chat/completions", json=chat, headers={"X-Request-Id": "a/b"}, timeout=60
    )
    assert r.status_code == 200 and r.json()["id"] == "chatcmpl-a/b", r.text
    # other characters are taken, and the stored response is reachable with its id quoted
    r = httpx.post(url, json=body, headers={"X-Request-Id": "a?b#c%d"}, timeout=60)
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    assert rid.startswith("resp_a?b#c%d")
    assert httpx.get(f"{url}/{quote(rid, safe='')}").json()["id"] == rid
    assert httpx.delete(f"{url}/{quote(rid, safe='')}").json()["deleted"] is True


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("DELETE", "/v1/responses/"),
        ("GET", "/v1/responses/"),
        ("POST", "/v1/responses/x/cancel/"),
        ("POST", "/v1/chat/completions/"),
        ("GET", "/v1/models/"),
    ],
)
def test_a_trailing_slash_is_a_404_error_body(server: Server, method: str, path: str) -> None:
    """``DELETE /v1/responses/`` answered a 307 with an empty body (to ``/v1/responses``, which
    curl and httpx do not follow): a 404 OpenAI error body naming the URL, as OpenAI answers.
    ``GET /v1/models/`` was a model_not_found for the model ''."""
    r = httpx.request(method, server.url + path, json={} if method == "POST" else None, timeout=60)
    assert r.status_code == 404, (r.status_code, r.headers, r.text)
    assert r.json() == {
        "error": {
            "message": f"Invalid URL ({method} {path})",
            "type": "not_found_error",
            "param": None,
            "code": 404,
        }
    }


def test_retrieve_refuses_streaming_and_include_and_cancel_is_refused(
    server: Server, client: openai.OpenAI, model: str
) -> None:
    """``GET /v1/responses/{id}?stream=true`` used to answer the stored JSON, which the SDK's
    ``retrieve(id, stream=True)`` read as a stream of no events; ``include`` was dropped, and
    ``POST .../cancel`` was a bare "Not Found" even for a stored response."""
    first = client.responses.create(model=model, input=PROMPT, max_output_tokens=2)
    url = f"{server.url}/v1/responses/{first.id}"
    for params, param in [
        ({"stream": "true"}, "stream"),
        ({"stream": "true", "starting_after": "2"}, "stream"),
        ({"starting_after": "2"}, "starting_after"),
        ({"include[]": "message.output_text.logprobs"}, "include"),
    ]:
        r = httpx.get(url, params=params, timeout=60)
        assert r.status_code == 400, (params, r.text)
        assert r.json()["error"]["param"] == param
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.retrieve(first.id, stream=True)
    assert e.value.body["param"] == "stream"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.retrieve(first.id, include=["message.output_text.logprobs"])
    assert e.value.body["param"] == "include"
    assert client.responses.retrieve(first.id, stream=False).id == first.id
    got = httpx.get(url, params={"include_obfuscation": "false"}, timeout=60)
    assert got.status_code == 200 and got.json()["id"] == first.id
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.cancel(first.id)
    assert e.value.body["param"] == "response_id"
    assert "Cannot cancel a synchronous response" in e.value.body["message"]
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.cancel("resp_unknown")
    assert e.value.body["param"] == "response_id"
    assert client.responses.retrieve(first.id).id == first.id  # still stored


def test_include_obfuscation_of_the_wrong_type_says_what_it_takes(server: Server, model: str) -> None:
    """``stream_options: {"include_obfuscation": {}}`` said "include_obfuscation is not
    supported (only include_obfuscation ...)": the message now says what the option takes."""
    body = {"model": model, "input": "hi", "stream": True, "stream_options": {"include_obfuscation": {}}}
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "stream_options.include_obfuscation", error
    assert error["message"].startswith("stream_options.include_obfuscation must be true, false or null"), (
        error
    )
    assert "not supported" not in error["message"], error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tools": [{"type": "mcp", "server_label": "x"}]}, "tools"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"background": True, "store": False}, "background"),  # read back from the store only
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        # a reasoning part whose text is not a string (once a 500), or is not an object (once skipped)
        (
            {"input": [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": 5}]}]},
            "input[0].content[0]",
        ),
        (
            {"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": None}]}]},
            "input[0].summary[0]",
        ),
        ({"input": [{"type": "reasoning", "summary": ["thought"]}]}, "input[0].summary[0]"),
        ({"input": [{"type": "reasoning", "summary": "thought"}]}, "input[0].summary"),
        # arguments nested past the JSON parser's depth (a RecursionError, once a 500)
        (
            {"input": [{"type": "function_call", "name": "f", "call_id": "c", "arguments": "[" * 100_000}]},
            "input[0].arguments",
        ),
        (
            {"input": [{"type": "reasoning", "id": "r", "summary": [], "encrypted_content": "x"}]},
            "input[0].encrypted_content",
        ),
        # keys an item or part does not have were ignored; a call's tool namespace too
        ({"input": [{"role": "user", "content": "hi", "name": "bob"}]}, "input[0].name"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi", "x": 1}]}]},
            "input[0].content[0].x",
        ),
        (
            {
                "input": [
                    {
                        "type": "function_call",
                        "name": "f",
                        "call_id": "c",
                        "arguments": "{}",
                        "namespace": "n",
                    }
                ]
            },
            "input[0].namespace",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": "x", "is_error": True}]},
            "input[0].is_error",
        ),
        (
            {"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "t", "x": 1}]}]},
            "input[0].summary[0].x",
        ),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"truncation": "auto"}, "truncation"),
        ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
        ({"reasoning": {"effort": "huge"}}, "reasoning.effort"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"not": {}}}}},
            "text.format.schema",
        ),
        ({"text": {"verbosity": "high"}}, "text.verbosity"),
        ({"service_tier": "bogus"}, "service_tier"),
        # an output answering no call before it (OpenAI's 400; once rendered as an orphan tool turn)
        (
            {
                "input": [
                    {"role": "user", "content": "x"},
                    {"type": "function_call_output", "call_id": "n", "output": "r"},
                ]
            },
            "input[1].call_id",
        ),
        # an output before its call: the call must come first (as OpenAI, and as templates render)
        (
            {
                "input": [
                    {"role": "user", "content": "x"},
                    {"type": "function_call_output", "call_id": "c", "output": "r"},
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                ]
            },
            "input[1].call_id",
        ),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"max_tool_calls": 2}, "max_tool_calls"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"top_k": "a"}, "top_k"),
        ({"cache_salt": ""}, "cache_salt"),
        ({"priority": 3}, "priority"),  # under --scheduling-policy fcfs
        ({"max_output_token": 5}, "max_output_token"),
        ({"model": "other"}, "model"),
    ],
)
def test_refused_fields_are_named(server: Server, model: str, body: dict[str, Any], param: str) -> None:
    r = httpx.post(server.url + "/v1/responses", json={"model": model, "input": "hi"} | body, timeout=60)
    assert r.status_code in (400, 404), r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert set(error) == {"message", "type", "param", "code"}


def test_whole_prompt_errors_name_input_not_chat_messages(server: Server, model: str) -> None:
    """An empty input and an input longer than the context are 400s whose message, not only
    their ``param``, names ``input``: they used to say "messages must not be empty" and "your
    messages have N input tokens", the chat field the input was turned into."""
    url = server.url + "/v1/responses"
    r = httpx.post(url, json={"model": model, "input": []}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "input" and error["message"] == "input must not be empty", error
    max_len = httpx.get(server.url + "/v1/models", timeout=60).json()["data"][0]["max_model_len"]
    r = httpx.post(url, json={"model": model, "input": "Once " * max_len, "max_output_tokens": 1}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "input", error
    assert "your input has" in error["message"] and "messages" not in error["message"], error


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (
            {"text": {"format": {"type": "json_object"}}, "structured_outputs": {"regex": "a+"}},
            "structured_outputs",
            "only one structured output may be asked for, got text.format and structured_outputs",
        ),
        (
            {"max_output_tokens": 5, "min_tokens": 6},
            "min_tokens",
            "min_tokens (6) must not exceed max_output_tokens (5)",
        ),
    ],
)
def test_error_messages_name_responses_fields_whatever_the_param(
    server: Server, model: str, body: dict[str, Any], param: str, message: str
) -> None:
    """A chat error whose ``param`` is the same on both APIs still named, in its message, the
    chat fields it was turned into ("got response_format and structured_outputs", "must not
    exceed max_tokens"): the Responses request has neither."""
    r = httpx.post(server.url + "/v1/responses", json={"model": model, "input": "hi"} | body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"] == message, error


def test_an_error_in_the_stored_conversation_names_previous_response_id(server: Server, model: str) -> None:
    """A response cut by ``max_output_tokens`` inside a forced call stores arguments that do not
    parse, and continuing it is a 400 (as on vLLM, which parses them to render the history too).
    That 400 named ``input`` and the chat request's ``messages[2]``, neither of which the client
    sent: it names ``previous_response_id`` and the message of its stored conversation."""
    url = server.url + "/v1/responses"
    tool = {
        "type": "function",
        "name": "f",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    body = {"model": model, "input": "hi", "max_output_tokens": 3, "tools": [tool]}
    first = httpx.post(url, json=body | {"tool_choice": {"type": "function", "name": "f"}}, timeout=60).json()
    call = first["output"][-1]
    assert first["status"] == "incomplete" and call["type"] == "function_call", first
    with pytest.raises(ValueError):
        json.loads(call["arguments"])
    for instructions in (None, "Be brief."):
        more = {
            "model": model,
            "input": "go on",
            "previous_response_id": first["id"],
            "instructions": instructions,
        }
        r = httpx.post(url, json=more, timeout=60)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "previous_response_id", error
        assert error["message"].startswith(
            "previous_response_id: message 1 of its stored conversation: tool_calls: arguments are not valid JSON"
        ), error


def test_input_items_take_the_sdk_keys_they_ignore(server: Server, model: str) -> None:
    """The keys the openai SDK declares on input items and parts that change nothing here
    (``id``, ``status``, ``phase``, ``caller``, a call output's ``name``, a replayed output's
    ``annotations`` and ``logprobs``, ``prompt_cache_breakpoint``, a null ``namespace``) are
    accepted, as vLLM takes them: a response's own output items replay as input."""
    items = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "hi", "prompt_cache_breakpoint": {"mode": "explicit"}}
            ],
        },
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "phase": "final_answer",
            "content": [{"type": "output_text", "text": "ok", "annotations": [], "logprobs": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "c",
            "name": "f",
            "arguments": "{}",
            "status": "completed",
            "caller": None,
            "namespace": None,
        },
        {
            "type": "function_call_output",
            "call_id": "c",
            "output": "x",
            "name": "f",
            "id": "fco_1",
            "status": "completed",
        },
    ]
    body = {"model": model, "input": items, "max_output_tokens": 16}
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        (
            [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "tools[0] has chat completions' nested shape",
        ),
        ([{"type": "function", "name": ""}], "tools[0].name must be a non-empty string"),
        ([{"type": "function", "name": "f", "foo": 1}], "tools[0] has an unknown field 'foo'"),
        (
            [{"type": "function", "name": "get.weather"}],
            "tools[0].name 'get.weather' does not match the pattern '^[a-zA-Z0-9_-]{1,64}$'",
        ),
        (
            [
                {"type": "function", "name": "f"},
                {"type": "function", "name": "f", "parameters": {"type": "array"}},
            ],
            "tools[1].name 'f' is already the name of another tool",
        ),
    ],
)
def test_tool_errors_name_the_flat_tool_paths(
    server: Server, model: str, tools: list[dict[str, Any]], message: str
) -> None:
    """A function tool's error names its path in the Responses API's flat tool
    (``tools[0].name``), not in the chat tool it became (``tools[0].function.name``); a tool
    in chat completions' nested shape, a common slip, is told so (it was "tools[0].function has
    an unknown field 'function'")."""
    body = {"model": model, "input": "hi", "tools": tools}
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools" and error["message"].startswith(message), error
    assert ".function" not in error["message"], error


def test_error_mid_stream_is_an_error_event_then_response_failed(tmp_path: Path) -> None:
    """The engine dies while a response streams: the stream ends with an ``error`` event and
    ``response.failed`` (the response with status "failed" and its error), both typed by the
    SDK, as OpenAI ends a failed stream."""
    srv = start_server(tmp_path)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        stream = client.responses.create(
            input=PROMPT,
            model=client.models.list().data[0].id,
            max_output_tokens=480,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        events = []
        for event in stream:
            events.append(event)
            if event.type == "response.output_text.delta" and len(events) == 5:
                os.kill(srv.engine_pid, signal.SIGKILL)  # after the first token's events
    finally:
        srv.stop()
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2].code == "503" and "engine" in events[-2].message
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "503" and failed.id == events[0].response.id
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_non_text_part_is_refused_naming_the_text_parts_taken() -> None:
    """An image part's 400 lists the part types Surge takes; it left out ``refusal``, which is
    taken (an OpenAI assistant turn replayed), as docs/openai-api.md says."""
    from surge.server.errors import ApiError
    from surge.server.protocol_responses import _part_text

    assert _part_text({"type": "refusal", "refusal": "no"}, "input[1].content[0]") == {
        "type": "text",
        "text": "no",
    }
    with pytest.raises(ApiError) as e:
        _part_text({"type": "input_image", "image_url": "x"}, "input[0].content[0]")
    assert "(input_text, output_text, refusal)" in str(e.value.message), e.value.message


@pytest.mark.parametrize(
    ("part", "param", "says"),
    [
        ({"type": "input_text", "text": None}, "input[0].content[0].text", "must be a string"),
        ({"type": "output_text", "text": 5}, "input[0].content[0].text", "must be a string"),
        ({"type": "refusal", "refusal": ["no"]}, "input[0].content[0].refusal", "must be a string"),
        (None, "input[0].content[0]", "must be an object with a 'type'"),
        ("hi", "input[0].content[0]", "must be an object with a 'type'"),
        ({"text": "hi"}, "input[0].content[0].type", "must be a string"),
    ],
)
def test_a_text_part_whose_text_is_not_a_string_says_so(part: Any, param: str, says: str) -> None:
    """An ``input_text`` part whose ``text`` is not a string (or a part that is not an object with a
    type) was refused as a part "of type 'input_text'" when Surge "takes only text parts (input_text,
    ...)", which it is: the 400 names the field at fault."""
    from surge.server.errors import ApiError
    from surge.server.protocol_responses import _part_text

    with pytest.raises(ApiError) as e:
        _part_text(part, "input[0].content[0]")
    assert (e.value.param, e.value.status) == (param, 400), e.value.message
    assert e.value.message.startswith(f"{param} {says}"), e.value.message
    assert "takes only text parts" not in e.value.message, e.value.message
