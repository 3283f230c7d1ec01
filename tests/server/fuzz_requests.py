"""Hostile request bodies for every route of ``surge serve`` that takes one, and the checks each
answer must pass (used by ``tests/server/test_fuzz_requests.py``; run by hand for longer with
``python -m tests.server.fuzz_requests --url http://127.0.0.1:8820 --seconds 900``).

A body is a route's smallest valid body with one to three fields replaced (any field of the
route's pydantic model, or an unknown key) by a hostile value: a wrong JSON type, null, an edge
integer or float, a long or odd-unicode string, deep nesting, an empty container, a random JSON
tree, or a valid-but-edge value (:data:`EDGE_COMBOS`); or a valid body that uses many of the
route's features (tools, tool calls, schemas, logprobs, ...) with one value at any depth replaced,
deleted or given an unknown sibling. The server is ``surge serve`` on a tiny random Qwen3 with the
real Qwen3 tokenizer (``tests.server.conftest.serve_tiny_qwen3``) with
``--trust-request-chat-template --tool-call-parser hermes --reasoning-parser qwen3``. The invariants (:func:`check_answer`):
a 200 or a 4xx, never a 5xx; an error is the route's error body, whose message (or ``param``)
names a field that was sent; no Python traceback or repr in any answer; a stream that fails
after its header ends with one error event (and ``data: [DONE]`` on the OpenAI routes).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from hypothesis import strategies as st
from pydantic import BaseModel

from surge.server.protocol import (
    BatchChatCompletionRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from surge.server.protocol_messages import MessagesBody, MessagesRequest
from surge.server.protocol_responses import ResponsesRequest

MSGS = [{"role": "user", "content": "Once upon a time"}]


TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
}
CHAT_MSGS: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Once"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "2"},
    {"role": "user", "content": "go on"},
]
RICH_CHAT = {
    "messages": CHAT_MSGS,
    "tools": [TOOL],
    "tool_choice": "auto",
    "max_tokens": 3,
    "logit_bias": {"5": 1.0},
    "stop": ["zz"],
    "logprobs": True,
    "top_logprobs": 2,
    "seed": 1,
    "n": 2,
    "chat_template_kwargs": {"enable_thinking": False},
}
RICH_SCHEMA_CHAT = {
    "messages": CHAT_MSGS[:2],
    "max_tokens": 3,
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}},
    },
}
RICH_COMPLETION = {
    "prompt": ["Once", "upon"],
    "max_tokens": 3,
    "n": 2,
    "logprobs": 2,
    "echo": True,
    "stop": ["zz"],
    "logit_bias": {"5": 1},
    "seed": 3,
    "structured_outputs": {"regex": "[a-z ]+"},
    "repetition_detection": {"max_pattern_size": 4, "min_count": 3},
}
RICH_RESPONSES = {
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "Once"}]}],
    "instructions": "Be brief",
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    "max_output_tokens": 16,
    "temperature": 0.5,
    "reasoning": {"effort": "low"},
}
RICH_SCHEMA_RESPONSES = {
    "input": "Once",
    "max_output_tokens": 16,
    "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
}
RICH_MESSAGES = {
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Once"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "2"}]},
    ],
    "system": [{"type": "text", "text": "Be brief"}],
    "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto"},
    "max_tokens": 3,
    "stop_sequences": ["zz"],
    "metadata": {"user_id": "u"},
    "temperature": 0.5,
}
RICH_TOKENIZE = {
    "messages": CHAT_MSGS,
    "tools": [TOOL],
    "add_generation_prompt": True,
    "chat_template_kwargs": {"enable_thinking": False},
}


@dataclass(frozen=True)
class Route:
    """A POST route: its path, request model, smallest valid body, valid bodies that use many of
    its features (mutated deep inside), and error body shape."""

    path: str
    model: type[BaseModel]
    base: dict[str, Any]
    anthropic: bool = False
    can_stream: bool = True
    rich: tuple[dict[str, Any], ...] = ()


ROUTES: tuple[Route, ...] = (
    Route(
        "/v1/chat/completions",
        ChatCompletionRequest,
        {"messages": MSGS, "max_tokens": 3},
        rich=(RICH_CHAT, RICH_SCHEMA_CHAT),
    ),
    Route(
        "/v1/completions",
        CompletionRequest,
        {"prompt": "Once upon", "max_tokens": 3},
        rich=(RICH_COMPLETION,),
    ),
    Route(
        "/v1/chat/completions/batch",
        BatchChatCompletionRequest,
        {"messages": [MSGS, MSGS], "max_tokens": 3},
        can_stream=False,
        rich=({"messages": [CHAT_MSGS[1:2], CHAT_MSGS[:2]], "max_tokens": 3, "logprobs": True},),
    ),
    Route(
        "/v1/chat/completions/render",
        ChatCompletionRequest,
        {"messages": MSGS},
        can_stream=False,
        rich=(RICH_CHAT,),
    ),
    Route("/v1/completions/render", CompletionRequest, {"prompt": "Once upon"}, can_stream=False),
    Route(
        "/invocations",
        CompletionRequest,
        {"prompt": "Once upon", "max_tokens": 3},
        rich=(RICH_COMPLETION, RICH_SCHEMA_CHAT),
    ),
    Route(
        "/v1/responses",
        ResponsesRequest,
        {"input": "Once upon", "max_output_tokens": 16},
        rich=(RICH_RESPONSES, RICH_SCHEMA_RESPONSES),
    ),
    Route(
        "/v1/messages",
        MessagesRequest,
        {"messages": MSGS, "max_tokens": 3},
        anthropic=True,
        rich=(RICH_MESSAGES,),
    ),
    Route(
        "/v1/messages/count_tokens",
        MessagesBody,
        {"messages": MSGS, "max_tokens": 3},
        anthropic=True,
        can_stream=False,
        rich=(RICH_MESSAGES,),
    ),
    Route("/tokenize", TokenizeRequest, {"prompt": "Once upon"}, can_stream=False, rich=(RICH_TOKENIZE,)),
    Route("/detokenize", DetokenizeRequest, {"tokens": [1, 2, 3]}, can_stream=False),
)

# Placeholders replaced in the JSON text by what json.dumps cannot write (or would recurse on).
_RAW = {
    "__RAW_DEEP_LIST__": "[" * 5000 + "]" * 5000,
    "__RAW_DEEP_OBJECT__": '{"a":' * 3000 + "1" + "}" * 3000,
    "__RAW_NAN__": "NaN",
    "__RAW_INF__": "-Infinity",
    "__RAW_BIG_EXP__": "1e999",
    "__RAW_BIG_INT__": "9" * 5000,
}

EDGE_INTS = [2**63, 2**64, -1, -(2**63), 2**63 - 1, 2**31, 0, 1, 20, 21, 100_000]
EDGE_FLOATS = [1e308, -1e308, -0.0, 5e-324, 0.5, 1.5, 2.0000001]
EDGE_STRINGS = [
    "",
    "x" * 100_000,
    "\ud800",
    "a\udfffb",
    "\x00",
    "\u202e\ufeff\u200b",
    "\U0001f600" * 50,
    "null",
    "{}",
    "1",
    "auto",
    "none",
    "required",
    "<|im_start|>",
]
EDGE_CONTAINERS: list[Any] = [
    [],
    {},
    [[]],
    [{}],
    [None],
    {"": None},
    list(range(300)),
    ["a"] * 64,
    [-1],
    [2**63],
    [[1, 2], [3]],
    {"type": "function", "function": {"name": "missing"}},
    {"1": 1e308},
    {"x": -100},
]
HOSTILE_SCALARS: list[Any] = [None, True, False, *EDGE_INTS, *EDGE_FLOATS, *EDGE_STRINGS, *_RAW]

json_trees = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=10,
)
hostile_values = st.one_of(
    st.sampled_from(HOSTILE_SCALARS),
    st.sampled_from(EDGE_CONTAINERS),
    json_trees,
)
unknown_keys = st.sampled_from(["", "nonexistent_field", "\ud800", "__proto__", "k" * 300, "Messages"])

# Valid-but-edge combinations: (route paths, fields sent); merged into the route's base body.
EDGE_COMBOS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("/v1/completions",), {"n": 2, "best_of": 3}),
    (("/v1/completions",), {"n": 3, "best_of": 2}),
    (("/v1/completions", "/v1/chat/completions"), {"n": 128, "max_tokens": 1}),
    (("/v1/completions",), {"logprobs": 0}),
    (("/v1/completions",), {"logprobs": 20}),
    (("/v1/completions",), {"logprobs": 21}),
    (("/v1/completions",), {"echo": True, "logprobs": 2, "max_tokens": 0}),
    (("/v1/chat/completions",), {"top_logprobs": 5}),
    (("/v1/chat/completions",), {"logprobs": True, "top_logprobs": 20}),
    (("/v1/chat/completions",), {"logprobs": True, "top_logprobs": 21}),
    (("/v1/chat/completions",), {"logprobs": False, "top_logprobs": 0}),
    (("/v1/completions", "/v1/chat/completions"), {"stop": [f"s{i}" for i in range(64)]}),
    (("/v1/completions", "/v1/chat/completions"), {"stop": ["\ud800"] * 3}),
    (("/v1/completions", "/v1/chat/completions"), {"max_tokens": 0}),
    (("/v1/completions", "/v1/chat/completions"), {"max_tokens": None}),
    (("/v1/completions",), {"prompt": [0, 1, 2**31]}),
    (("/v1/completions",), {"prompt": [-5]}),
    (("/v1/completions",), {"prompt": [[1, 2], [3, 4]]}),
    (("/v1/completions",), {"prompt": [[], [1]]}),
    (("/v1/completions",), {"prompt": ["a", ""]}),
    (("/v1/completions",), {"prompt": ""}),
    (("/v1/chat/completions",), {"messages": []}),
    (("/v1/chat/completions",), {"messages": [{"role": "user", "content": ""}]}),
    (("/v1/chat/completions",), {"messages": [{"role": "assistant", "content": None}]}),
    (("/v1/chat/completions",), {"messages": [{"role": "tool", "content": "x"}]}),
    (
        ("/v1/chat/completions",),
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
    ),
    (("/v1/chat/completions",), {"tool_choice": "required"}),
    (("/v1/chat/completions",), {"tools": [], "tool_choice": "auto"}),
    (
        ("/v1/chat/completions", "/v1/completions"),
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}},
            }
        },
    ),
    (
        ("/v1/chat/completions",),
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": ["string", 5]}},
            }
        },
    ),
    (("/v1/completions",), {"seed": 2**64 - 1}),
    (("/v1/completions",), {"seed": -(2**63)}),
    (("/v1/completions",), {"seed": -1}),
    (("/v1/completions", "/v1/chat/completions"), {"logit_bias": {"a": 1}}),
    (("/v1/completions", "/v1/chat/completions"), {"logit_bias": {"-1": 1}}),
    (("/v1/completions", "/v1/chat/completions"), {"logit_bias": {"99999999999999999999": 1}}),
    (("/v1/completions", "/v1/chat/completions"), {"logit_bias": {"1": 100}}),
    (("/v1/completions", "/v1/chat/completions"), {"stream_options": {"include_usage": True}}),
    (("/v1/completions", "/v1/chat/completions"), {"stream": True, "stream_options": None}),
    (("/v1/completions",), {"prompt_logprobs": 5, "max_tokens": 1}),
    (("/v1/completions",), {"prompt_logprobs": -1}),
    (("/v1/completions", "/v1/chat/completions"), {"min_tokens": 3, "max_tokens": 3}),
    (("/v1/completions", "/v1/chat/completions"), {"allowed_token_ids": []}),
    (("/v1/completions", "/v1/chat/completions"), {"allowed_token_ids": [10**9]}),
    (("/v1/completions", "/v1/chat/completions"), {"bad_words": [""]}),
    (("/v1/completions", "/v1/chat/completions"), {"truncate_prompt_tokens": 0}),
    (("/v1/completions", "/v1/chat/completions"), {"truncate_prompt_tokens": 2**63}),
    (("/v1/responses",), {"input": []}),
    (("/v1/responses",), {"input": [{"role": "user", "content": []}]}),
    (("/v1/responses",), {"previous_response_id": "resp_missing"}),
    (("/v1/responses",), {"max_output_tokens": 0}),
    (("/v1/responses",), {"tools": [TOOL], "tool_choice": {"type": "function", "name": "g"}}),
    (("/v1/messages",), {"messages": []}),
    (("/v1/messages",), {"max_tokens": 0}),
    (("/v1/messages",), {"stop_sequences": [""]}),
    (("/v1/messages",), {"system": [{"type": "text", "text": ""}]}),
    (("/v1/messages",), {"tool_choice": {"type": "tool", "name": "nope"}}),
    (("/tokenize",), {"prompt": None, "messages": MSGS}),
    (("/tokenize",), {"prompt": "x", "messages": MSGS}),
    (("/detokenize",), {"tokens": []}),
    (("/detokenize",), {"tokens": [-1]}),
    (("/detokenize",), {"tokens": [2**63]}),
]


@dataclass
class Probe:
    """One request: its route, body, which fields were made hostile, and whether it streams."""

    route: Route
    body: dict[str, Any]
    fields: list[str]
    stream: bool = False
    raw: bytes = field(default=b"", repr=False)

    def encode(self) -> bytes:
        """The body as JSON bytes (placeholders of :data:`_RAW` written out raw)."""
        text = json.dumps(self.body)
        for name, raw in _RAW.items():
            text = text.replace(f'"{name}"', raw)
        return text.encode()


def route_fields(route: Route) -> list[str]:
    """The fields of ``route``'s request model (``stream`` excluded: it is chosen apart)."""
    return sorted(name for name in route.model.model_fields if name != "stream")


