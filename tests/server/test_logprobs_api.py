"""Logprobs through the HTTP API: the openai SDK for chat ``logprobs``/``top_logprobs`` and
completions ``logprobs``/``echo``/``max_tokens: 0``, raw HTTP for vLLM's ``prompt_logprobs``;
streamed rows equal the non-streamed ones, under ``--stream-interval`` coalescing and
stop-string hold-back; bad values are a 400 naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from surge.token_strings import TokenStrings
from tests.conftest import STORIES
from tests.server.conftest import Server, start_server

PROMPT = "Once upon a time"
MSGS = [{"role": "user", "content": "Tell me a story"}]
GREEDY = {"temperature": 0}
EXACT = {"ignore_eos": True}


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def coalescing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server that sends one event per 3 tokens."""
    srv = start_server(tmp_path_factory.mktemp("serve_lp"), "--stream-interval", "3")
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def _sdk(srv: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _chat_rows(content: list[Any]) -> list[tuple[str, float, list[int], list[tuple[str, float]]]]:
    return [(c.token, c.logprob, c.bytes, [(t.token, t.logprob) for t in c.top_logprobs]) for c in content]


def _same_rows(a: list[Any], b: list[Any]) -> None:
    assert [r[0] for r in a] == [r[0] for r in b]
    for x, y in zip(a, b, strict=True):
        assert x[1] == pytest.approx(y[1], abs=1e-5)
        assert [t for t, _ in x[3]] == [t for t, _ in y[3]]


def test_chat_logprobs_and_top_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=MSGS,
        max_tokens=12,
        logprobs=True,
        top_logprobs=3,
        extra_body=EXACT,
        **GREEDY,
    )
    choice = r.choices[0]
    content = choice.logprobs.content
    assert len(content) == r.usage.completion_tokens == 12
    assert "".join(c.token for c in content) == choice.message.content
    for c in content:
        assert c.logprob <= 0 and c.bytes == list(c.token.encode())
        assert len(c.top_logprobs) == 3
        tops = [t.logprob for t in c.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert c.top_logprobs[0].token == c.token  # greedy: the sampled token is the most likely
        assert c.top_logprobs[0].logprob == pytest.approx(c.logprob)
    zero = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=MSGS,
        max_tokens=4,
        logprobs=True,
        extra_body=EXACT,
        **GREEDY,
    )
    assert all(c.top_logprobs == [] for c in zero.choices[0].logprobs.content)
    assert [c.token for c in zero.choices[0].logprobs.content] == [c.token for c in content[:4]]
    none = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=MSGS, max_tokens=4, **GREEDY
    )
    assert none.choices[0].logprobs is None


