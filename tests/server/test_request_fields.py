"""Issue 9: every request field honoured or refused, stop_reason, errors naming the right
field, request ids and streaming usage, against the shared live server (bundled model)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import httpx
import openai
import pytest

from surge.server.errors import ApiError
from surge.server.field_policy import (
    INERT_FIELDS,
    NULLABLE_CHAT_FIELDS,
    NULLABLE_COMPLETION_FIELDS,
    REFUSALS,
)
from surge.server.protocol import ChatCompletionRequest, CompletionRequest
from surge.tokenizer import RESERVED_TEMPLATE_KWARGS
from tests.server.conftest import Server

PROMPT = "Once upon a time"
CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MSGS = [{"role": "user", "content": "Once upon a time"}]


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _post(srv: Server, path: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=120, **kw)


def _events(srv: Server, path: str, body: dict[str, Any]) -> list[Any]:
    r = _post(srv, path, body | {"stream": True})
    assert r.status_code == 200, r.text
    out: list[Any] = []
    for ev in r.text.strip().split("\n\n"):
        if ev.startswith(":"):  # ": queued" comments
            continue
        payload = ev.removeprefix("data: ")
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def _tokens(srv: Server, text: str) -> list[int]:
    r = _post(srv, "/tokenize", {"prompt": text, "add_special_tokens": False})
    return r.json()["tokens"]


# --- field accounting -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {"messages": MSGS, "frobnicate": 1}, "frobnicate"),
        (CMPL, {"prompt": PROMPT, "max_token": 5}, "max_token"),
        (
            CMPL,
            {"prompt": PROMPT, "stream": True, "stream_options": {"include_usages": True}},
            "stream_options.include_usages",
        ),
        ("/tokenize", {"prompt": PROMPT, "nonsense": True}, "nonsense"),
    ],
)
def test_unknown_fields_are_refused_by_name(
    server: Server, path: str, body: dict[str, Any], param: str
) -> None:
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"]


@pytest.mark.parametrize(
    ("path", "body", "param", "hint"),
    [
        (
            CHAT,
            {"prompt": PROMPT, "max_tokens": 2},
            "messages",
            "a body with 'prompt' goes to POST /v1/completions",
        ),
        (CMPL, {"messages": MSGS}, "prompt", "a body with 'messages' goes to POST /v1/chat/completions"),
        (
            "/v1/responses",
            {"messages": MSGS},
            "input",
            "a body with 'messages' goes to POST /v1/chat/completions",
        ),
        (CHAT, {"input": PROMPT}, "messages", "a body with 'input' goes to POST /v1/responses"),
    ],
)
def test_a_body_sent_to_another_endpoints_route_says_where_it_goes(
    server: Server, path: str, body: dict[str, Any], param: str, hint: str
) -> None:
    """A completions body sent to the chat route was "messages: Field required (and 1 more
    error)", the other error (the unknown 'prompt') left unsaid; the 400 now names the route the
    body's field belongs to."""
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert err["message"] == f"{param}: Field required ({hint}; this endpoint takes '{param}')", err


REFUSED_REQUESTS: list[tuple[str, str, Any]] = [
    (CHAT, "use_beam_search", True),
    (CMPL, "use_beam_search", True),
    (CHAT, "priority", 5),
    (CMPL, "lora_request", {"lora_name": "x"}),
    (CHAT, "structural_tag", {"type": "structural_tag"}),
    (CMPL, "guided_decoding_backend", "xgrammar"),
    (CHAT, "guided_whitespace_pattern", " "),
    (CHAT, "functions", [{"name": "f"}]),
    (CMPL, "tools", [{"type": "function", "function": {"name": "f"}}]),
    (CMPL, "tool_choice", "required"),
    (CMPL, "parallel_tool_calls", False),
    (CMPL, "best_of", 3),
    (CMPL, "suffix", "end"),
    (CHAT, "audio", {"voice": "alloy"}),
    (CHAT, "modalities", ["text", "audio"]),
    (CMPL, "logits_processors", ["x"]),
    # their defaults in another JSON type are not the default (no coercion; 5 was a 500)
    (CHAT, "modalities", 5),
    (CHAT, "modalities", "text"),
    (CHAT, "length_penalty", True),
    (CHAT, "priority", False),
    (CMPL, "best_of", True),
    (CMPL, "best_of", "1"),
    (CMPL, "use_beam_search", 0),
    (CHAT, "return_token_ids", 0),
    (CMPL, "return_tokens_as_token_ids", 0),
    (CHAT, "return_tokens_as_token_ids", 0.0),
    (CMPL, "mm_processor_kwargs", ""),
    (CHAT, "functions", {}),  # a list: an empty object is not its empty default
    (CMPL, "logits_processors", {}),
    (CHAT, "mm_processor_kwargs", []),  # an object
    (CMPL, "vllm_xargs", []),
    (CMPL, "top_logprobs", 3),  # chat's field: on completions it would do nothing
    (CHAT, "ec_transfer_params", {"x": 1}),
    (CMPL, "ec_transfer_params", {}),
    (CHAT, "verbosity", "high"),
    # an inert field still takes only OpenAI's values
    (CHAT, "service_tier", "bogus"),
    (CMPL, "service_tier", "fast"),
]


