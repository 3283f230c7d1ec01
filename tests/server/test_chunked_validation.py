"""A large body is parsed, validated and dumped in pieces that yield to the event loop
(:func:`surge.server.fast_json.decode_in_pieces`, :mod:`surge.server.chunked_validation`), with
the same values and the same errors as in one call."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any

import msgspec
import pytest

from surge.server.chunked_validation import CHUNK, dump_models, prevalidate
from surge.server.fast_json import PIECE_BYTES, FastJSONRequest, decode_in_pieces
from surge.server.protocol import ChatCompletionRequest, ChatMessage, TokenizeRequest
from tests.server.stub_app import stub_app, stub_state


def run_counting_yields(coro: Coroutine[Any, Any, Any]) -> tuple[Any, int]:
    """Run ``coro`` to its end by hand (it may await only ``asyncio.sleep(0)``, which yields a
    bare None); return its result and how many times it gave the event loop a turn."""
    yields = 0
    try:
        while True:
            coro.send(None)
            yields += 1
    except StopIteration as stop:
        return stop.value, yields


def messages(n: int) -> list[dict[str, Any]]:
    return [{"role": ("user", "assistant")[i % 2], "content": f"message {i}"} for i in range(n)]


def big_body(**extra: Any) -> bytes:
    body = {"messages": messages(3 * CHUNK + 5), "stop": [f"s{i}" for i in range(40_000)], **extra}
    data = json.dumps(body).encode()
    assert len(data) > PIECE_BYTES
    return data


def test_decode_in_pieces_yields_and_gives_the_same_value() -> None:
    """A 4 MB body was parsed in one msgspec call that held the event loop (70-300 ms)."""
    data = big_body(logit_bias={"5": 1.0}, model="m", nested={"a": [1, {"b": None}]})
    value, yields = run_counting_yields(decode_in_pieces(data))
    assert value == msgspec.json.decode(data)
    assert yields >= 5  # a yield per top-level field, and per piece of the long arrays


def test_decode_in_pieces_splits_large_objects_between_members() -> None:
    """A 4 MB ``logit_bias`` was one msgspec call; its pieces end only at commas between
    members (not inside a string or a nested value), and a key given twice keeps its last value."""
    bias = json.dumps({"logit_bias": {str(i): 1.5 for i in range(200_000)}}).encode()
    value, yields = run_counting_yields(decode_in_pieces(bias))
    assert value == msgspec.json.decode(bias) and yields >= 8
    tricky = {f"k{i}": f'a, b\\", {i}' if i % 3 else {"x": [1, 2, {"y": ", }"}]} for i in range(60_000)}
    data = (
        json.dumps({"o": tricky}).encode()[:-1]
        + b', "d": {'
        + b",".join(b'"k%d": %d' % (i % 1000, i) for i in range(60_000))
        + b"}}"
    )
    assert len(data) > 2 * PIECE_BYTES
    assert asyncio.run(decode_in_pieces(data)) == msgspec.json.decode(data)


def test_decode_in_pieces_splits_objects_whose_members_hold_commas() -> None:
    """An object whose every member holds commas (``{"k0": [1, ..., 17], ...}``) was tried at 8
    commas a piece, all inside values, then parsed in one call: 4 MB stalled the event loop
    longer than before pieces (review of session 62). Its members are now found in one pass and
    parsed in runs, in order, a key given twice keeping its first place and last value."""
    members = b",".join(
        b'"k%d": [%s]' % (i % 50_000, b",".join(b"%d" % j for j in range(17))) for i in range(60_000)
    )
    data = b'{"o": {' + members + b"}}"
    assert len(data) > 8 * PIECE_BYTES
    value, yields = run_counting_yields(decode_in_pieces(data))
    expected = msgspec.json.decode(data)
    assert list(value["o"].items()) == list(expected["o"].items()) and yields >= 8


@pytest.mark.parametrize(
    "data",
    [
        b"[" + b"1," * 200_000 + b"2]",  # not an object
        b'{"a": [' + b"1," * 200_000 + b"x]}",  # malformed deep in a long array
        b'{"a": [' + b"1," * 200_000 + b"2",  # cut short
        b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b', "b": "' + b"x" * PIECE_BYTES + b'"}',  # too deep
        b'{"a": 1, "a": [' + b"2," * 200_000 + b"3]}",  # a key twice: the last wins
        b'{"a": {' + b'"k": 1, ' * 100_000 + b'"z": 1e999}}',  # a number out of range in an object
        b'{"a": {' + b'"k": "\xff", ' * 100_000 + b'"z": 1}}',  # invalid UTF-8 in a large object
    ],
)
def test_decode_in_pieces_fails_or_parses_as_one_call(data: bytes) -> None:
    try:
        expected: Any = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError) as e:
        expected = (type(e), str(e))
    try:
        got: Any = asyncio.run(decode_in_pieces(data))
    except (msgspec.DecodeError, RecursionError) as e:
        got = (type(e), str(e))
    assert got == expected


def test_request_json_validates_long_message_lists_in_chunks() -> None:
    """The route's body model's long lists of models are validated before FastAPI's validation,
    a chunk at a time: FastAPI then takes the instances as they are (no second validation)."""
    data = json.dumps({"messages": messages(3 * CHUNK + 5), "max_tokens": 4}).encode()
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        assert not sent
        sent = True
        return {"type": "http.request", "body": data, "more_body": False}

    request = FastJSONRequest({"type": "http", "method": "POST", "headers": []}, receive)
    request.body_model = ChatCompletionRequest
    value, yields = run_counting_yields(request.json())
    assert yields >= 3
    msgs = value["messages"]
    assert all(type(m) is ChatMessage for m in msgs) and msgs[7].content == "message 7"
    parsed = ChatCompletionRequest.model_validate(value)
    assert parsed.messages[7] is msgs[7] and len(parsed.messages) == 3 * CHUNK + 5


def test_prevalidate_leaves_a_bad_chunk_to_the_body_validation() -> None:
    """The chunks before a bad element become models; the bad one and the rest stay as sent, so
    the body's validation names the element as it always did."""
    data: dict[str, Any] = {"messages": messages(3 * CHUNK)}
    data["messages"][CHUNK + 10] = {"role": "user", "content": 5}
    asyncio.run(prevalidate(data, ChatCompletionRequest))
    assert all(type(m) is ChatMessage for m in data["messages"][:CHUNK])
    assert all(type(m) is dict for m in data["messages"][CHUNK:])
    short: dict[str, Any] = {"messages": messages(3)}
    asyncio.run(prevalidate(short, TokenizeRequest))  # short lists: untouched
    assert all(type(m) is dict for m in short["messages"])


def test_a_bad_message_deep_in_a_long_list_is_named() -> None:
    client = stub_app(stub_state())
    body: dict[str, Any] = {"messages": messages(2 * CHUNK + 50)}
    body["messages"][2 * CHUNK + 20]["content"] = 5
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages" and error["message"].startswith(
        f"messages[{2 * CHUNK + 20}].content: expected a string"
    )


def test_dump_models_yields_for_long_lists() -> None:
    models = [ChatMessage(role="user", content=f"m{i}") for i in range(2 * CHUNK + 1)]
    dumped, yields = run_counting_yields(dump_models(models, exclude_none=True))
    assert dumped == [m.model_dump(exclude_none=True) for m in models] and yields == 3
    assert run_counting_yields(dump_models(models[:3], exclude_none=True))[1] == 0
