"""Structured outputs over HTTP with the openai SDK: response_format (json_schema,
json_object), vLLM's structured_outputs and the guided_* names on chat and completions,
streamed and not, and the metrics they update."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.server.conftest import Server
from tests.structured.test_offline_constrained import CHOICES, REGEX, SCHEMA

MSGS = [{"role": "user", "content": "Tell me about a pet."}]


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_response_format_json_schema_chat(client: openai.OpenAI) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA, "strict": True}}
    for seed in range(6):
        r = client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=MSGS,  # type: ignore[arg-type]
            response_format=rf,  # type: ignore[arg-type]
            temperature=1.0,
            seed=seed,
            max_tokens=200,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)


def test_json_object_and_streamed_schema(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    r = client.chat.completions.create(
        model=model,
        messages=MSGS,
        response_format={"type": "json_object"},
        max_tokens=30,
        temperature=0.0,  # type: ignore[arg-type]
    )
    assert (r.choices[0].message.content or "").startswith("{")
    stream = client.chat.completions.create(
        model=model,
        messages=MSGS,  # type: ignore[arg-type]
        response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}},  # type: ignore[arg-type]
        temperature=1.0,
        seed=3,
        max_tokens=200,
        stream=True,
        n=2,
    )
    texts: dict[int, str] = {}
    finish: dict[int, str | None] = {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert finish == {0: "stop", 1: "stop"}
    for text in texts.values():
        jsonschema.validate(json.loads(text), SCHEMA)


def test_structured_outputs_and_guided_on_completions(client: openai.OpenAI, server: Server) -> None:
    model = client.models.list().data[0].id
    for seed in range(4):
        r = client.completions.create(
            model=model,
            prompt="Once upon a time",
            max_tokens=40,
            temperature=1.0,
            seed=seed,
            extra_body={"structured_outputs": {"regex": REGEX}},
        )
        assert re.fullmatch(REGEX, r.choices[0].text)
        r = client.completions.create(
            model=model, prompt="Once", max_tokens=20, seed=seed, extra_body={"guided_choice": CHOICES}
        )
        assert r.choices[0].text in CHOICES
    r = client.chat.completions.create(
        model=model,
        messages=MSGS,  # type: ignore[arg-type]
        max_tokens=20,
        extra_body={"structured_outputs": {"choice": ["red", "green"]}},
    )
    assert r.choices[0].message.content in ("red", "green")
    r = client.chat.completions.create(
        model=model,
        messages=MSGS,  # type: ignore[arg-type]
        max_tokens=60,
        extra_body={"guided_grammar": 'root ::= "(" [a-c]+ ")"'},
    )
    assert (
        re.fullmatch(r"\([a-c]+\)", r.choices[0].message.content or "")
        or r.choices[0].finish_reason == "length"
    )
    cut = client.chat.completions.create(
        model=model,
        messages=MSGS,
        max_tokens=4,
        extra_body={"guided_json": SCHEMA},  # type: ignore[arg-type]
    )
    assert cut.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model,
            messages=MSGS,  # type: ignore[arg-type]
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},  # type: ignore[arg-type]
        )
    assert e.value.body["param"] == "response_format.json_schema.schema"  # type: ignore[index]
    metrics = httpx.get(server.url + "/metrics").text
    assert re.search(r'surge:structured_output_requests_total\{[^}]*kind="regex"[^}]*\} [1-9]', metrics)
    assert re.search(r"surge:grammar_compile_time_seconds_count\{[^}]*\} [1-9]", metrics)


@pytest.mark.parametrize(
    ("rf", "param"),
    [
        ({"type": "json_object", "extra": 1}, "response_format.extra"),
        ({"type": "text", "json_schema": {}}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strcit": True}},
            "response_format.json_schema.strcit",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "maybe"}},
            "response_format.json_schema.strict",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "description": 5}},
            "response_format.json_schema.description",
        ),
        (  # both spellings of the schema: one would be ignored
            {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {}, "json_schema": {"type": "string"}},
            },
            "response_format.json_schema.json_schema",
        ),
    ],
)
def test_response_format_keys_are_checked(rf: dict[str, Any], param: str) -> None:
    """A key OpenAI does not define in response_format would be ignored: a 400 naming it."""
    from types import SimpleNamespace

    from surge.server.errors import ApiError
    from surge.server.structured_request import structured_outputs_of

    with pytest.raises(ApiError) as e:
        structured_outputs_of(SimpleNamespace(response_format=rf))
    assert e.value.status == 400 and e.value.param == param, e.value.message
    ok = {
        "type": "json_schema",
        "json_schema": {"name": "x", "description": "d", "schema": {}, "strict": False},
    }
    assert structured_outputs_of(SimpleNamespace(response_format=ok))[0] is not None
    # a key set to null is absent (clients dump unset fields); json_object with a schema binds it
    nulls = {"type": "json_object", "json_schema": None, "schema": None}
    assert structured_outputs_of(SimpleNamespace(response_format=nulls))[0].json_object
    bound, field = structured_outputs_of(
        SimpleNamespace(response_format={"type": "json_object", "schema": {"type": "integer"}})
    )
    assert json.loads(bound.json) == {"type": "integer"} and field == "response_format.schema"
    with pytest.raises(ApiError) as e:
        structured_outputs_of(
            SimpleNamespace(response_format={"type": "json_object", "schema": {"type": "nope"}})
        )
    assert e.value.param == "response_format.schema"


def test_structured_outputs_disable_any_whitespace_is_honoured() -> None:
    """vLLM's ``structured_outputs.disable_any_whitespace``: ``false`` (vLLM's default, sent by
    clients that dump the whole dict) was accepted and silently ignored (compact JSON); it now
    allows any whitespace, ``true`` (a 400 before) keeps the compact grammar, and a non-bool
    is a 400 naming it."""
    from types import SimpleNamespace

    from surge.server.errors import ApiError
    from surge.server.structured_request import structured_outputs_of

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}

    def params(**extra: Any) -> Any:
        so = {"json": schema, "json_object": None, "disable_fallback": False, **extra}
        return structured_outputs_of(SimpleNamespace(structured_outputs=so))[0]

    assert params().disable_any_whitespace and not params().any_whitespace
    assert params(disable_any_whitespace=True).disable_any_whitespace
    loose = params(disable_any_whitespace=False)
    assert not loose.disable_any_whitespace and loose.any_whitespace and loose.json == params().json
    with pytest.raises(ApiError) as e:
        params(disable_any_whitespace="no")
    assert e.value.status == 400 and e.value.param == "structured_outputs.disable_any_whitespace"


def test_structured_outputs_disable_additional_properties_is_taken() -> None:
    """vLLM's ``structured_outputs.disable_additional_properties`` (its guidance backend's switch
    that closes object schemas; vLLM's default xgrammar backend ignores it, its objects being
    closed already): ``true`` was a 400 "not supported", though Surge's grammar always closes
    objects; it is taken now, either value, with the same grammar (extra keys refused), and a
    non-bool is a 400 naming it."""
    from types import SimpleNamespace

    from xgrammar import testing as xgr_testing

    from surge.server.errors import ApiError
    from surge.server.structured_request import structured_outputs_of
    from surge.structured.validate import build_grammar

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}

    def params(**extra: Any) -> Any:
        so = {"json": schema, **extra}
        return structured_outputs_of(SimpleNamespace(structured_outputs=so))[0]

    plain = params()
    for value in (True, False):
        closed = params(disable_additional_properties=value)
        assert closed.key == plain.key
        grammar = build_grammar(closed)
        assert xgr_testing._is_grammar_accept_string(grammar, '{"a": 1}')
        assert not xgr_testing._is_grammar_accept_string(grammar, '{"a": 1, "b": 2}')
    with pytest.raises(ApiError) as e:
        params(disable_additional_properties="yes")
    assert e.value.status == 400 and e.value.param == "structured_outputs.disable_additional_properties"


def test_a_schema_too_slow_to_compile_is_a_400_naming_the_field(server: Server) -> None:
    """A 200-byte schema whose pattern repeats 20,000 times took xgrammar about half a minute
    (and held the event loop): refused before it is compiled, naming the field, on chat
    (response_format, a tool's parameters) and completions alike; the server still answers."""
    slow = {"type": "string", "pattern": "[a-z]{1,20000}"}
    cases = [
        (
            "/v1/chat/completions",
            {
                "messages": MSGS,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": slow}},
            },
            "response_format.json_schema.schema",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": MSGS,
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "properties": {"a": slow}},
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
        ),
        (
            "/v1/completions",
            {"prompt": "Once", "structured_outputs": {"json": slow}},
            "structured_outputs.json",
        ),
    ]
    for path, body, param in cases:
        r = httpx.post(server.url + path, json=body | {"max_tokens": 4}, timeout=120)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and "too large to compile" in err["message"], err
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": "Once", "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200