@pytest.mark.parametrize(("path", "name", "value"), REFUSED_REQUESTS)
def test_refused_fields_name_themselves(server: Server, path: str, name: str, value: Any) -> None:
    body: dict[str, Any] = {"messages": MSGS} if path == CHAT else {"prompt": PROMPT}
    r = _post(server, path, body | {name: value, "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == name and name in err["message"]
    if name == "functions":  # the deprecated form: the message names the one to use
        assert "use tools" in err["message"]


@pytest.mark.parametrize("path", [CMPL, CHAT])
def test_best_of_below_n_is_a_400_naming_best_of(server: Server, path: str) -> None:
    """OpenAI and vLLM refuse best_of < n; best_of 1 with n 1 (or best_of left out) is fine."""
    body: dict[str, Any] = {"messages": MSGS} if path == CHAT else {"prompt": PROMPT}
    r = _post(server, path, body | {"n": 2, "best_of": 1, "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "best_of" and err["type"] == "invalid_request_error"
    assert err["message"] == "best_of must be greater than or equal to n, got n=2 and best_of=1"
    for ok in ({"n": 1, "best_of": 1}, {"n": 2}, {"n": 2, "best_of": None}):
        r = _post(server, path, body | ok | {"max_tokens": 2})
        assert r.status_code == 200, (ok, r.text)


@pytest.mark.parametrize("path", [CMPL, CHAT])
def test_best_of_equal_to_n_is_the_n_choices(server: Server, path: str) -> None:
    """best_of equal to n asks for n samples and returns them all, which is what n does: taken (it
    was refused unless 1; OpenAI takes it, vLLM 0.26 ignores the field). Above n it would rank more
    samples than it returns: a 400 naming best_of, with the counts."""
    body: dict[str, Any] = {"messages": MSGS} if path == CHAT else {"prompt": PROMPT}
    for best_of in (2, 2.0):
        r = _post(server, path, body | {"n": 2, "best_of": best_of, "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 2
    r = _post(server, path, body | {"n": 2, "best_of": 3, "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "best_of" and "got n=2 and best_of=3" in err["message"], err


def test_refused_fields_accept_their_defaults(server: Server) -> None:
    defaults = {
        "use_beam_search": False,
        "priority": 0,
        "best_of": 1,
        "length_penalty": 1.0,
        "response_format": {"type": "text"},
        "tool_choice": "none",
        "modalities": ["text"],
        "verbosity": "medium",  # OpenAI's default
    }
    r = _post(server, CHAT, {"messages": MSGS, "max_tokens": 2} | defaults)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("path", "body", "name", "value", "reason"),
    [
        ("/tokenize", {"messages": MSGS}, "mm_processor_kwargs", {"fps": 1}, "multimodal"),
        ("/tokenize", {"messages": MSGS}, "media_io_kwargs", {"video": {"n": 1}}, "multimodal"),
        ("/tokenize", {"prompt": PROMPT}, "media_io_kwargs", {"video": {"n": 1}}, "multimodal"),
        ("/v1/responses", {"input": PROMPT}, "ec_transfer_params", {"x": 1}, "encoder-cache"),
        (
            "/v1/messages",
            {"max_tokens": 2, "messages": MSGS},
            "ec_transfer_params",
            {"x": 1},
            "encoder-cache",
        ),
    ],
)
def test_vllm_options_of_tokenize_responses_and_messages(
    server: Server, path: str, body: dict[str, Any], name: str, value: Any, reason: str
) -> None:
    """vLLM 0.26 declares these fields on its /tokenize (chat form), Responses and Messages
    requests: their defaults are accepted (they were "unknown fields"), another value is
    refused naming the field and why, as on chat completions."""
    for default in (None, {}) if name != "ec_transfer_params" else (None,):
        r = _post(server, path, body | {name: default})
        assert r.status_code == 200, r.text
    r = _post(server, path, body | {name: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert f"'{name}' is not supported by Surge" in err["message"] and reason in err["message"]
    if path != "/v1/messages":  # Anthropic's error body has no param
        assert err["param"] == name


def test_every_declared_field_is_accounted_for() -> None:
    """A field the protocol declares is honoured (listed in the docs), refused or inert."""
    doc = (__import__("pathlib").Path(__file__).parents[2] / "docs" / "openai-api.md").read_text()
    refused = {r.name for r in REFUSALS}
    for model in (ChatCompletionRequest, CompletionRequest):
        for name in model.model_fields:
            assert f"`{name}`" in doc, f"{model.__name__}.{name} is not in docs/openai-api.md"
            assert name not in refused or name not in INERT_FIELDS


def test_refused_fields_default_to_an_allowed_value() -> None:
    """``check_unimplemented`` checks only the fields a client sent: that is only exact when a
    refused field left out (its default) is always allowed."""
    for model in (ChatCompletionRequest, CompletionRequest):
        for r in REFUSALS:
            if r.name in model.model_fields:
                default = model.model_fields[r.name].get_default(call_default_factory=True)
                assert r.allowed(default), f"{model.__name__}.{r.name} defaults to a refused value"


def test_check_unimplemented_names_the_first_refused_field_sent() -> None:
    """Among several refused fields, the first in REFUSALS order is named (as before the
    check looked at the sent fields only); a refused field sent with its default passes."""
    ok = ChatCompletionRequest.model_validate({"messages": MSGS, "best_of": 1, "use_beam_search": False})
    ok.check_unimplemented()
    bad = ChatCompletionRequest.model_validate({"messages": MSGS, "vllm_xargs": {"a": 1}, "best_of": 1.5})
    with pytest.raises(ApiError) as e:
        bad.check_unimplemented()
    assert e.value.param == "best_of"
    assert e.value.message == (
        "'best_of' is not supported by Surge: best_of must be a whole number of at least 1 (each choice is sampled once; use n)"
    )


# --- cache_salt (vLLM's prefix-cache isolation) ---------------------------------------------


def _prefix_cache_hits(srv: Server) -> float:
    text = httpx.get(srv.url + "/metrics").text
    m = re.search(r"^surge:prefix_cache_hits_total\{[^}]*\} (\S+)$", text, re.M)
    assert m, text
    return float(m.group(1))


def test_cache_salt_isolates_the_prefix_cache(server: Server) -> None:
    """vLLM's ``cache_salt`` (refused before): the same prompt hits the prefix cache only under the
    same salt; a salted prompt never hits an unsalted one's blocks. Both endpoints take it."""
    prompt = f"{uuid.uuid4().hex} Once upon a time there was a little girl who loved to play outside."
    assert len(_tokens(server, prompt)) > 40  # full KV blocks (16 tokens) to share

    def hits(salt: str | None) -> float:
        before = _prefix_cache_hits(server)
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": 2} | ({"cache_salt": salt} if salt else {})
        r = _post(server, CMPL, body)
        assert r.status_code == 200, r.text
        return _prefix_cache_hits(server) - before

    assert hits("tenant-a") == 0
    assert hits("tenant-a") > 0
    assert hits("tenant-b") == 0
    assert hits(None) == 0
    assert hits(None) > 0 and hits("tenant-b") > 0
    r = _post(
        server, CHAT, {"messages": MSGS, "max_tokens": 2, "cache_salt": "tenant-a", "n": 2, "stream": True}
    )
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n"), r.text


@pytest.mark.parametrize("path", [CMPL, CHAT])
@pytest.mark.parametrize("value", ["", 5, ["a"]])
def test_cache_salt_must_be_a_non_empty_string(server: Server, path: str, value: Any) -> None:
    """As vLLM: an empty or non-string salt is a 400 naming ``cache_salt``; ``null`` is no salt."""
    body: dict[str, Any] = {"messages": MSGS} if path == CHAT else {"prompt": PROMPT}
    r = _post(server, path, body | {"cache_salt": value, "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "cache_salt" and "string" in err["message"], err  # not "not supported"
    r = _post(server, path, body | {"cache_salt": None, "max_tokens": 2})
    assert r.status_code == 200, r.text


# --- null: "not set" for the fields OpenAI declares nullable -------------------------------


@pytest.mark.parametrize(
    ("model", "base", "nullable"),
    [
        (ChatCompletionRequest, {"messages": MSGS}, NULLABLE_CHAT_FIELDS),
        (CompletionRequest, {"prompt": PROMPT}, NULLABLE_COMPLETION_FIELDS),
    ],
)
def test_null_is_the_same_as_leaving_out(model: Any, base: dict[str, Any], nullable: frozenset[str]) -> None:
    """Every field OpenAI declares nullable takes null, and the request is exactly the one
    that leaves the field out (values and the fields "sent"), so it is never refused either
    (completions' max_tokens too: null is 16, as in vLLM 0.26)."""
    assert nullable <= model.model_fields.keys(), "the nullable fields are fields of the model"
    left_out = model.model_validate(base)
    for name in sorted(nullable - base.keys()):
        with_null = model.model_validate(base | {name: None})
        assert with_null.model_dump() == left_out.model_dump(), name
        assert with_null.model_fields_set == left_out.model_fields_set, name
        with_null.check_unimplemented()
    with pytest.raises(ValueError, match="prompt"):
        CompletionRequest.model_validate({"prompt": None})  # null is "not set": a missing prompt


def test_max_tokens_null() -> None:
    """Chat: null is "not set" (all the room left); completions: 16, as left out (OpenAI's
    default, and vLLM 0.26's normalize_null_max_tokens)."""
    chat = ChatCompletionRequest.model_validate({"messages": MSGS, "max_tokens": None})
    assert chat.model_fields_set == {"messages"} and chat.requested_max_tokens is None
    cmpl = CompletionRequest.model_validate({"prompt": PROMPT, "max_tokens": None})
    assert cmpl.requested_max_tokens == 16 and not cmpl.max_tokens_sent
    assert CompletionRequest.model_validate({"prompt": PROMPT}).requested_max_tokens == 16


@pytest.mark.parametrize("path", [CHAT, CMPL])
def test_null_fields_over_http(server: Server, path: str) -> None:
    """The user trial's n: null and echo: null, then every nullable field null at once: the
    same answer as leaving them all out."""
    base: dict[str, Any] = {"messages": MSGS} if path == CHAT else {"prompt": PROMPT}
    base |= {"temperature": 0, "max_tokens": 5, "ignore_eos": True}
    ref = _post(server, path, base).json()
    nullable = NULLABLE_CHAT_FIELDS if path == CHAT else NULLABLE_COMPLETION_FIELDS
    for nulls in ({"n": None}, {"echo": None}, dict.fromkeys(nullable - base.keys() - {"prompt"})):
        if path == CHAT and "echo" in nulls and len(nulls) == 1:
            continue  # chat's echo is vLLM's boolean extension, not an OpenAI field
        r = _post(server, path, base | nulls)
        assert r.status_code == 200, (nulls, r.text)
        assert r.json()["choices"] == ref["choices"] and r.json()["usage"] == ref["usage"]
    # completions' max_tokens: null is 16 as left out (vLLM 0.26), not all the room left; both
    # shrink to the room a long prompt leaves
    if path == CMPL:
        for prompt, tokens in ((PROMPT, 16), ([5] * 500, 12)):
            r = _post(server, CMPL, {"prompt": prompt, "max_tokens": None, "ignore_eos": True})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == tokens, r.text


def test_inert_fields_are_accepted(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=MSGS,
        max_tokens=3,
        user="u1",
        metadata={"k": "v"},
        store=False,
        service_tier="flex",
        parallel_tool_calls=False,
        extra_body={"prompt_cache_key": "p", "safety_identifier": "s"},
    )
    assert r.choices[0].message.content is not None


# --- stop_reason, include_stop_str_in_output ----------------------------------------------


def _choice(body: dict[str, Any], kind: str) -> tuple[str, str, Any]:
    c = body["choices"][0]
    text = c["message"]["content"] if kind == "chat" else c["text"]
    return text, c["finish_reason"], c["stop_reason"]


def _streamed(events: list[Any], kind: str) -> tuple[str, str | None, Any]:
    assert events[-1] == "[DONE]"
    text, finish, stop = "", None, "missing"
    for e in events[:-1]:
        for c in e["choices"]:
            text += (c["delta"].get("content") or "") if kind == "chat" else c["text"]
            if c["finish_reason"] is not None:
                finish, stop = c["finish_reason"], c.get("stop_reason", "missing")
    return text, finish, stop


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_stop_reason(server: Server, kind: str) -> None:
    path = CHAT if kind == "chat" else CMPL
    base: dict[str, Any] = ({"messages": MSGS} if kind == "chat" else {"prompt": PROMPT}) | {"temperature": 0}
    # (the model's own EOS, stop_reason null: tests/server/test_generation_config.py)
    # a stop string: the string
    ref = _choice(_post(server, path, base | {"max_tokens": 30}).json(), kind)[0]
    word = ref.split()[3]
    body = base | {"max_tokens": 30, "stop": [word]}
    text, finish, stop = _choice(_post(server, path, body).json(), kind)
    assert (finish, stop) == ("stop", word) and text == ref[: ref.index(word)]
    assert _streamed(_events(server, path, body), kind) == (text, "stop", word)
    # include_stop_str_in_output keeps it
    body |= {"include_stop_str_in_output": True}
    text, finish, stop = _choice(_post(server, path, body).json(), kind)
    assert (finish, stop) == ("stop", word) and text == ref[: ref.index(word) + len(word)]
    assert _streamed(_events(server, path, body), kind) == (text, "stop", word)
    # a stop token id: the id
    ids = _tokens(server, word)
    body = base | {"max_tokens": 30, "stop_token_ids": [ids[-1]]}
    full = _post(server, path, body).json()
    text, finish, stop = _choice(full, kind)
    assert (finish, stop) == ("stop", ids[-1])
    assert _streamed(_events(server, path, body), kind) == (text, "stop", ids[-1])
    # length: null
    text, finish, stop = _choice(
        _post(server, path, base | {"max_tokens": 3, "ignore_eos": True}).json(), kind
    )
    assert (finish, stop) == ("length", None)


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_repetition_detection_ends_a_repeating_output(server: Server, kind: str) -> None:
    """vLLM 0.26's repetition_detection: an output made to repeat one token (allowed_token_ids)
    ends after min_count copies with finish_reason "repetition" and stop_reason
    "repetition_detected", streamed or not; min_tokens holds it back; the engine's counter of
    finished requests has the reason."""
    path = CHAT if kind == "chat" else CMPL
    # the reason's series is there from the start, as vLLM's finish-reason counters
    assert 'finished_reason="repetition"' in httpx.get(server.url + "/metrics", timeout=30).text
    token = _tokens(server, " the")[-1]
    base: dict[str, Any] = ({"messages": MSGS} if kind == "chat" else {"prompt": PROMPT}) | {
        "max_tokens": 40,
        "allowed_token_ids": [token],
        "return_token_ids": True,
        "repetition_detection": {"max_pattern_size": 3, "min_count": 4},
    }
    full = _post(server, path, base).json()
    text, finish, stop = _choice(full, kind)
    assert (finish, stop) == ("repetition", "repetition_detected")
    assert full["choices"][0]["token_ids"] == [token] * 4
    assert full["usage"]["completion_tokens"] == 4
    assert _streamed(_events(server, path, base), kind) == (text, "repetition", "repetition_detected")
    held = _post(server, path, base | {"min_tokens": 9}).json()
    assert (
        held["choices"][0]["token_ids"] == [token] * 9 and held["choices"][0]["finish_reason"] == "repetition"
    )
    # detection that finds nothing, or turned off (max_pattern_size 0), leaves the length limit
    for off in ({"max_pattern_size": 3, "min_count": 41}, {"max_pattern_size": 0}):
        r = _post(server, path, base | {"repetition_detection": off}).json()
        assert (r["choices"][0]["finish_reason"], r["usage"]["completion_tokens"]) == ("length", 40)
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    assert re.search(r'request_success_total\{[^}]*finished_reason="repetition"[^}]*\} [1-9]', metrics)


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ({"max_pattern_size": 3}, "repetition_detection.min_count"),
        ({"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 2}, "repetition_detection"),
        ({"max_pattern_size": -1, "min_count": 2}, "repetition_detection.max_pattern_size"),
        ({"max_pattern_size": 257, "min_count": 2}, "repetition_detection.max_pattern_size"),
        ({"max_pattern_size": 3, "min_count": 2, "window": 4}, "repetition_detection.window"),
        ({"max_pattern_size": "3", "min_count": 2}, "repetition_detection.max_pattern_size"),
        (3, "repetition_detection"),
    ],
)
def test_bad_repetition_detection_is_a_400_naming_it(server: Server, value: Any, param: str) -> None:
    r = _post(server, CMPL, {"prompt": PROMPT, "max_tokens": 2, "repetition_detection": value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "repetition_detection" in err["message"], err


def test_stop_reason_openai_sdk(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=30, temperature=0, stop=["girl"])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].model_extra["stop_reason"] == "girl"


# --- prompt shaping: truncation, chat template fields ------------------------------------


def test_truncate_prompt_tokens(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    long = PROMPT + " there was a little girl named Lily who liked to play"
    r = client.completions.create(
        model=model, prompt=long, max_tokens=2, extra_body={"truncate_prompt_tokens": 4}
    )
    assert r.usage.prompt_tokens == 4
    c = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": long}],
        max_tokens=2,
        extra_body={"truncate_prompt_tokens": 3},
    )
    assert c.usage.prompt_tokens == 3


def test_truncate_prompt_tokens_of_a_prompt_longer_than_the_context(server: Server) -> None:
    """A prompt far over the 512-token context (which the cheap length bound alone refuses)
    is tokenized whole and keeps its last k tokens, in completions and chat."""
    long = "once upon a time " * 2000
    r = _post(server, CMPL, {"prompt": long, "max_tokens": 2})
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]
    r = _post(server, CMPL, {"prompt": long, "max_tokens": 2, "truncate_prompt_tokens": 100})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 100
    msgs = [{"role": "user", "content": long}]
    r = _post(server, CHAT, {"messages": msgs, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = _post(server, CHAT, {"messages": msgs, "max_tokens": 2, "truncate_prompt_tokens": 50})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 50


def test_truncate_prompt_tokens_minus_one_leaves_room_for_the_output(server: Server) -> None:
    """vLLM 0.26's truncate_prompt_tokens -1 keeps max_model_len - max_tokens prompt tokens (the
    chat's max_completion_tokens too; 16 on completions when left out), from either end: it kept
    max_model_len tokens, so every prompt it cut left no room and was a 400."""
    context = 512
    ids = [10 + i % 400 for i in range(context + 300)]  # ids of the 512-token vocabulary
    for side, keep in (("left", lambda k: ids[-k:]), ("right", lambda k: ids[:k])):
        for extra, out in (({"max_tokens": 4}, 4), ({}, 16)):
            body = {"prompt": ids, "truncate_prompt_tokens": -1, "truncation_side": side} | extra
            r = _post(server, CMPL, body | {"return_token_ids": True, "ignore_eos": True})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["prompt_token_ids"] == keep(context - out), (side, extra)
            assert r.json()["usage"]["completion_tokens"] == out
    msgs = [{"role": "user", "content": "once upon a time " * 2000}]
    for field in ("max_tokens", "max_completion_tokens"):
        r = _post(server, CHAT, {"messages": msgs, field: 3, "truncate_prompt_tokens": -1})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == context - 3
    # a chat request without max_tokens keeps the whole context: no room is left for the output
    r = _post(server, CHAT, {"messages": msgs, "truncate_prompt_tokens": -1})
    assert r.status_code == 400 and "no room" in r.json()["error"]["message"], r.text


def test_truncation_side_picks_the_end_that_is_kept(server: Server) -> None:
    """vLLM's truncation_side: "left" (the default) keeps the last k prompt tokens, "right"
    the first k, on completions (text and token ids, seen through echo and prompt_token_ids)
    and chat; alone it cuts nothing; another value is a 400 naming it."""
    long = PROMPT + " there was a little girl named Lily who liked to play"
    ids = _tokens(server, long)
    base = {"max_tokens": 1, "return_token_ids": True, "truncate_prompt_tokens": 5}
    for prompt in (long, ids):
        full = _post(server, CMPL, {"prompt": prompt, "max_tokens": 1, "return_token_ids": True}).json()
        whole = full["choices"][0]["prompt_token_ids"]  # the text's: with its BOS
        for side, kept in ((None, whole[-5:]), ("left", whole[-5:]), ("right", whole[:5])):
            body = base | {"prompt": prompt} | ({} if side is None else {"truncation_side": side})
            r = _post(server, CMPL, body)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["prompt_token_ids"] == kept, (prompt, side)
    r = _post(server, CMPL, {"prompt": ids, "max_tokens": 1, "truncation_side": "right"})
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    msgs = [{"role": "user", "content": long}]
    chat = {"messages": msgs, "max_tokens": 1, "return_token_ids": True}
    whole = _post(server, CHAT, chat).json()["prompt_token_ids"]
    for side, kept in (("left", whole[-4:]), ("right", whole[:4])):
        r = _post(server, CHAT, chat | {"truncate_prompt_tokens": 4, "truncation_side": side})
        assert r.json()["prompt_token_ids"] == kept, side
    for path, body in ((CMPL, {"prompt": PROMPT}), (CHAT, {"messages": MSGS})):
        r = _post(server, path, body | {"truncate_prompt_tokens": 2, "truncation_side": "middle"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "truncation_side", r.text


def test_return_prompt_text(server: Server) -> None:
    """vLLM's chat return_prompt_text: the templated prompt's text at the top level of the
    response, or of each choice's first streamed chunk (n=2 too); absent unless asked."""
    body: dict[str, Any] = {"messages": MSGS, "max_tokens": 2, "return_token_ids": True}
    plain = _post(server, CHAT, body).json()
    assert "prompt_text" not in plain
    asked = _post(server, CHAT, body | {"return_prompt_text": True}).json()
    text = asked["prompt_text"]
    assert MSGS[0]["content"] in text
    # the bundled model has no template: its fallback rendering adds the BOS to the text's tokens
    ids = _post(server, "/tokenize", {"prompt": text, "add_special_tokens": True}).json()["tokens"]
    assert ids == asked["prompt_token_ids"]
    # streamed: each choice's role chunk, as vLLM's (it was the first chunk of all only, which
    # may be choice 1's: a client reading choice 0's first chunk found none)
    events = _events(server, CHAT, body | {"return_prompt_text": True, "n": 2})
    role_chunks = [e for e in events[:-1] if e["choices"] and "role" in e["choices"][0]["delta"]]
    assert sorted(e["choices"][0]["index"] for e in role_chunks) == [0, 1]
    assert all(e.get("prompt_text") == text for e in role_chunks)
    assert all("prompt_text" not in e for e in events[:-1] if e not in role_chunks)
    r = _post(server, CHAT, body | {"return_prompt_text": "yes"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "return_prompt_text"


def test_chat_echo_prepends_the_continued_message(server: Server) -> None:
    """vLLM's chat echo: the last message's content starts the answer when it has the answer's
    role (an assistant turn continued, or any last message under add_generation_prompt false),
    in a chunk of its own after the role chunk when streamed; a user's last message is not
    echoed under add_generation_prompt. Not streamed, echo asks for the prompt's logprobs
    (top_logprobs of them, 0 when unset), as vLLM."""
    partial = "Once upon a time, there was a"
    msgs = [{"role": "user", "content": "Tell me a story"}, {"role": "assistant", "content": partial}]
    base: dict[str, Any] = {
        "messages": msgs,
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    ref = _post(server, CHAT, base).json()
    new = ref["choices"][0]["message"]["content"]
    assert "prompt_logprobs" not in ref or ref["prompt_logprobs"] is None
    r = _post(server, CHAT, base | {"echo": True}).json()
    assert r["choices"][0]["message"]["content"] == partial + new
    assert r["usage"] == ref["usage"]
    rows = r["prompt_logprobs"]
    assert len(rows) == r["usage"]["prompt_tokens"] and rows[0] is None and len(rows[1]) in (1, 2)
    top = _post(server, CHAT, base | {"echo": True, "logprobs": True, "top_logprobs": 3}).json()
    assert 3 <= len(top["prompt_logprobs"][1]) <= 4  # the prompt token, and the 3 most likely
    events = _events(server, CHAT, base | {"echo": True})
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""} and deltas[1] == {"content": partial}
    assert "".join(d.get("content") or "" for d in deltas) == partial + new
    # a user's last message under add_generation_prompt: nothing to echo
    plain = {"messages": MSGS, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    a = _post(server, CHAT, plain).json()["choices"][0]["message"]["content"]
    assert _post(server, CHAT, plain | {"echo": True}).json()["choices"][0]["message"]["content"] == a


def test_chat_documents_reach_the_template(server: Server) -> None:
    """vLLM's RAG documents: passed to the chat template as ``documents`` (a template that
    reads them renders them; the bundled model's fallback rendering lists them first); not a
    list of objects is a 400 naming it."""
    docs = [{"title": "Lily", "text": "Lily liked to play."}, {"title": "Ben", "text": "Ben had a dog."}]
    template = "{% for d in documents %}[{{ d.title }}: {{ d.text }}]{% endfor %}{{ messages[-1].content }}"
    body: dict[str, Any] = {"messages": MSGS, "max_tokens": 2, "return_prompt_text": True}
    r = _post(server, CHAT, body | {"documents": docs, "chat_template": template}).json()
    assert r["prompt_text"] == "[Lily: Lily liked to play.][Ben: Ben had a dog.]" + MSGS[0]["content"]
    fallback = _post(server, CHAT, body | {"documents": docs}).json()["prompt_text"]
    assert fallback.startswith("documents: ") and "Ben had a dog." in fallback
    assert _post(server, CHAT, body).json()["prompt_text"] == fallback.split("\n", 1)[1]
    for bad in ("a document", [1], [{"title": 5}]):
        r2 = _post(server, CHAT, body | {"documents": bad})
        assert r2.status_code == 400 and r2.json()["error"]["param"] == "documents", r2.text


def test_truncate_prompt_tokens_bounds(server: Server) -> None:
    for k in (0, -2):
        r = _post(server, CMPL, {"prompt": PROMPT, "truncate_prompt_tokens": k})
        assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"
    r = _post(server, CMPL, {"prompt": PROMPT, "truncate_prompt_tokens": 100000})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"


def test_request_chat_template_and_continue_final_message(server: Server, client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %} Then{% endif %}"
    )
    msgs = [{"role": "user", "content": "Once upon"}, {"role": "assistant", "content": " a time"}]
    plain = _tokens(server, "Once upon a time")
    r = client.chat.completions.create(
        model=model,
        messages=msgs,
        max_tokens=2,
        extra_body={"chat_template": template, "add_generation_prompt": False},
    )
    assert r.usage.prompt_tokens == len(plain)
    with_prompt = client.chat.completions.create(
        model=model, messages=msgs, max_tokens=2, extra_body={"chat_template": template}
    )
    assert with_prompt.usage.prompt_tokens == len(_tokens(server, "Once upon a time Then"))
    # continue_final_message: the template's own output, and the answer continues the text
    cont = _post(
        server,
        CHAT,
        {
            "messages": msgs,
            "max_tokens": 5,
            "temperature": 0,
            "chat_template": template,
            "continue_final_message": True,
            "add_generation_prompt": False,
            "add_special_tokens": True,
        },
    ).json()
    ref = _post(server, CMPL, {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}).json()
    assert cont["choices"][0]["message"]["content"] == ref["choices"][0]["text"]
    both = _post(server, CHAT, {"messages": msgs, "continue_final_message": True})
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"
    bad = _post(server, CHAT, {"messages": msgs, "chat_template": "{% for %}"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"


def test_reserved_chat_template_kwargs_name_the_field(server: Server) -> None:
    """A template variable that the template call passes itself is refused up front, naming
    chat_template_kwargs (not messages) and no internals, on chat and on /tokenize."""
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    for kwargs, extra in (
        ({"tools": []}, {}),
        ({"messages": []}, {"chat_template": template}),
        ({"add_generation_prompt": False, "enable_thinking": False}, {}),
        ({"documents": [{"text": "x"}]}, {}),  # the documents field, by another door
    ):
        for path in (CHAT, "/tokenize"):
            r = _post(server, path, {"messages": MSGS, "chat_template_kwargs": kwargs} | extra)
            err = r.json()["error"]
            assert r.status_code == 400 and err["param"] == "chat_template_kwargs", r.text
            assert err["message"].startswith(f"chat_template_kwargs must not set {sorted(kwargs)[0]}")
            assert "jinja" not in err["message"] and "render()" not in err["message"]
    ok = _post(server, CHAT, {"messages": MSGS, "max_tokens": 2, "chat_template_kwargs": {"bos_token": ""}})
    assert ok.status_code == 200, ok.text


def test_reserved_template_kwargs_cover_the_template_call() -> None:
    """Every named parameter of transformers' apply_chat_template and render_jinja_template is
    reserved: a template variable of that name would set the parameter instead."""
    import inspect

    from transformers import PreTrainedTokenizerBase
    from transformers.utils import chat_template_utils

    for fn in (PreTrainedTokenizerBase.apply_chat_template, chat_template_utils.render_jinja_template):
        for p in inspect.signature(fn).parameters.values():
            if p.name != "self" and p.kind is not p.VAR_KEYWORD:
                assert p.name in RESERVED_TEMPLATE_KWARGS, (fn.__name__, p.name)
    assert {"messages", "tools", "documents", "add_generation_prompt"} <= RESERVED_TEMPLATE_KWARGS


def test_skip_special_tokens_and_spaces(server: Server) -> None:
    # greedy, the bundled model starts a new story with BOS ("<s>") within 480 tokens
    body = {"prompt": PROMPT, "max_tokens": 480, "temperature": 0}
    kept = _post(server, CMPL, body | {"skip_special_tokens": False}).json()["choices"][0]["text"]
    skipped = _post(server, CMPL, body).json()["choices"][0]["text"]
    assert "<s>" in kept and "<s>" not in skipped
    r = _post(server, CMPL, body | {"skip_special_tokens": False, "spaces_between_special_tokens": False})
    assert r.status_code == 200 and "<s>" in r.json()["choices"][0]["text"]


# --- errors name the right field ---------------------------------------------------------


def test_prompt_alone_too_long_names_the_prompt(server: Server) -> None:
    for ids in ([5] * 600, [5] * 512):  # over the context, and exactly the context (no room left)
        for extra in ({}, {"max_tokens": 5}):  # the prompt's fault either way
            r = _post(server, CMPL, {"prompt": ids} | extra)
            err = r.json()["error"]
            assert r.status_code == 400 and err["param"] == "prompt", r.text
            assert f"your prompt has {len(ids)} input tokens" in err["message"]
    msgs = [{"role": "user", "content": "the cat sat " * 300}]
    n = _post(server, "/tokenize", {"messages": msgs}).json()["count"]
    assert n > 512
    r = _post(server, CHAT, {"messages": msgs, "max_tokens": 5})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "messages"
    assert f"your messages have {n} input tokens" in err["message"]  # not "your messages has"


def test_only_a_sent_max_tokens_is_blamed(server: Server) -> None:
    r = _post(server, CMPL, {"prompt": [5] * 200, "max_tokens": 400})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "max_tokens" and "200 in the prompt" in err["message"]
    r = _post(server, CHAT, {"messages": MSGS, "max_completion_tokens": 600})  # blamed as sent
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens"
    assert r.json()["error"]["message"].endswith("prompt or max_completion_tokens."), r.text
    r = _post(server, CHAT, {"messages": MSGS, "max_tokens": 600})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = _post(server, CHAT, {"messages": MSGS, "max_completion_tokens": -3})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "max_completion_tokens"
    assert err["message"] == "max_completion_tokens must be at least 1, got -3"
    # the default max_tokens (16) is not the client's: it shrinks to the room left
    ok = _post(server, CMPL, {"prompt": [5] * 505, "ignore_eos": True})
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 7


# --- streaming usage ---------------------------------------------------------------------


@pytest.mark.parametrize("path", [CHAT, CMPL])
def test_usage_null_in_every_chunk_but_the_last(server: Server, path: str) -> None:
    body: dict[str, Any] = {"messages": MSGS} if path == CHAT else {"prompt": PROMPT}
    body |= {"max_tokens": 6, "ignore_eos": True, "n": 2}
    events = _events(server, path, body | {"stream_options": {"include_usage": True}})
    chunks = events[:-1]
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    # without include_usage no chunk has the key
    assert all("usage" not in c for c in _events(server, path, body)[:-1])


@pytest.mark.parametrize("path", [CHAT, CMPL])
def test_continuous_usage_counts_the_chunks_own_choice(server: Server, path: str) -> None:
    """``continuous_usage_stats`` with ``include_usage`` (vLLM): each choices chunk carries the
    usage of its own choice (its prompt's tokens, the tokens it generated so far); the final
    usage-only chunk still totals every choice (each prompt once). A chat choice's role chunk
    counts none generated, as vLLM's."""
    if path == CHAT:
        bodies: list[dict[str, Any]] = [{"messages": MSGS}]
    else:  # two prompts of different lengths: a chunk counts its own prompt
        bodies = [{"prompt": PROMPT}, {"prompt": PROMPT + " there was"}]
    prompt_tokens = [
        _post(server, path, b | {"max_tokens": 1}).json()["usage"]["prompt_tokens"] for b in bodies
    ]
    body: dict[str, Any] = bodies[0] if path == CHAT else {"prompt": [b["prompt"] for b in bodies]}
    body |= {"max_tokens": 6, "ignore_eos": True, "n": 2}
    opts = {"include_usage": True, "continuous_usage_stats": True}
    *chunks, final, done = _events(server, path, body | {"stream_options": opts})
    assert done == "[DONE]" and final["choices"] == []
    choices = 2 * len(bodies)
    assert final["usage"] == {
        "prompt_tokens": sum(prompt_tokens),
        "completion_tokens": 6 * choices,
        "total_tokens": sum(prompt_tokens) + 6 * choices,
    }
    counts: dict[int, list[int]] = {}
    for c in chunks:
        [choice] = c["choices"]
        usage, p = c["usage"], prompt_tokens[choice["index"] // 2]
        assert usage["prompt_tokens"] == p and usage["total_tokens"] == p + usage["completion_tokens"]
        counts.setdefault(choice["index"], []).append(usage["completion_tokens"])
    assert sorted(counts) == list(range(choices))
    for seen in counts.values():
        if path == CHAT:
            assert seen[0] == 0, counts  # the role chunk
            seen = seen[1:]
        assert seen == sorted(seen) and seen[0] >= 1 and seen[-1] == 6, counts


@pytest.mark.parametrize("path", [CHAT, CMPL])
def test_continuous_usage_needs_include_usage_and_stream(server: Server, path: str) -> None:
    """``continuous_usage_stats`` without ``include_usage`` would do nothing (vLLM ignores it): a
    400 naming it (it worked alone before); without ``stream: true`` it is a 400 naming
    ``stream_options``, as every stream option is."""
    body: dict[str, Any] = {"messages": MSGS} if path == CHAT else {"prompt": PROMPT}
    body |= {"max_tokens": 4, "ignore_eos": True, "stream": True}
    for opts in ({"continuous_usage_stats": True}, {"include_usage": False, "continuous_usage_stats": True}):
        r = _post(server, path, body | {"stream_options": opts})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "stream_options.continuous_usage_stats"
    body.pop("stream")
    r = _post(
        server, path, body | {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options", r.text


@pytest.mark.parametrize("path", [CHAT, CMPL])
@pytest.mark.parametrize("opts", [{"include_obfuscation": {}}, {"include_usage": "yes"}])
def test_a_stream_option_of_the_wrong_type_is_named(server: Server, path: str, opts: dict[str, Any]) -> None:
    """``stream_options.include_obfuscation: {}`` was a 400 naming only ``stream_options``: the
    param is the option itself, and the message says what it takes."""
    body: dict[str, Any] = {"messages": MSGS} if path == CHAT else {"prompt": PROMPT}
    r = _post(server, path, body | {"max_tokens": 2, "stream": True, "stream_options": opts})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    key = f"stream_options.{next(iter(opts))}"
    assert error["param"] == key and error["message"].startswith(f"{key}: "), error
    assert "boolean" in error["message"], error


def test_usage_null_via_sdk(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    chunks = list(
        client.completions.create(
            model=model, prompt=PROMPT, max_tokens=4, stream=True, stream_options={"include_usage": True}
        )
    )
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].usage.completion_tokens >= 1


# --- request ids -------------------------------------------------------------------------


def test_x_request_id(server: Server, client: openai.OpenAI) -> None:
    rid = "trace-abc-123"
    r = _post(server, CMPL, {"prompt": PROMPT, "max_tokens": 3, "n": 2}, headers={"X-Request-Id": rid})
    assert r.headers["x-request-id"] == rid and r.json()["id"] == f"cmpl-{rid}"
    r = _post(
        server, CHAT, {"messages": MSGS, "max_tokens": 3, "stream": True}, headers={"X-Request-Id": rid}
    )
    assert r.headers["x-request-id"] == rid
    first = json.loads(r.text.split("\n\n")[0].removeprefix("data: "))
    assert first["id"] == f"chatcmpl-{rid}"
    assert f"request chatcmpl-{rid}" in server.log() and f"request cmpl-{rid}" in server.log()
    # errors echo it too, and a request without one gets a fresh id
    bad = _post(server, CMPL, {"prompt": PROMPT, "bogus": 1}, headers={"X-Request-Id": rid})
    assert bad.status_code == 400 and bad.headers["x-request-id"] == rid
    fresh = _post(server, CMPL, {"prompt": PROMPT, "max_tokens": 2})
    assert fresh.headers["x-request-id"] and fresh.json()["id"] == f"cmpl-{fresh.headers['x-request-id']}"
    # the SDK's raw response
    raw = client.completions.with_raw_response.create(
        model=client.models.list().data[0].id,
        prompt=PROMPT,
        max_tokens=2,
        extra_headers={"X-Request-Id": "sdk-1"},
    )
    assert raw.headers["x-request-id"] == "sdk-1" and raw.parse().id == "cmpl-sdk-1"


def test_refused_requests_log_the_id_of_their_response(server: Server) -> None:
    """A refused request's log line names the id its X-Request-Id response header carries:
    the generated one when the client sent none (or one that cannot be echoed), at every
    layer that refuses (validation, handler checks, the guard before parsing)."""
    cases: list[tuple[str, Any, dict[str, str]]] = [
        (CMPL, {"prompt": PROMPT, "bogus": 1}, {}),  # pydantic
        (CMPL, {"prompt": PROMPT, "best_of": 3}, {}),  # a refused field (handler)
        (CHAT, {"messages": MSGS, "chat_template_kwargs": {"tools": []}}, {}),
        (CMPL, {"prompt": PROMPT, "bogus": 2}, {"X-Request-Id": "x" * 300}),  # too long: replaced
    ]
    for path, body, headers in cases:
        r = _post(server, path, body, headers=headers)
        rid = r.headers["x-request-id"]
        assert r.status_code == 400 and rid and rid != headers.get("X-Request-Id"), r.text
        assert f"POST {path} -> 400 (request id {rid})" in server.log()
    r = httpx.post(
        server.url + CMPL,
        content=b'{"prompt": "\\ud800"}',  # a lone surrogate: refused by the guard, before parsing
        headers={"content-type": "application/json"},
    )
    rid = r.headers["x-request-id"]
    assert r.status_code == 400 and f"POST {CMPL} -> 400 (request id {rid})" in server.log()
    assert "(request id -)" not in server.log()


def test_same_request_id_concurrently(server: Server) -> None:
    import concurrent.futures

    body = {"prompt": PROMPT, "max_tokens": 30, "ignore_eos": True, "temperature": 0}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(_post, server, CMPL, body, headers={"X-Request-Id": "dup"}) for _ in range(4)]
        results = [f.result() for f in futs]
    assert all(r.status_code == 200 for r in results)
    assert all(r.json()["usage"]["completion_tokens"] == 30 for r in results)
    assert len({r.json()["choices"][0]["text"] for r in results}) == 1


def test_body_request_id(server: Server) -> None:
    r = _post(server, CMPL, {"prompt": PROMPT, "max_tokens": 2, "request_id": "body-7"})
    assert r.json()["id"] == "cmpl-body-7" and r.headers["x-request-id"] == "body-7"
    r = _post(
        server,
        CMPL,
        {"prompt": PROMPT, "max_tokens": 2, "request_id": "body-7"},
        headers={"X-Request-Id": "hdr"},
    )
    assert r.json()["id"] == "cmpl-hdr" and r.headers["x-request-id"] == "hdr"
    # a body id that could not be echoed as a header is a 400, not replaced by a fresh one
    for bad in ("", "h\u00e9llo", "a\nb", "x" * 257, " abc", "abc "):
        for path, body in ((CMPL, {"prompt": PROMPT}), (CHAT, {"messages": MSGS})):
            r = _post(server, path, body | {"max_tokens": 2, "request_id": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "request_id", r.text


def test_choices_per_request_are_bounded(server: Server) -> None:
    """Prompts times n over --max-choices-per-request (1024) is refused before tokenizing."""
    r = _post(server, CMPL, {"prompt": ["Once upon a time"] * 9, "n": 128, "max_tokens": 1})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "prompt"
    assert "1152 choices (9 prompts x n=128); at most 1024" in err["message"]
    ok = _post(server, CMPL, {"prompt": ["Once upon a time"] * 2, "n": 3, "max_tokens": 1})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 6


def test_chat_add_special_tokens_false_without_a_template(server: Server) -> None:
    """The bundled model has no chat template: the fallback rendering adds BOS by default, and
    ``add_special_tokens: false`` drops it (it was added either way), on chat and /tokenize."""
    default = _post(server, "/tokenize", {"messages": MSGS}).json()["tokens"]
    plain = _post(server, "/tokenize", {"messages": MSGS, "add_special_tokens": False}).json()["tokens"]
    assert default[0] == 1 and plain == default[1:]
    usage = [
        _post(server, CHAT, {"messages": MSGS, "max_tokens": 1} | extra).json()["usage"]["prompt_tokens"]
        for extra in ({}, {"add_special_tokens": False}, {"add_special_tokens": True})
    ]
    assert usage == [len(default), len(default) - 1, len(default)]


def test_a_client_id_equal_to_another_requests_child_id(server: Server) -> None:
    """``X-Request-Id: abc-0`` while an ``n = 2`` request ``abc`` streams: its children were
    ``abc-0`` and ``abc-1`` in the engine, so the second request took over (or, with a grammar,
    crashed) the first one's choice 0. Engine ids now carry a per-process serial: both finish."""
    first = {
        "prompt": PROMPT,
        "max_tokens": 48,
        "ignore_eos": True,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST", server.url + CMPL, json=first, headers={"X-Request-Id": "abc"}, timeout=120
    ) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))  # abc is in flight
        for extra in ({}, {"structured_outputs": {"regex": "(yes|no)"}}):
            second = _post(
                server, CMPL, {"prompt": PROMPT, "max_tokens": 4} | extra, headers={"X-Request-Id": "abc-0"}
            )
            assert second.status_code == 200 and second.json()["id"] == "cmpl-abc-0", second.text
        finishes: dict[int, str] = {}
        usage = None
        for line in lines:
            if line.startswith("data:") and line != "data: [DONE]":
                event = json.loads(line[5:])
                usage = event.get("usage") or usage
                for choice in event["choices"]:
                    if choice.get("finish_reason"):
                        finishes[choice["index"]] = choice["finish_reason"]
    assert finishes == {0: "length", 1: "length"} and usage["completion_tokens"] == 96, (finishes, usage)
    assert httpx.get(server.url + "/health").status_code == 200
    done = _post(server, CMPL, {"prompt": PROMPT, "max_tokens": 3, "n": 2}, headers={"X-Request-Id": "abc"})
    assert done.status_code == 200 and [c["index"] for c in done.json()["choices"]] == [0, 1]
