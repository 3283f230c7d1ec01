"""vLLM's ``return_token_ids`` and ``return_tokens_as_token_ids`` over HTTP.

``return_token_ids`` puts the prompt's ids (chat: ``prompt_token_ids`` at the top level, on each
role chunk when streamed; completions: on each choice, on its first chunk when streamed) and each
choice's generated ids (``token_ids``; streamed: the ids since the choice's previous chunk) in
the answer. ``return_tokens_as_token_ids`` (or the server's ``--return-tokens-as-token-ids``)
names logprob tokens ``"token_id:<id>"``. The prompt ids are those ``/tokenize`` gives, the
generated ids those the offline engine generates greedily from the same prompt ids.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from surge import LLM, SamplingParams
from tests.conftest import QWEN3_8B_DIR
from tests.server.conftest import Server, serve_tiny_qwen3

PROMPT = "Once upon a time"
MSGS = [{"role": "user", "content": "Tell me a story"}]
CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
IDS = {"return_token_ids": True}
AS_IDS = {"return_tokens_as_token_ids": True}
THINK = 151667  # Qwen3's <think>: the reasoning parser takes it and releases no text
PLACEHOLDER = re.compile(r"token_id:(\d+)")


def _post(srv: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(srv.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _events(srv: Server, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = httpx.post(srv.url + path, json=body | {"stream": True}, timeout=120)
    assert r.status_code == 200, r.text
    events = [e for e in r.text.strip().split("\n\n") if not e.startswith(":")]
    assert events[-1] == "data: [DONE]"
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


def _base(path: str) -> dict[str, Any]:
    return {"messages": MSGS} if path == CHAT else {"prompt": PROMPT}


def _tokenize(srv: Server, path: str) -> list[int]:
    return _post(srv, "/tokenize", {"messages": MSGS} if path == CHAT else {"prompt": PROMPT})["tokens"]


def _id_of(token: str) -> int:
    m = PLACEHOLDER.fullmatch(token)
    assert m, token
    return int(m.group(1))


@pytest.fixture(scope="module")
def offline() -> LLM:
    """The bundled model in this process, for the engine's own greedy ids."""
    return LLM(device="cpu")


@pytest.mark.parametrize("path", [CHAT, CMPL])
def test_ids_are_the_tokenized_prompt_and_the_engines_greedy_output(
    server: Server, offline: LLM, path: str
) -> None:
    r = _post(server, path, _base(path) | IDS | {"max_tokens": 12, "temperature": 0, "ignore_eos": True})
    choice = r["choices"][0]
    # chat: once, at the top level; completions: on each choice (as vLLM)
    prompt_ids = r["prompt_token_ids"] if path == CHAT else choice["prompt_token_ids"]
    assert ("prompt_token_ids" in choice) is (path == CMPL)
    assert ("prompt_token_ids" in r) is (path == CHAT)
    assert prompt_ids == _tokenize(server, path)
    assert len(prompt_ids) == r["usage"]["prompt_tokens"]
    [want] = offline.generate(
        [{"prompt_token_ids": prompt_ids}], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    )
    assert choice["token_ids"] == want.outputs[0].token_ids
    assert len(choice["token_ids"]) == r["usage"]["completion_tokens"] == 12
    for off in ({}, {"return_token_ids": False}, {"return_token_ids": None}):  # nothing added
        body = _base(path) | off | {"max_tokens": 3, "logprobs": 1 if path == CMPL else True}
        for payload in (_post(server, path, body), *_events(server, path, body)):
            text = json.dumps(payload)
            assert "token_ids" not in text and "token_id:" not in text, text


