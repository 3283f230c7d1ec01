"""Issue 9: logit_bias (OpenAI), allowed_token_ids and bad_words (vLLM) over HTTP on the bundled
model, through the openai SDK where it has the field: chat and completions, streamed and not,
n > 1, with a grammar and with logprobs (which stay raw); and the 400s naming the field."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from surge.tokenizer import load_tokenizer
from tests.server.conftest import STORIES, Server

PROMPT = "Once upon a time"
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _ids(srv: Server, text: str) -> list[int]:
    r = httpx.post(srv.url + "/tokenize", json={"prompt": text, "add_special_tokens": False})
    return r.json()["tokens"]


def _vocab() -> list[str]:
    """Every token's text without its leading-space mark, by id."""
    tok = load_tokenizer(str(STORIES))
    return [t.replace("\u2581", " ") for t in tok.convert_ids_to_tokens(list(range(len(tok))))]


def _post(srv: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=120)


def test_logit_bias_chat_and_completions(client: openai.OpenAI, server: Server, model: str) -> None:
    x = _ids(server, "x")[-1]
    r = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=5,
        temperature=0,
        logit_bias={str(x): 100},
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].text.replace(" ", "") == "xxxxx"
    sampled = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=6, temperature=1.0, seed=2, n=3, logit_bias={str(x): 100}
    )
    assert [c.text.replace(" ", "") for c in sampled.choices] == ["xxxxxx"] * 3
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=MSGS,  # type: ignore[arg-type]
            max_tokens=4,
            temperature=0,
            logit_bias={str(x): 100},
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).replace(" ", "") == "xxxx"
    chat = client.chat.completions.create(
        model=model,
        messages=MSGS,
        max_tokens=4,
        temperature=0,
        logit_bias={str(x): 100},  # type: ignore[arg-type]
    )
    assert (chat.choices[0].message.content or "").replace(" ", "") == "xxxx"
    # -100 on every token of the greedy continuation's first word changes it
    base = client.completions.create(model=model, prompt=PROMPT, max_tokens=3, temperature=0)
    first = _ids(server, base.choices[0].text)[:2]
    banned = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=3, temperature=0, logit_bias={str(t): -100 for t in first}
    )
    assert banned.choices[0].text != base.choices[0].text


def test_logprobs_stay_raw_under_logit_bias(client: openai.OpenAI, server: Server, model: str) -> None:
    """The sampled token is the biased one, but its logprob and the top_logprobs are those of
    the raw logits (vLLM's default), the same as without the bias."""
    x = _ids(server, "x")[-1]
    kw: dict[str, Any] = {"model": model, "messages": MSGS, "max_tokens": 1, "temperature": 0}
    plain = client.chat.completions.create(**kw, logprobs=True, top_logprobs=5)
    biased = client.chat.completions.create(**kw, logprobs=True, top_logprobs=5, logit_bias={str(x): 100})
    assert plain.choices[0].logprobs and biased.choices[0].logprobs
    p, b = plain.choices[0].logprobs.content[0], biased.choices[0].logprobs.content[0]  # type: ignore[index]
    assert b.token == "x" and b.logprob < -1.0  # raw: x is unlikely, not ~0 after the bias
    assert [(t.token, round(t.logprob, 4)) for t in b.top_logprobs] == [
        (t.token, round(t.logprob, 4)) for t in p.top_logprobs
    ]


def test_allowed_token_ids(client: openai.OpenAI, server: Server, model: str) -> None:
    allowed = _ids(server, "ab")
    r = _post(
        server,
        "/v1/completions",
        {
            "prompt": PROMPT,
            "max_tokens": 8,
            "temperature": 1.0,
            "seed": 3,
            "n": 3,
            "allowed_token_ids": allowed,
            "ignore_eos": True,
            "logprobs": 0,
        },
    ).json()
    assert len(r["choices"]) == 3
    for c in r["choices"]:
        assert len(c["logprobs"]["tokens"]) == 8
        assert set(c["logprobs"]["tokens"]) <= {"a", " a", "b"}, c["logprobs"]["tokens"]
    chat = client.chat.completions.create(
        model=model,
        messages=MSGS,  # type: ignore[arg-type]
        max_tokens=6,
        temperature=1.0,
        seed=5,
        stream=True,
        extra_body={"allowed_token_ids": allowed, "ignore_eos": True},
    )
    text = "".join(c.choices[0].delta.content or "" for c in chat if c.choices)
    assert text and set(text.replace(" ", "")) <= set("ab"), text


