"""The official openai SDK against a live `surge serve` of the bundled model."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import Server

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    models = client.models.list().data
    assert len(models) == 1
    return models[0].id


def test_models_and_misc_endpoints(server: Server, client: openai.OpenAI, model: str) -> None:
    data = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert data["id"] == model and data["root"].endswith("stories260K") and data["max_model_len"] == 512
    card = client.models.retrieve(model)
    assert card.id == model and card.object == "model" and card.owned_by == "surge"
    # one permission object, as vLLM's: clients that read ``permission[0]`` find it
    (perm,) = data["permission"]
    assert perm["object"] == "model_permission" and perm["id"].startswith("modelperm-")
    assert perm["allow_sampling"] is True and perm["allow_logprobs"] is True and perm["organization"] == "*"
    missing = httpx.get(server.url + "/v1/models/org/no-such-model")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    assert "org/no-such-model" in missing.json()["error"]["message"]
    assert httpx.get(server.url + "/version").json()["version"]
    tok = httpx.post(server.url + "/tokenize", json={"prompt": PROMPT}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["tokens"][0] == 1 and tok["max_model_len"] == 512
    text = httpx.post(server.url + "/detokenize", json={"tokens": tok["tokens"][1:]}).json()["prompt"]
    assert text == PROMPT
    chat_tok = httpx.post(
        server.url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}
    ).json()
    assert chat_tok["count"] > 2


def test_completion_non_stream_greedy(client: openai.OpenAI, model: str) -> None:
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=20, temperature=0)
    assert r.object == "text_completion" and len(r.choices) == 1
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 20 and r.usage.total_tokens == 25
    assert r.choices[0].text.startswith(", there was")
    again = client.completions.create(model=model, prompt=PROMPT, max_tokens=20, temperature=0)
    assert again.choices[0].text == r.choices[0].text


def test_completion_stream_equals_non_stream(client: openai.OpenAI, model: str) -> None:
    kw = dict(model=model, prompt=PROMPT, max_tokens=24, temperature=0)
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    content = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in content) == full.choices[0].text
    assert [c.choices[0].finish_reason for c in content].count("length") == 1
    assert content[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    no_usage = list(client.completions.create(**kw, stream=True))
    assert all(c.usage is None for c in no_usage) and all(c.choices for c in no_usage)


def test_chat_non_stream_and_stream(client: openai.OpenAI, model: str) -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Once upon a time"}]}]
    full = client.chat.completions.create(model=model, messages=msgs, max_completion_tokens=16, temperature=0)
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant" and full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 16
    stream = client.chat.completions.create(
        model=model,
        messages=msgs,
        max_completion_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert content[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert "".join(c.choices[0].delta.content or "" for c in content) == full.choices[0].message.content
    assert (
        chunks[-1].usage.completion_tokens == 16
        and chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    )


def test_max_completion_tokens_wins(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Tom"}],
        max_tokens=30,
        max_completion_tokens=7,
        temperature=0,
    )
    assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("max_tokens", [1, 13, 64])
def test_ignore_eos_exact_length(client: openai.OpenAI, model: str, max_tokens: int) -> None:
    r = client.completions.create(
        model=model,
        prompt="The end.",
        max_tokens=max_tokens,
        temperature=1.0,
        seed=3,
        extra_body={"ignore_eos": True},
    )
    assert r.usage.completion_tokens == max_tokens and r.choices[0].finish_reason == "length"
    chunks = list(
        client.completions.create(
            model=model,
            prompt="The end.",
            max_tokens=max_tokens,
            temperature=1.0,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == max_tokens
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text


def test_eos_stop_is_not_length(client: openai.OpenAI, model: str) -> None:
    # Without ignore_eos a long budget ends at EOS: finish_reason "stop" and fewer tokens than max.
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=150, temperature=0)
    c = r.choices[0]
    assert (c.finish_reason == "length") == (r.usage.completion_tokens == 150)
    assert "</s>" not in c.text


def test_n2_and_seed_reproducibility(client: openai.OpenAI, model: str) -> None:
    kw = dict(model=model, prompt=PROMPT, max_tokens=24, temperature=1.0, seed=1234, n=2)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert sorted(c.index for c in a.choices) == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.choices[0].text != a.choices[1].text
    assert 2 <= a.usage.completion_tokens <= 48
    assert a.usage.prompt_tokens == 5
    other = client.completions.create(**{**kw, "seed": 99})
    assert [c.text for c in other.choices] != [c.text for c in a.choices]
    # streaming n=2: each choice has its own index and exactly one finish_reason
    chunks = list(client.completions.create(**kw, stream=True))
    texts = {0: "", 1: ""}
    finishes = {0: 0, 1: 0}
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] += c.text
            finishes[c.index] += c.finish_reason is not None
    assert finishes == {0: 1, 1: 1}
    assert [texts[0], texts[1]] == [c.text for c in a.choices]


def test_chat_n2_seeded(client: openai.OpenAI, model: str) -> None:
    kw = dict(model=model, messages=[{"role": "user", "content": "Lily"}], max_tokens=12, seed=7, n=2)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert [c.index for c in a.choices] == [0, 1]


def test_penalties_and_sampling_fields_accepted(client: openai.OpenAI, model: str) -> None:
    r = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=30,
        temperature=0,
        presence_penalty=1.5,
        frequency_penalty=1.0,
        top_p=0.9,
        user="someone",
        extra_body={"repetition_penalty": 1.3, "top_k": 20, "min_p": 0.05, "min_tokens": 5},
    )
    base = client.completions.create(model=model, prompt=PROMPT, max_tokens=30, temperature=0)
    assert r.usage.completion_tokens >= 5
    assert r.choices[0].text != base.choices[0].text  # penalties change greedy output


def test_prompt_forms_and_echo(client: openai.OpenAI, model: str, server: Server) -> None:
    ids = httpx.post(server.url + "/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    by_text = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    batch = client.completions.create(model=model, prompt=[PROMPT, "Tom and"], max_tokens=8, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1] and batch.choices[0].text == by_text.choices[0].text
    assert batch.usage.completion_tokens == 16
    echo = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, echo=True)
    assert echo.choices[0].text == PROMPT + by_text.choices[0].text


def test_stop_token_ids(client: openai.OpenAI, model: str, server: Server) -> None:
    base = client.completions.create(model=model, prompt=PROMPT, max_tokens=20, temperature=0)
    assert base.choices[0].text.startswith(", there")
    there = httpx.post(server.url + "/tokenize", json={"prompt": "there", "add_special_tokens": False})
    r = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=20,
        temperature=0,
        extra_body={"stop_token_ids": there.json()["tokens"]},
    )
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 2
    assert r.choices[0].text == ","