@st.composite
def probes(draw: st.DrawFn) -> Probe:
    """A hostile request for some route (see the module docstring)."""
    route = draw(st.sampled_from(ROUTES))
    body = dict(route.base)
    combos = [fields for paths, fields in EDGE_COMBOS if route.path in paths]
    kinds = (
        ["fields", "fields", "unknown"] + ["combo"] * bool(combos) + ["nested", "nested"] * bool(route.rich)
    )
    kind = draw(st.sampled_from(kinds))
    if kind == "nested":
        body = copy.deepcopy(draw(st.sampled_from(route.rich)))
        path = draw(st.sampled_from(_paths(body)))
        how = draw(st.sampled_from(["replace", "replace", "delete", "unknown"]))
        _mutate(body, path, how, draw(hostile_values))
        fields = ["zz_unknown" if how == "unknown" and len(path) == 1 else str(path[0])]
    elif kind == "combo":
        patch = draw(st.sampled_from(combos))
        body |= patch
        fields = sorted(patch)
    elif kind == "unknown":
        key = draw(unknown_keys)
        body[key] = draw(hostile_values)
        fields = [key]
    else:
        fields = draw(st.lists(st.sampled_from(route_fields(route)), min_size=1, max_size=3, unique=True))
        for name in fields:
            body[name] = draw(hostile_values)
    if route.can_stream and draw(st.booleans()):
        body["stream"] = True
    return Probe(route, body, fields, body.get("stream") is True)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and indices) into ``value``, its own root excluded."""
    out: list[tuple[Any, ...]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        out.append((*prefix, key))
        out.extend(_paths(child, (*prefix, key)))
    return out


def _mutate(body: dict[str, Any], path: tuple[Any, ...], how: str, value: Any) -> None:
    """At ``path`` in ``body``: replace the value, delete it, or (``unknown``) add an unknown key
    beside it in its object (a list gets one more element)."""
    parent: Any = body
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if how == "replace":
        parent[last] = value
    elif how == "delete":
        del parent[last]
    elif isinstance(parent, dict):
        parent["zz_unknown"] = value
    else:
        parent.append(value)


_LEAKS = re.compile(
    r"Traceback \(most recent|File \"/|<class '|object at 0x|pydantic_core|Error\(|\bNoneType\b|"
    r"Internal server error|Exception\(|__init__|site-packages"
)


def _named(message: str, param: str | None, fields: list[str]) -> bool:
    """True when the error names one of ``fields`` (in its message or its ``param``); a field
    name the client made up may be clipped, so its first 200 characters are enough."""
    text = f"{message} {param or ''}"
    for name in fields:
        if name == "":  # an empty name echoed: "": ..." or ": ..."
            if (
                param == ""
                or message.startswith(": ")
                or "''" in text
                or '""' in text
                or "``" in text
                or "field ''" in text
            ):
                return True
            continue
        probe = name[:200]
        if probe in text or probe.encode("unicode_escape").decode() in text:
            return True
    return False


def check_answer(probe: Probe, status: int, text: str) -> list[str]:
    """The invariants ``probe``'s answer breaks (empty when it passes them all)."""
    problems: list[str] = []
    if status >= 500:
        problems.append(f"status {status}")
    if _LEAKS.search(text):
        problems.append(f"leak: {_LEAKS.search(text).group(0)!r}")  # type: ignore[union-attr]
    if status == 200:
        if probe.stream:
            problems.extend(_check_stream(probe, text))
        else:
            try:
                json.loads(text)
            except ValueError:
                problems.append("a 200 without a JSON body")
        return problems
    try:
        body = json.loads(text)
    except ValueError:
        return [*problems, "an error without a JSON body"]
    if probe.route.anthropic:
        ok = (
            isinstance(body, dict)
            and body.get("type") == "error"
            and set(body.get("error", {})) == {"type", "message"}
        )
        message, param = (body["error"]["message"], None) if ok else ("", None)
    else:
        ok = isinstance(body, dict) and set(body.get("error", {})) == {"message", "type", "param", "code"}
        message, param = (body["error"]["message"], body["error"]["param"]) if ok else ("", None)
    if not ok:
        return [*problems, "not the route's error body"]
    if not isinstance(message, str) or not message:
        problems.append("an empty message")
    elif status in (400, 404, 422) and not _named(
        message, param, [*probe.fields, *(["stream"] if probe.stream else [])]
    ):
        problems.append(f"the message names none of {probe.fields}: {message[:200]!r} (param {param!r})")
    return problems