def _deep_any_of(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        node = {"anyOf": [{"type": "null"}, node]}
    return {"$defs": {"a": node}, "$ref": "#/$defs/a"}


def test_a_schema_nested_too_deeply_is_a_400_naming_the_field(server: Server) -> None:
    """anyOf nested 400 deep (12 KB) held a generation thread for seconds (time growing as the
    depth cubed) and passed: refused at once, naming the field, on response_format, a tool's
    parameters and guided_json (the message is the nesting check's, which runs before any
    compile; not timed here); a schema at the limit still works."""
    deep = _deep_any_of(400)
    tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": deep}}},
    }
    cases = [
        (
            "/v1/chat/completions",
            {
                "messages": MSGS,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": deep}},
            },
            "response_format.json_schema.schema",
        ),
        ("/v1/chat/completions", {"messages": MSGS, "tools": [tool], "tool_choice": "required"}, "tools"),
        ("/v1/completions", {"prompt": "Once", "guided_json": deep}, "guided_json"),
    ]
    for path, body, param in cases:
        r = httpx.post(server.url + path, json=body | {"max_tokens": 4}, timeout=120)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and "nested too deeply" in err["message"], err
    ok = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": "Once", "max_tokens": 2, "guided_json": _deep_any_of(60)},
        timeout=60,
    )
    assert ok.status_code == 200, ok.text