def test_chat_stream_equals_non_stream_and_n(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = dict(
        model=client.models.list().data[0].id,
        messages=MSGS,
        max_tokens=16,
        logprobs=True,
        top_logprobs=2,
        seed=5,
        n=2,
        extra_body=EXACT,
    )
    full = client.chat.completions.create(**kw)
    rows: dict[int, list[Any]] = {0: [], 1: []}
    roles: list[int] = []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            if c.delta.role is not None:  # each choice's role chunk (vLLM: logprobs null)
                assert c.logprobs is None and c.delta.content == "" and not rows[c.index]
                roles.append(c.index)
                continue
            assert c.logprobs is not None
            rows[c.index] += _chat_rows(c.logprobs.content)
    assert sorted(roles) == [0, 1]
    for choice in full.choices:
        assert len(choice.logprobs.content) == 16
        _same_rows(rows[choice.index], _chat_rows(choice.logprobs.content))


def test_completion_logprobs_echo_and_scoring(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=client.models.list().data[0].id,
        prompt=PROMPT,
        max_tokens=8,
        logprobs=2,
        extra_body=EXACT,
        **GREEDY,
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(8)]
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) == 2 and top[token] == pytest.approx(value)
        assert max(top.values()) == pytest.approx(value)  # greedy
    # logprobs=0 still gives the sampled token's logprob (top_logprobs holds just it).
    z = client.completions.create(
        model=client.models.list().data[0].id,
        prompt=PROMPT,
        max_tokens=8,
        logprobs=0,
        extra_body=EXACT,
        **GREEDY,
    )
    zl = z.choices[0].logprobs
    assert zl.tokens == lp.tokens and all(len(t) == 1 for t in zl.top_logprobs)
    assert zl.token_logprobs == pytest.approx(lp.token_logprobs, abs=1e-5)

    echo = client.completions.create(
        model=client.models.list().data[0].id,
        prompt=PROMPT,
        max_tokens=8,
        logprobs=2,
        echo=True,
        extra_body=EXACT,
        **GREEDY,
    )
    el = echo.choices[0].logprobs
    n_prompt = echo.usage.prompt_tokens
    assert echo.choices[0].text == PROMPT + r.choices[0].text
    assert len(el.tokens) == n_prompt + 8
    assert el.token_logprobs[0] is None and el.top_logprobs[0] is None
    assert all(isinstance(v, float) for v in el.token_logprobs[1:])
    assert el.tokens[n_prompt:] == lp.tokens
    assert el.token_logprobs[n_prompt:] == pytest.approx(lp.token_logprobs, abs=1e-5)

    # max_tokens 0 with echo scores the prompt without generating (evaluation harnesses).
    score = client.completions.create(
        model=client.models.list().data[0].id, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1
    )
    sl = score.choices[0].logprobs
    assert score.choices[0].text == PROMPT and score.usage.completion_tokens == 0
    assert score.choices[0].finish_reason == "length"
    assert sl.tokens == el.tokens[:n_prompt]
    assert sl.token_logprobs[0] is None
    assert sl.token_logprobs[1:] == pytest.approx(el.token_logprobs[1:n_prompt], abs=1e-5)
    # Token-id prompts and several prompts score each.
    ids = httpx.post(client.base_url.join("/tokenize").__str__(), json={"prompt": PROMPT}).json()["tokens"]
    multi = client.completions.create(
        model=client.models.list().data[0].id, prompt=[ids, ids[:3]], max_tokens=0, echo=True, logprobs=0
    )
    assert [len(c.logprobs.tokens) for c in multi.choices] == [len(ids), 3]
    assert multi.choices[0].logprobs.token_logprobs[1:] == pytest.approx(sl.token_logprobs[1:], abs=1e-5)


def test_scoring_a_prompt_of_the_whole_context(server: Server, client: openai.OpenAI) -> None:
    """vLLM's rule: prompt + max_tokens <= max_model_len, so echo with max_tokens 0 scores a
    prompt of exactly max_model_len tokens (streamed or not, with its prompt logprobs); one
    token more is a 400 naming both lengths."""
    limit = httpx.post(server.url + "/tokenize", json={"prompt": "x"}).json()["max_model_len"]
    ids = [3 + (7 * i) % 250 for i in range(limit)]
    body: dict[str, Any] = {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0, "prompt_logprobs": 0}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    data = r.json()
    choice = data["choices"][0]
    assert choice["finish_reason"] == "length"
    assert (data["usage"]["prompt_tokens"], data["usage"]["completion_tokens"]) == (limit, 0)
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == limit and lp["token_logprobs"][0] is None
    assert all(isinstance(v, float) and v <= 0 for v in lp["token_logprobs"][1:])
    plp = choice["prompt_logprobs"]
    assert len(plp) == limit and plp[0] is None
    assert [plp[j][str(ids[j])]["logprob"] for j in range(1, limit)] == pytest.approx(
        lp["token_logprobs"][1:], abs=1e-5
    )
    stream = client.completions.create(
        model=data["model"], prompt=ids, max_tokens=0, echo=True, logprobs=0, stream=True
    )
    chunks = [c.choices[0] for c in stream if c.choices]
    assert [c.finish_reason for c in chunks][-1] == "length"
    streamed = [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs]
    assert len(streamed) == limit and streamed[1:] == pytest.approx(lp["token_logprobs"][1:], abs=1e-5)
    for extra in ({}, {"max_tokens": 1}):  # over the context, and no room for a token
        over = body | {"prompt": ids + [5]} if not extra else body | extra | {"echo": False}
        r = httpx.post(server.url + "/v1/completions", json=over, timeout=120)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "prompt", r.text
        n = len(over["prompt"])
        assert f"maximum context length is {limit} tokens" in err["message"]
        assert f"{n} input tokens" in err["message"]