def _check_stream(probe: Probe, text: str) -> list[str]:
    """A 200 stream's invariants: it ends cleanly, and an error event is the last one."""
    events = [e for e in text.split("\n\n") if e.strip() and not e.startswith(":")]
    if not events:
        return ["an empty stream"]
    if probe.route.path == "/v1/responses":
        last = events[-1]
        if (
            "response.completed" not in last
            and "response.incomplete" not in last
            and "response.failed" not in last
        ):
            return [f"the stream ends with {last[:120]!r}"]
        return []
    if probe.route.anthropic:
        errors = [i for i, e in enumerate(events) if e.startswith("event: error")]
        if errors and errors[0] != len(events) - 1:
            return ["an error event is not the stream's last"]
        if not errors and not events[-1].startswith("event: message_stop"):
            return [f"the stream ends with {events[-1][:120]!r}"]
        return []
    if events[-1] != "data: [DONE]":
        return [f"the stream ends with {events[-1][:120]!r}"]
    errors = [i for i, e in enumerate(events) if e.startswith('data: {"error"')]
    if errors and errors != [len(events) - 2]:
        return ["an error event is not followed by [DONE] alone"]
    return []


def send(client: httpx.Client, url: str, probe: Probe) -> tuple[int, str]:
    """POST ``probe`` to the server at ``url``: (status, body text)."""
    r = client.post(
        url + probe.route.path, content=probe.encode(), headers={"content-type": "application/json"}
    )
    return r.status_code, r.text