def test_negative_lengths_are_a_400_naming_the_field_and_the_keyword(server: Server) -> None:
    """minLength -3 reached the engine and came back as a 400 with param null and xgrammar's C++
    assertion; maxLength -1 was a 200 with an unbounded string; pattern 5 read "type mismatch!":
    each is refused in the API process, naming the field, the keyword and its location."""
    cases = [
        (
            {"type": "string", "minLength": -3},
            "response_format",
            "response_format.json_schema.schema",
            "'minLength' at #",
        ),
        (
            {"type": "object", "properties": {"name": {"type": "string", "maxLength": -1}}},
            "response_format",
            "response_format.json_schema.schema",
            "'maxLength' at #/properties/name",
        ),
        (
            {"type": "object", "properties": {"s": {"type": "string", "minLength": -3}}},
            "tool",
            "tools",
            "'minLength'",
        ),
        ({"type": "array", "minItems": -1}, "guided_json", "guided_json", "'minItems' at #"),
        (
            {"type": "string", "pattern": 5},
            "response_format",
            "response_format.json_schema.schema",
            "'pattern'",
        ),
    ]
    for schema, how, param, keyword in cases:
        body: dict[str, Any] = {"messages": MSGS, "max_tokens": 4}
        if how == "response_format":
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        elif how == "tool":
            body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
            body["tool_choice"] = {"type": "function", "function": {"name": "f"}}
        else:
            body["guided_json"] = schema
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and keyword in err["message"], err
        assert "Check failed" not in err["message"] and ".cc" not in err["message"], err


def test_a_schema_nothing_satisfies_is_a_400_not_a_stop(client: openai.OpenAI, server: Server) -> None:
    """A string pattern no character matches: the output was '"' with finish_reason "stop" (invalid
    JSON); now a 400 naming the dead end, streamed as an error event, and the server keeps serving."""
    import httpx

    rf = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "[^\\s\\S]"}},
    }
    body = {
        "model": client.models.list().data[0].id,
        "messages": MSGS,
        "max_tokens": 20,
        "response_format": rf,
    }
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and "no token can continue the grammar" in r.json()["error"]["message"], (
        r.text
    )
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=body | {"stream": True}, timeout=60
    ) as s:
        events = [line for line in s.iter_lines() if line.startswith("data:")]
    # an error event, then [DONE], ends the stream (as vLLM)
    assert "no token can continue the grammar" in events[-2] and events[-1] == "data: [DONE]", events
    # what was streamed before it is what the grammar took: the string's quote, and no token after
    # the dead end (the sampler used to give way to the empty mask row and stream one)
    deltas = [json.loads(e[5:])["choices"][0]["delta"] for e in events[:-2]]
    assert "".join(d.get("content") or "" for d in deltas) == '"', events
    ok = client.chat.completions.create(model=body["model"], messages=MSGS, max_tokens=3)  # type: ignore[arg-type]
    assert ok.choices[0].finish_reason in ("stop", "length")