def test_echo_text_offset_counts_the_tokens_texts(server: Server) -> None:
    """docs/openai-api.md's example: text_offset sums the lengths of the tokens as shown
    (decoded alone), as vLLM does; with echo the BOS and SentencePiece's leading space count,
    so the offsets are not positions in the returned text."""
    body = {"prompt": PROMPT, "echo": True, "logprobs": 0, "max_tokens": 0}
    choice = httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == PROMPT
    assert lp["tokens"] == ["<s>", " Once", " upon", " a", " time"]
    assert lp["text_offset"] == [0, 3, 8, 13, 15]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    # max_tokens 0 with min_tokens: the message names the 0 sent, not the 1 sampled internally
    r = httpx.post(server.url + "/v1/completions", json=body | {"min_tokens": 3}, timeout=120)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "min_tokens" and "max_tokens (0" in err["message"], r.text


@pytest.mark.parametrize("stream", [False, True])
def test_echo_of_a_token_id_prompt_keeps_its_special_tokens(server: Server, stream: bool) -> None:
    """A prompt of token ids is echoed as vLLM 0.26 decodes it (``tokenizer.decode(ids)``,
    special tokens kept: the BOS ``<s>``, as /detokenize gives it); a text prompt is echoed as
    given, without the BOS its tokens start with."""
    ids = httpx.post(server.url + "/tokenize", json={"prompt": PROMPT}, timeout=60).json()["tokens"]
    decoded = httpx.post(server.url + "/detokenize", json={"tokens": ids}, timeout=60).json()["prompt"]
    assert decoded.startswith("<s>")

    def text(prompt: Any) -> str:
        body = {"prompt": prompt, "echo": True, "max_tokens": 3, "stream": stream, **GREEDY}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        if not stream:
            return r.json()["choices"][0]["text"]
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        return "".join(c["text"] for e in events[:-1] for c in json.loads(e)["choices"])

    by_text = text(PROMPT)
    assert by_text.startswith(PROMPT + ",")
    assert text(ids) == decoded + by_text[len(PROMPT) :]
    assert text([ids, ids[1:]])[: len(decoded)] == decoded  # a list of token-id prompts too