def engine_alive(client: httpx.Client, url: str) -> bool:
    """A normal completion of exactly 4 tokens is served."""
    r = client.post(url + "/v1/completions", json={"prompt": "Once", "max_tokens": 4, "ignore_eos": True})
    return r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def main() -> None:
    """The long run by hand: fuzz a running server for ``--seconds``; print what broke."""
    from hypothesis import HealthCheck, Phase, given, settings

    parser = argparse.ArgumentParser(description="fuzz a running surge serve")
    parser.add_argument("--url", required=True)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cut-streams", action="store_true", help="also close every 4th stream after its first bytes"
    )
    args = parser.parse_args()
    sent, failures, cut, statuses = 0, 0, 0, {}
    deadline = time.monotonic() + args.seconds
    client = httpx.Client(timeout=120)

    @settings(
        database=None,
        max_examples=100,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(probes())
    def batch(probe: Probe) -> None:
        nonlocal sent, failures, cut
        if time.monotonic() > deadline:
            return
        if args.cut_streams and probe.stream and (sent % 4 == 0):
            with client.stream(
                "POST",
                args.url + probe.route.path,
                content=probe.encode(),
                headers={"content-type": "application/json"},
            ) as r:
                next(r.iter_raw(), b"")  # then the connection is closed mid-answer
            sent, cut = sent + 1, cut + 1
            return
        status, text = send(client, args.url, probe)
        sent += 1
        statuses[status] = statuses.get(status, 0) + 1
        problems = check_answer(probe, status, text)
        if problems:
            failures += 1
            print(
                f"FAIL {probe.route.path} fields={probe.fields!r:.300} stream={probe.stream} {status}: "
                f"{problems}\n  body {probe.encode()[:300]!r}\n  answer {text[:300]!r}",
                flush=True,
            )

    seed = args.seed
    while time.monotonic() < deadline:
        batch._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
        batch()
        seed += 1
        alive = engine_alive(client, args.url)
        print(
            f"seed {seed}: sent {sent} ({cut} streams cut), failures {failures}, statuses {statuses}, "
            f"engine alive {alive}",
            flush=True,
        )


if __name__ == "__main__":
    main()