LEFT_RECURSIVE = 'root ::= root | root "a"'
"""A grammar the API's check takes and the engine's compile refuses (it is left-recursive)."""


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "Once", "structured_outputs": {"grammar": LEFT_RECURSIVE}}, None),
        ("/v1/completions", {"prompt": "Once", "guided_grammar": LEFT_RECURSIVE}, None),
        ("/v1/chat/completions", {"messages": MSGS, "structured_outputs": {"grammar": LEFT_RECURSIVE}}, None),
        (
            "/v1/chat/completions",
            {
                "messages": MSGS,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "[^\\s\\S]"}},
                },
            },
            "response_format.json_schema.schema",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": MSGS,
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "type": "object",
                                "properties": {"a": {"type": "string", "pattern": "[^\\s\\S]"}},
                                "required": ["a"],
                            },
                        },
                    }
                ],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            "tools",
        ),
        (
            "/v1/responses",
            {
                "input": "Hi",
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "x",
                        "schema": {"type": "string", "pattern": "[^\\s\\S]"},
                    }
                },
            },
            "text.format.schema",
        ),
    ],
)
def test_a_grammar_the_engine_refuses_names_its_field(
    server: Server, path: str, body: dict[str, Any], param: str | None
) -> None:
    """The engine refuses a grammar after the request went to it (it does not compile, or it
    reaches a dead end): the error named no field (``param: null``), streamed or not; it names
    the field that carried the grammar."""
    if param is None:
        param = "guided_grammar" if "guided_grammar" in body else "structured_outputs.grammar"
    limit = {"max_output_tokens": 8} if path == "/v1/responses" else {"max_tokens": 8}
    r = httpx.post(server.url + path, json=body | limit, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    with httpx.stream("POST", server.url + path, json=body | limit | {"stream": True}, timeout=60) as s:
        data = [line[len("data: ") :] for line in s.iter_lines() if line.startswith("data: ")]
    if path == "/v1/responses":
        error = next(json.loads(d) for d in data if json.loads(d)["type"] == "error")
        assert (error["code"], error["param"]) == ("400", param), data
    else:
        assert data[-1] == "[DONE]", data
        error = json.loads(data[-2])["error"]
        assert (error["code"], error["param"]) == (400, param), data


PETS = {"enum": ["cat", "dog", "bird"]}
TAGGED = {
    "type": "structural_tag",
    "format": {
        "type": "tag",
        "begin": "<f>",
        "content": {"type": "json_schema", "json_schema": PETS},
        "end": "</f>",
    },
}
"""xgrammar's structural tag format: one tag from the start, a JSON value of ``PETS`` inside (a
schema without objects: inside a tag xgrammar allows any whitespace between JSON tokens, as in
vLLM, and the small model can spend its tokens on it)."""


def test_response_format_structural_tag(client: openai.OpenAI) -> None:
    """vLLM's ``response_format: {"type": "structural_tag", "format": ...}`` (refused before): the
    output is the tag with a JSON value of the schema between begin and end, streamed or not."""
    model = client.models.list().data[0].id
    for seed in range(3):
        r = client.chat.completions.create(
            model=model,
            messages=MSGS,  # type: ignore[arg-type]
            response_format=TAGGED,  # type: ignore[arg-type]
            temperature=1.0,
            seed=seed,
            max_tokens=200,
        )
        text = r.choices[0].message.content or ""
        assert r.choices[0].finish_reason == "stop", text
        assert text.startswith("<f>") and text.endswith("</f>"), text
        jsonschema.validate(json.loads(text[3:-4]), PETS)
    stream = client.completions.create(
        model=model,
        prompt="Once upon a time",
        extra_body={"structured_outputs": {"structural_tag": json.dumps(TAGGED)}},
        temperature=1.0,
        seed=5,
        max_tokens=200,
        stream=True,
    )
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert text.startswith("<f>") and text.endswith("</f>"), text
    jsonschema.validate(json.loads(text[3:-4]), PETS)


def test_structural_tag_requests_are_counted_under_their_kind(server: Server) -> None:
    """``structured_output_requests_total`` has a ``structural_tag`` kind, and its help and
    docs/structured-outputs.md name it among the kinds (they listed five)."""
    body = {"messages": MSGS, "max_tokens": 40, "temperature": 1.0, "seed": 0, "response_format": TAGGED}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    metrics = httpx.get(server.url + "/metrics").text
    assert re.search(
        r'surge:structured_output_requests_total\{[^}]*kind="structural_tag"[^}]*\} [1-9]', metrics
    )
    [help_line] = [
        line
        for line in metrics.splitlines()
        if line.startswith("# HELP surge:structured_output_requests_total")
    ]
    assert "structural_tag" in help_line, help_line
    docs = (Path(__file__).resolve().parents[2] / "docs" / "structured-outputs.md").read_text()
    [doc_line] = [line for line in docs.splitlines() if "structured_output_requests_total{kind}" in line]
    assert "structural_tag" in doc_line + docs.split(doc_line, 1)[1].split("\n- ", 1)[0], doc_line


def test_logprobs_under_a_grammar_are_those_of_the_masked_logits(server: Server) -> None:
    """As vLLM 0.26 (its grammar bitmask is applied to the logits its sampler reads the raw
    logprobs from), and as docs/openai-api.md says: a token the grammar forbids has -9999.0, and
    the allowed ones share all the probability."""
    body = {
        "messages": MSGS,
        "max_tokens": 10,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 5,
        "structured_outputs": {"choice": ["yes", "no"]},
    }
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] in ("yes", "no")
    text = ""
    for entry in choice["logprobs"]["content"]:
        allowed = [t for t in entry["top_logprobs"] if t["logprob"] > -9999.0]
        assert len(allowed) < len(entry["top_logprobs"]), entry  # forbidden tokens are -9999.0
        if len(allowed) == 1:  # the grammar leaves one token: all the probability is its
            assert abs(allowed[0]["logprob"]) < 1e-4, entry
        for t in allowed:
            assert any(c.startswith(text + t["token"]) for c in ("yes", "no")) or text in ("yes", "no"), entry
        text += entry["token"] if text not in ("yes", "no") else ""