@pytest.mark.parametrize("path", [CHAT, CMPL])
def test_streamed_ids_join_to_the_non_streamed_ones_with_n(server: Server, path: str) -> None:
    body = _base(path) | IDS | {"max_tokens": 10, "n": 2, "seed": 7, "ignore_eos": True}
    full = _post(server, path, body)
    prompt_ids = full["prompt_token_ids"] if path == CHAT else full["choices"][0]["prompt_token_ids"]
    events = _events(server, path, body | {"stream_options": {"include_usage": True}})
    ids: dict[int, list[int]] = {0: [], 1: []}
    prompts: dict[int, list[list[int]]] = {0: [], 1: []}
    for ev in events[:-1]:
        [c] = ev["choices"]
        if path == CHAT:
            assert "prompt_token_ids" not in c
            if "role" in c["delta"]:  # vLLM: the role chunk holds the prompt's ids, no token_ids
                prompts[c["index"]].append(ev["prompt_token_ids"])
                assert "token_ids" not in c
                continue
            assert "prompt_token_ids" not in ev
        elif "prompt_token_ids" in c:  # the choice's first chunk
            assert not ids[c["index"]]
            prompts[c["index"]].append(c["prompt_token_ids"])
        ids[c["index"]] += c["token_ids"]
    assert prompts == {0: [prompt_ids], 1: [prompt_ids]}
    usage = events[-1]
    assert usage["choices"] == [] and "prompt_token_ids" not in usage
    assert usage["usage"]["completion_tokens"] == 20
    for choice in full["choices"]:
        assert len(choice["token_ids"]) == 10
        assert ids[choice["index"]] == choice["token_ids"]