def test_bad_words(client: openai.OpenAI, server: Server, model: str) -> None:
    base = _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 30, "temperature": 0}).json()
    text = base["choices"][0]["text"]
    assert "Lily" in text and "girl" in text
    bad = _post(
        server,
        "/v1/completions",
        {"prompt": PROMPT, "max_tokens": 30, "temperature": 0, "bad_words": ["Lily", "girl"]},
    ).json()["choices"][0]["text"]
    assert "Lily" not in bad and "girl" not in bad
    # "girl" is three tokens: only its last one is banned after the other two ("giraffe")
    assert bad.startswith(text[: text.index("girl") + 3])
    streamed = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=30,
        temperature=0,
        stream=True,
        extra_body={"bad_words": ["Lily", "girl"]},
    )
    assert "".join(c.choices[0].text for c in streamed) == bad
    chat_base = client.chat.completions.create(model=model, messages=MSGS, max_tokens=40, temperature=0)  # type: ignore[arg-type]
    words = [w.strip(".,!") for w in (chat_base.choices[0].message.content or "").split() if len(w) > 3]
    assert words
    chat_bad = client.chat.completions.create(
        model=model,
        messages=MSGS,  # type: ignore[arg-type]
        max_tokens=40,
        temperature=0,
        extra_body={"bad_words": words[:1]},
    )
    assert words[0] not in (chat_bad.choices[0].message.content or "").split()


def test_rules_with_a_grammar(server: Server) -> None:
    """A structured-output choice and logit_bias compose: -100 on every token that starts a
    word with "c" makes the grammar take the other choice, and the other way round."""
    vocab = _vocab()

    def starting(letter: str) -> dict[str, float]:
        return {str(t): -100.0 for t, s in enumerate(vocab) if s.lstrip().startswith(letter)}

    outs = {}
    for letter in ("c", "d"):
        r = _post(
            server,
            "/v1/completions",
            {
                "prompt": "My pet is a",
                "max_tokens": 5,
                "temperature": 0,
                "structured_outputs": {"choice": ["cat", "dog"]},
                "logit_bias": starting(letter),
            },
        )
        assert r.status_code == 200, r.text
        outs[letter] = r.json()["choices"][0]["text"]
    assert outs == {"c": "dog", "d": "cat"}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("logit_bias", {"abc": 1}),
        ("logit_bias", {"99999": 1}),
        ("logit_bias", {"-1": 1}),
        ("logit_bias", {" 5": 1}),
        ("logit_bias", {"+5": 1}),
        ("logit_bias", {"1_0": 1}),
        ("logit_bias", {"\u0661\u0660": 1}),
        ("logit_bias", {"10": -100, "010": 100}),
        ("logit_bias", {"5": 500}),
        ("logit_bias", {"5": -100.5}),
        ("allowed_token_ids", [99999]),
        ("allowed_token_ids", []),
        ("allowed_token_ids", [-1]),
        ("stop_token_ids", [99999]),  # never sampled, so it would never stop anything
        ("stop_token_ids", [2, 99999]),
        ("bad_words", [""]),
        ("bad_words", ["  "]),
        ("bad_words", "girl"),
        ("bad_words", ["w"] * 257),
        ("bad_words", ["ok", "x" * 1025]),
    ],
)
def test_bad_token_rules_name_the_field(server: Server, path: str, field: str, value: Any) -> None:
    body: dict[str, Any] = {field: value, "max_tokens": 2}
    body |= {"prompt": PROMPT} if path == "/v1/completions" else {"messages": MSGS}
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and err["type"] == "invalid_request_error", err
    assert "Traceback" not in r.text