def test_a_null_key_of_the_other_structural_tag_form_is_unset(server: Server) -> None:
    """``"structures": null`` next to ``format`` (a client that serializes both forms' keys) is
    the ``format`` form, as a null field is unset elsewhere; it was a 400 saying ``structures``
    must be a non-empty list."""
    body = {"messages": MSGS, "max_tokens": 200, "temperature": 1.0, "seed": 0}
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json=body | {"response_format": TAGGED | {"structures": None, "triggers": None}},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].startswith("<f>"), r.text


def test_legacy_structural_tag_is_free_text_until_a_trigger(client: openai.OpenAI) -> None:
    """The older form (``structures`` + ``triggers``, as vLLM's tool-call paths send it): free text,
    and after a trigger the tagged JSON; a structured_outputs object is taken as JSON text is."""
    legacy = {
        "type": "structural_tag",
        "structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}],
        "triggers": ["<f>"],
    }
    model = client.models.list().data[0].id
    r = client.completions.create(
        model=model,
        prompt="Once upon a time",
        extra_body={"response_format": legacy},
        temperature=0.0,
        max_tokens=20,
    )
    free = r.choices[0].text
    assert r.choices[0].finish_reason == "length" and "<f>" not in free
    plain = client.completions.create(model=model, prompt="Once upon a time", temperature=0.0, max_tokens=20)
    assert free == plain.choices[0].text  # nothing constrained before a trigger
    r = client.completions.create(
        model=model,
        prompt="Once upon a time",
        extra_body={"structured_outputs": {"structural_tag": legacy}},
        temperature=0.0,
        max_tokens=20,
    )
    assert r.choices[0].text == free


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"response_format": {"type": "structural_tag"}}, "response_format", "either 'format'"),
        (
            {"response_format": {"type": "structural_tag", "format": {"type": "nope"}}},
            "response_format",
            "Format type not recognized",
        ),
        (
            {
                "response_format": {
                    "type": "structural_tag",
                    "format": {
                        "type": "tag",
                        "begin": "<f>",
                        "content": {"type": "json_schema", "json_schema": {"uniqueItems": True}},
                        "end": "</f>",
                    },
                }
            },
            "response_format",
            "format.content.json_schema: keyword 'uniqueItems'",
        ),
        (
            {"structured_outputs": {"structural_tag": "{not json"}},
            "structured_outputs.structural_tag",
            "not JSON",
        ),
        (
            {"structured_outputs": {"structural_tag": {"structures": [{"begin": "a"}], "triggers": ["a"]}}},
            "structured_outputs.structural_tag",
            "structures[0] needs string 'begin' and 'end'",
        ),
        ({"structural_tag": "{}"}, "structural_tag", "top-level structural_tag is not read"),
        (  # the format form has no triggers: they were silently ignored
            {"response_format": TAGGED | {"triggers": ["<f>"]}},
            "response_format.triggers",
            "belongs to the older structural tag form",
        ),
        (  # the same in structured_outputs' JSON text: xgrammar ignored the key
            {"structured_outputs": {"structural_tag": json.dumps(TAGGED | {"triggers": ["<f>"]})}},
            "structured_outputs.structural_tag",
            "unknown key 'triggers'",
        ),
    ],
)
def test_bad_structural_tags_are_a_400_naming_the_field(
    server: Server, body: dict[str, Any], param: str, words: str
) -> None:
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json={"messages": MSGS, "max_tokens": 5, **body},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