def test_stop_string_tokens_and_echo_scoring(server: Server, offline: LLM) -> None:
    """The ids are every generated token, those of a matched stop string too (as the usage and
    the logprobs count them; the text is cut); ``echo`` keeps its text, and scoring a prompt
    (``max_tokens: 0``) has no generated ids."""
    r = _post(server, CMPL, {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stop": ["was"]} | IDS)
    choice = r["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == "was"
    assert len(choice["token_ids"]) == r["usage"]["completion_tokens"]
    assert offline.tokenizer.decode(choice["token_ids"]).startswith(choice["text"] + "was")
    prompt_ids = _tokenize(server, CMPL)
    score = {"prompt": PROMPT, "echo": True, "max_tokens": 0, "logprobs": 0} | IDS | AS_IDS
    r = _post(server, CMPL, score)
    choice = r["choices"][0]
    assert choice["text"] == PROMPT and choice["token_ids"] == []
    assert choice["prompt_token_ids"] == prompt_ids
    assert [_id_of(t) for t in choice["logprobs"]["tokens"]] == prompt_ids
    [ev, usage] = _events(server, CMPL, score | {"stream_options": {"include_usage": True}})
    [c] = ev["choices"]
    assert c["prompt_token_ids"] == prompt_ids and c["token_ids"] == [] and c["text"] == PROMPT
    echoed = _events(server, CMPL, {"prompt": PROMPT, "echo": True, "max_tokens": 3} | IDS)
    assert echoed[0]["choices"][0]["text"].startswith(PROMPT)
    assert sum(len(e["choices"][0]["token_ids"]) for e in echoed) == 3


def test_each_prompt_of_a_list_has_its_own_ids(server: Server) -> None:
    """Completions: a choice's ``prompt_token_ids`` are its own prompt's, as the engine got it
    (after ``truncate_prompt_tokens``)."""
    prompts = [PROMPT, "The cat"]
    want = [_post(server, "/tokenize", {"prompt": p})["tokens"] for p in prompts]
    r = _post(server, CMPL, {"prompt": prompts, "max_tokens": 2, "n": 2} | IDS)
    assert [c["prompt_token_ids"] for c in r["choices"]] == [want[0], want[0], want[1], want[1]]
    r = _post(server, CMPL, {"prompt": [want[0]], "max_tokens": 2, "truncate_prompt_tokens": 2} | IDS)
    assert r["choices"][0]["prompt_token_ids"] == want[0][-2:]


def test_chat_logprob_tokens_as_token_ids(server: Server) -> None:
    body = {"messages": MSGS, "max_tokens": 8, "logprobs": True, "top_logprobs": 3, "seed": 3} | IDS
    named = _post(server, CHAT, body)["choices"][0]
    r = _post(server, CHAT, body | AS_IDS)
    choice = r["choices"][0]
    content = choice["logprobs"]["content"]
    assert [_id_of(c["token"]) for c in content] == choice["token_ids"] == named["token_ids"]
    for entry, plain in zip(content, named["logprobs"]["content"], strict=True):
        assert entry["bytes"] == plain["bytes"]  # the token's own bytes, as without the field
        assert entry["logprob"] == pytest.approx(plain["logprob"], abs=1e-5)
        assert len([_id_of(t["token"]) for t in entry["top_logprobs"]]) == 3
        assert [t["bytes"] for t in entry["top_logprobs"]] == [t["bytes"] for t in plain["top_logprobs"]]
    streamed: list[int] = []
    for ev in _events(server, CHAT, body | AS_IDS):
        c = ev["choices"][0]
        if c["logprobs"] is not None:
            assert [_id_of(e["token"]) for e in c["logprobs"]["content"]] == c["token_ids"]
            streamed += c["token_ids"]
    assert streamed == choice["token_ids"]


def test_completion_logprob_tokens_as_token_ids(server: Server) -> None:
    body = {"prompt": PROMPT, "max_tokens": 6, "logprobs": 2, "echo": True, "prompt_logprobs": 1, "seed": 1}
    r = _post(server, CMPL, body | IDS | AS_IDS)
    choice = r["choices"][0]
    lp = choice["logprobs"]
    # the echoed prompt's tokens, then the generated ones (vLLM's order)
    assert [_id_of(t) for t in lp["tokens"]] == choice["prompt_token_ids"] + choice["token_ids"]
    assert lp["top_logprobs"][0] is None
    for top in lp["top_logprobs"][1:]:
        assert 2 <= len(top) <= 3 and all(PLACEHOLDER.fullmatch(t) for t in top)
    # offsets count the names the tokens are given, as vLLM
    lengths = [len(t) for t in lp["tokens"]]
    assert lp["text_offset"] == [sum(lengths[:i]) for i in range(len(lengths))]
    assert choice["text"].startswith(PROMPT)
    # prompt_logprobs keep the decoded text, as in vLLM
    plain = _post(server, CMPL, body)["choices"][0]
    assert choice["prompt_logprobs"] == plain["prompt_logprobs"]
    assert plain["logprobs"]["tokens"][1:] != lp["tokens"][1:]
    streamed: list[str] = []
    for ev in _events(server, CMPL, body | AS_IDS | {"prompt_logprobs": None}):
        streamed += ev["choices"][0]["logprobs"]["tokens"]
    assert streamed == lp["tokens"]


@pytest.fixture(scope="module")
def qwen3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A tiny random Qwen3 with the real tokenizer, a reasoning parser and
    ``--return-tokens-as-token-ids``."""
    yield from serve_tiny_qwen3(
        tmp_path_factory,
        "token-ids",
        "--reasoning-parser",
        "qwen3",
        "--return-tokens-as-token-ids",
        max_model_len=512,
    )


@pytest.mark.parametrize("include_reasoning", [True, False])
def test_parser_held_chunks_still_carry_their_ids(qwen3_server: Server, include_reasoning: bool) -> None:
    """A chunk whose text the reasoning parser takes (``<think>``) is not sent without ids; with
    ``return_token_ids`` it is (delta ``{}``), so the streamed ids hold every token (vLLM)."""
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "temperature": 0,
        "logit_bias": {str(THINK): 100},
        "include_reasoning": include_reasoning,
    } | IDS
    full = _post(qwen3_server, CHAT, body)
    assert full["choices"][0]["token_ids"] == [THINK] * 4
    ids: list[int] = []
    for ev in _events(qwen3_server, CHAT, body):
        c = ev["choices"][0]
        if "role" not in c["delta"]:
            assert c["token_ids"], ev  # no chunk without news
            ids += c["token_ids"]
    assert ids == [THINK] * 4


def test_server_flag_is_the_default_a_request_overrides(qwen3_server: Server) -> None:
    tok = AutoTokenizer.from_pretrained(QWEN3_8B_DIR)
    base = {"max_tokens": 3, "temperature": 0}
    chat = {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True} | base | IDS
    r = _post(qwen3_server, CHAT, chat)["choices"][0]
    assert [c["token"] for c in r["logprobs"]["content"]] == [f"token_id:{t}" for t in r["token_ids"]]
    r = _post(qwen3_server, CHAT, chat | {"return_tokens_as_token_ids": False})["choices"][0]
    assert [c["token"] for c in r["logprobs"]["content"]] == [tok.decode([t]) for t in r["token_ids"]]
    cmpl = {"prompt": "Hi", "logprobs": 0} | base | IDS
    r = _post(qwen3_server, CMPL, cmpl)["choices"][0]
    assert r["logprobs"]["tokens"] == [f"token_id:{t}" for t in r["token_ids"]]
    r = _post(qwen3_server, CMPL, cmpl | {"return_tokens_as_token_ids": False})["choices"][0]
    assert r["logprobs"]["tokens"] == [tok.decode([t]) for t in r["token_ids"]]