def test_completion_stream_echo_logprobs_equal_non_stream(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = dict(
        model=client.models.list().data[0].id,
        prompt=PROMPT,
        max_tokens=10,
        logprobs=3,
        echo=True,
        extra_body=EXACT,
        **GREEDY,
    )
    full = client.completions.create(**kw).choices[0].logprobs
    joined: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in client.completions.create(**kw, stream=True):
        for c in chunk.choices:
            for key in joined:
                joined[key] += getattr(c.logprobs, key)
    assert joined["tokens"] == full.tokens and joined["text_offset"] == full.text_offset
    assert joined["token_logprobs"][0] is None
    assert joined["token_logprobs"][1:] == pytest.approx(full.token_logprobs[1:], abs=1e-5)
    assert [sorted(t) if t else t for t in joined["top_logprobs"]] == [
        sorted(t) if t else t for t in full.top_logprobs
    ]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_prompt_logprobs_raw_http(server: Server, path: str) -> None:
    body: dict[str, Any] = {"max_tokens": 2, "prompt_logprobs": 2, **GREEDY}
    body |= {"prompt": PROMPT} if "chat" not in path else {"messages": MSGS}
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()
    plp = data["prompt_logprobs"] if "chat" in path else data["choices"][0]["prompt_logprobs"]
    assert len(plp) == data["usage"]["prompt_tokens"] and plp[0] is None
    for entry in plp[1:]:
        ranks = sorted(v["rank"] for v in entry.values())
        assert {1, 2} <= set(ranks) and len(entry) in (2, 3)
        for key, v in entry.items():
            assert int(key) >= 0 and v["logprob"] <= 0 and isinstance(v["decoded_token"], str)
    if "chat" not in path:  # the same values as echo's prompt rows
        echo = httpx.post(
            server.url + path,
            json={"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 0},
            timeout=60,
        ).json()["choices"][0]["logprobs"]["token_logprobs"]
        ids = httpx.post(server.url + "/tokenize", json={"prompt": PROMPT}).json()["tokens"]
        mine = [plp[j][str(ids[j])]["logprob"] for j in range(1, len(ids))]
        assert mine == pytest.approx(echo[1:], abs=1e-5)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streamed_prompt_logprobs_0_is_taken_and_returns_nothing(server: Server, path: str) -> None:
    """vLLM 0.26 refuses a stream's ``prompt_logprobs`` above 0 only: 0 streams as usual, with no
    ``prompt_logprobs`` in any chunk (it was a 400)."""
    body: dict[str, Any] = {"max_tokens": 3, "prompt_logprobs": 0, "stream": True, **GREEDY, **EXACT}
    body |= {"prompt": PROMPT} if "chat" not in path else {"messages": MSGS}
    with httpx.stream("POST", server.url + path, json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("prompt_logprobs" not in c and "prompt_logprobs" not in c["choices"][0] for c in chunks)
    r2 = httpx.post(server.url + path, json=body | {"prompt_logprobs": 1}, timeout=60)
    assert r2.status_code == 400 and r2.json()["error"]["param"] == "prompt_logprobs", r2.text


def _stream_rows(srv: Server, body: dict[str, Any]) -> list[tuple[str, list[str], str | None]]:
    """Each SSE chunk's (text, row tokens, finish_reason) of a chat stream, after the role chunk."""
    out = []
    with httpx.stream(
        "POST", srv.url + "/v1/chat/completions", json=body | {"stream": True}, timeout=60
    ) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for c in json.loads(line[6:])["choices"]:
                if c["delta"].get("role"):  # the role chunk, as vLLM: no text, logprobs null
                    assert c["delta"] == {"role": "assistant", "content": ""} and c["logprobs"] is None
                    continue
                rows = [e["token"] for e in c["logprobs"]["content"]]
                out.append((c["delta"].get("content", ""), rows, c["finish_reason"]))
    return out


@pytest.mark.parametrize("stop", [None, "little girl", "toys."])
def test_rows_follow_the_text_under_coalescing_and_stop_strings(coalescing: Server, stop: str | None) -> None:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 30,
        "logprobs": True,
        "top_logprobs": 1,
        "stop": stop,
        **GREEDY,
        **EXACT,
    }
    chunks = _stream_rows(coalescing, body)
    full = httpx.post(coalescing.url + "/v1/chat/completions", json=body, timeout=60).json()
    rows = [e["token"] for e in full["choices"][0]["logprobs"]["content"]]
    assert [t for _, r, _ in chunks for t in r] == rows
    assert len(rows) == full["usage"]["completion_tokens"]
    assert "".join(t for t, _, _ in chunks) == full["choices"][0]["message"]["content"]
    # Every chunk but the last carries exactly the rows of the tokens whose text is complete
    # in the text sent so far: what is left over is the start of the next token's text.
    assert [f for _, _, f in chunks][-1] is not None
    text_so_far, num_rows = "", 0
    for text, r, _ in chunks[:-1]:
        text_so_far += text
        num_rows += len(r)
        covered = "".join(rows[:num_rows])
        assert text_so_far.startswith(covered)
        assert rows[num_rows].startswith(text_so_far[len(covered) :])
    if stop is not None:
        assert full["choices"][0]["finish_reason"] == "stop"
        assert stop not in full["choices"][0]["message"]["content"]
        assert stop.split()[0] in "".join(chunks[-1][1])  # the stop string's tokens come last
    assert len(chunks) < len(rows)  # events were coalesced


def _completion_chunks(
    srv: Server, body: dict[str, Any]
) -> list[tuple[str, list[str], list[int], str | None]]:
    """Each SSE chunk's (text, logprobs tokens, text_offset, finish_reason) of a completion stream."""
    out = []
    with httpx.stream("POST", srv.url + "/v1/completions", json=body | {"stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                [c] = json.loads(line[6:])["choices"]
                lp = c["logprobs"]
                out.append((c["text"], lp["tokens"], lp["text_offset"], c["finish_reason"]))
    return out


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("stop", ["a li", "e l", "Lily. She"])
@pytest.mark.parametrize("coalesce", [False, True])
def test_completion_rows_follow_the_text_when_a_stop_string_spans_tokens(
    server: Server, coalescing: Server, stop: str, include: bool, coalesce: bool
) -> None:
    """A stop string that spans tokens and starts or ends inside one (``" a"`` + ``" little"``
    for ``"a li"``): the streamed entries are the non-streamed ones (one per generated token, the
    stop string's tokens included, as vLLM counts them), no chunk carries the entry of a token
    whose text was not sent yet (the held-back ``" a"`` of ``"a li"``), and the tokens whose text
    the stop string cut come with the final chunk."""
    srv = coalescing if coalesce else server
    body: dict[str, Any] = {
        "prompt": PROMPT,
        "max_tokens": 40,
        "logprobs": 1,
        "stop": [stop],
        **GREEDY,
        **EXACT,
    }
    body["include_stop_str_in_output"] = include
    full = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()
    [choice] = full["choices"]
    text, tokens = choice["text"], choice["logprobs"]["tokens"]
    assert choice["finish_reason"] == "stop" and len(tokens) == full["usage"]["completion_tokens"]
    assert text.endswith(stop) if include else stop not in text
    assert "".join(tokens).startswith(text) and stop in "".join(tokens)
    chunks = _completion_chunks(srv, body)
    assert "".join(t for t, _, _, _ in chunks) == text
    assert [tok for _, r, _, _ in chunks for tok in r] == tokens
    assert [o for _, _, offs, _ in chunks for o in offs] == choice["logprobs"]["text_offset"]
    assert [f for _, _, _, f in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    sent, num_rows = "", 0
    for chunk_text, rows, _, _ in chunks[:-1]:
        sent += chunk_text
        num_rows += len(rows)
        assert sent.startswith("".join(tokens[:num_rows])), (sent, tokens[:num_rows])
    assert stop.split()[-1] in "".join(chunks[-1][1])  # the stop string's last token comes last


BAD = [
    ("/v1/chat/completions", {"messages": MSGS, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MSGS, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MSGS, "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MSGS, "logprobs": 3}, "logprobs"),
    ("/v1/chat/completions", {"messages": MSGS, "prompt_logprobs": 21}, "prompt_logprobs"),
    ("/v1/chat/completions", {"messages": MSGS, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": -1}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": "many"}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "prompt_logprobs": -2}, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"messages": MSGS, "logprob_token_ids": [5]}, "logprob_token_ids"),
    (
        "/v1/chat/completions",
        {"messages": MSGS, "logprobs": True, "logprob_token_ids": [10**6]},
        "logprob_token_ids",
    ),
    (
        "/v1/chat/completions",
        {"messages": MSGS, "logprobs": True, "logprob_token_ids": [-1]},
        "logprob_token_ids",
    ),
    (
        "/v1/chat/completions",
        {"messages": MSGS, "logprobs": True, "logprob_token_ids": "5"},
        "logprob_token_ids",
    ),
    ("/v1/completions", {"prompt": "x", "logprob_token_ids": [5]}, "logprob_token_ids"),
    (
        "/v1/completions",
        {"prompt": "x", "logprobs": 1, "logprob_token_ids": list(range(129))},
        "logprob_token_ids",
    ),
    (
        "/v1/completions",
        {"prompt": "x", "logprobs": 1, "logprob_token_ids": [5], "echo": True, "max_tokens": 0},
        "logprob_token_ids",
    ),
]


def test_logprob_token_ids_list_the_asked_tokens(server: Server) -> None:
    """vLLM's logprob_token_ids: every generated token's alternatives are the sampled token,
    then the listed ids' raw logprobs in their order (a repeated id, or the sampled one, once),
    instead of the top-k, as vLLM 0.26 lists them; the sampled token's entry is as without
    them; streamed equals non-streamed; on completions the echoed prompt rows keep the
    logprobs top-k."""
    listed = [9, 5, 300, 5]
    chat = {"messages": MSGS, "max_tokens": 5, **GREEDY, **EXACT, "logprobs": True}
    plain = httpx.post(
        server.url + "/v1/chat/completions", json=chat | {"top_logprobs": 20}, timeout=60
    ).json()
    asked = httpx.post(
        server.url + "/v1/chat/completions", json=chat | {"logprob_token_ids": listed}, timeout=60
    ).json()
    tok = AutoTokenizer.from_pretrained(STORIES)
    names = [TokenStrings(tok).get(t)[0] for t in (9, 5, 300)]
    for p, a in zip(
        plain["choices"][0]["logprobs"]["content"], asked["choices"][0]["logprobs"]["content"], strict=True
    ):
        # equal up to float32 rounding: the second request hits the prefix cache
        assert a["token"] == p["token"] and a["logprob"] == pytest.approx(p["logprob"], abs=1e-5)
        assert [t["token"] for t in a["top_logprobs"]] == [a["token"], *names]
        assert a["top_logprobs"][0] == {k: a[k] for k in ("token", "logprob", "bytes")}  # no rounding
        for t in a["top_logprobs"]:  # where the top 20 name the same token, the same value
            same = [q["logprob"] for q in p["top_logprobs"] if q["token"] == t["token"]]
            assert not same or t["logprob"] == pytest.approx(same[0], abs=1e-5)
    stream = httpx.post(
        server.url + "/v1/chat/completions",
        json=chat | {"logprob_token_ids": listed, "stream": True},
        timeout=60,
    ).text
    streamed = [
        c
        for line in stream.splitlines()
        if line.startswith("data: {")
        for ch in json.loads(line[6:])["choices"]
        if ch.get("logprobs")
        for c in ch["logprobs"]["content"]
    ]
    assert [[t["token"] for t in c["top_logprobs"]] for c in streamed] == [
        [c["token"], *names] for c in streamed
    ]
    assert len(streamed) == 5
    # the sampled token among the listed ids keeps the first place and is not listed twice
    by_id = chat | {"max_tokens": 1, "return_tokens_as_token_ids": True}
    first = httpx.post(server.url + "/v1/chat/completions", json=by_id, timeout=60).json()
    sampled = first["choices"][0]["logprobs"]["content"][0]["token"]  # "token_id:<id>"
    ids = [9, int(sampled.removeprefix("token_id:")), 5]
    again = httpx.post(
        server.url + "/v1/chat/completions", json=by_id | {"logprob_token_ids": ids}, timeout=60
    ).json()
    top = again["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert [t["token"] for t in top] == [sampled, "token_id:9", "token_id:5"]
    cmpl = {"prompt": PROMPT, "max_tokens": 3, **GREEDY, **EXACT, "logprobs": 2, "echo": True}
    r = httpx.post(
        server.url + "/v1/completions", json=cmpl | {"logprob_token_ids": listed}, timeout=60
    ).json()
    lp = r["choices"][0]["logprobs"]
    n_prompt = r["usage"]["prompt_tokens"]
    assert all(top is None or len(top) <= 3 for top in lp["top_logprobs"][:n_prompt])  # echo: top-2
    for token, top in zip(lp["tokens"][n_prompt:], lp["top_logprobs"][n_prompt:], strict=True):
        assert list(top) == list(dict.fromkeys([token, *names]))  # the sampled token first, as vLLM


def test_top_logprobs_0_needs_no_logprobs(server: Server) -> None:
    """``top_logprobs: 0``, its default, is taken without ``logprobs: true`` (or with
    ``logprobs: false``), as vLLM 0.26 takes it (only a value above 0 needs it): the answer has
    no logprobs; above 0 it stays a 400 naming the field."""
    body = {"messages": MSGS, "max_tokens": 2, **GREEDY, "top_logprobs": 0}
    for extra in ({}, {"logprobs": False}, {"stream": True}):
        r = httpx.post(server.url + "/v1/chat/completions", json=body | extra, timeout=60)
        assert r.status_code == 200, r.text
        if not extra.get("stream"):
            assert r.json()["choices"][0]["logprobs"] is None
    r = httpx.post(server.url + "/v1/chat/completions", json=body | {"top_logprobs": 1}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs", r.text


@pytest.mark.parametrize(("path", "body", "param"), BAD)
def test_bad_logprob_fields_are_400_naming_them(
    server: Server, path: str, body: dict[str, Any], param: str
) -> None:
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"]


def test_token_strings_bytes_of_partial_characters() -> None:
    strings = TokenStrings(AutoTokenizer.from_pretrained(STORIES))
    tok = AutoTokenizer.from_pretrained(STORIES)
    ids = tok.encode("日本", add_special_tokens=False)
    raw = [b for i in ids for b in strings.get(i)[1]]
    assert bytes(raw).decode("utf-8").strip() == "日本"


_HOSTILE = """
import json, sys, httpx
body = {"messages": [{"role": "user", "content": "Tell me a story"}], "n": 128, "max_tokens": 200,
        "logprobs": True, "top_logprobs": 20, "ignore_eos": True}
r = httpx.post(sys.argv[1] + "/v1/chat/completions", json=body, timeout=120)
choices = r.json()["choices"]
print(json.dumps([r.status_code, len(choices), sorted({len(c["logprobs"]["content"]) for c in choices})]))
"""


def test_a_large_non_streamed_logprobs_answer_does_not_stall_other_streams(server: Server) -> None:
    """128 choices x 200 tokens x 20 top logprobs make a 30 MB chat answer: it is built with
    pauses for the event loop and encoded by msgspec, so another client's stream keeps flowing
    (it stalled 1.7 s while the answer was built and encoded with json.dumps). The big answer
    is read by another process, whose parsing would hold this one's GIL. The development machine
    is shared: a first run over the bound (519 ms once, with other test runs alongside) is
    repeated, and the second must hold."""

    def canary_gaps() -> list[float]:
        hostile = subprocess.Popen(
            [sys.executable, "-c", _HOSTILE, server.url], stdout=subprocess.PIPE, text=True
        )
        gaps: list[float] = []
        body = {"prompt": PROMPT, "max_tokens": 150, "stream": True, **EXACT}
        while hostile.poll() is None:
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
                last = time.monotonic()
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        now = time.monotonic()
                        gaps.append(now - last)
                        last = now
        out, _ = hostile.communicate(timeout=120)
        assert json.loads(out) == [200, 128, [200]], out
        assert len(gaps) > 100
        return gaps

    gaps = canary_gaps()
    if max(gaps) >= 0.5:
        gaps = canary_gaps()
    assert max(gaps) < 0.5, f"a canary stream stalled {max(gaps) * 1e3:.0f} ms"


def test_prompt_logprobs_are_shared_by_the_choices_of_a_prompt(server: Server) -> None:
    body = {"prompt": [PROMPT, "Lily"], "n": 3, "max_tokens": 1, "prompt_logprobs": 2}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    plp = [c["prompt_logprobs"] for c in r.json()["choices"]]
    assert plp[0] == plp[1] == plp[2] and plp[3] == plp[4] == plp[5] and plp[0] != plp[3]
    assert plp[0][0] is None and len(plp[0]) == len(
        httpx.post(server.url + "/tokenize", json={"prompt": PROMPT}, timeout=60).json()["tokens"]
    )
