"""Text correctness over HTTP: stop strings across tokens, multi-byte characters from byte-fallback tokens."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import STORIES, Server, start_server

PROMPT = "Once upon a time"
# " 日é😀" in stories260K tokens: ▁, <0xE6><0x97><0xA5>, é, <0xF0><0x9F><0x98><0x80> (byte fallback)
CYCLE = [410, 233, 154, 168, 485, 243, 162, 155, 131]
CYCLE_TEXT = " 日é😀"


def _stream_text(srv: Server, body: dict[str, Any]) -> tuple[list[str], list[dict]]:
    with (
        httpx.Client(timeout=120) as c,
        c.stream("POST", srv.url + "/v1/completions", json=body | {"stream": True}) as r,
    ):
        assert r.status_code == 200
        raw = r.read().decode()
    events = [e[len("data: ") :] for e in raw.strip().split("\n\n")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    return [c["choices"][0]["text"] for c in chunks if c["choices"]], chunks


def _tokens(srv: Server, text: str) -> list[int]:
    return httpx.post(srv.url + "/tokenize", json={"prompt": text, "add_special_tokens": False}).json()[
        "tokens"
    ]


def test_stop_strings_spanning_tokens(server: Server) -> None:
    base = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 40, "temperature": 0},
        timeout=120,
    ).json()["choices"][0]["text"]
    assert base.startswith(", there was a little girl")
    # stop strings that start and end inside tokens, so they span token boundaries
    for stops in (["re was a lit"], ["ttle gi"], ["zzz", "e was"], ["here w", "a little"]):
        cut = min(base.index(s) for s in stops if s in base)
        body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stop": stops}
        full = httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()
        choice = full["choices"][0]
        assert choice["text"] == base[:cut]
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] in stops
        assert full["usage"]["completion_tokens"] < 40
        pieces, chunks = _stream_text(server, body | {"stream_options": {"include_usage": True}})
        assert "".join(pieces) == base[:cut]
        assert chunks[-1]["usage"] == full["usage"]
        streamed = ""
        for p in pieces:
            streamed += p
            # nothing past the cut ever reaches the client, not even a stop-string prefix
            assert base[:cut].startswith(streamed)
        finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert finals.count("stop") == 1 and finals[-1] == "stop"
    # a stop string given as a plain string, on chat
    body = {"messages": [{"role": "user", "content": "Tom"}], "max_tokens": 30, "temperature": 0}
    chat_base = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()
    text = chat_base["choices"][0]["message"]["content"]
    stop = text[5:9]
    cut = text.index(stop)
    r = httpx.post(server.url + "/v1/chat/completions", json=body | {"stop": stop}, timeout=120).json()
    assert r["choices"][0]["message"]["content"] == text[:cut] and r["choices"][0]["finish_reason"] == "stop"


def _make_cycle_model(path: Path) -> Path:
    """The stories260K tokenizer with hand-set weights: greedy output cycles through CYCLE."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = json.loads((STORIES / "config.json").read_text())
    cfg.update(num_hidden_layers=1, tie_word_embeddings=False)
    config = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.norm.weight.fill_(1.0)
        model.model.layers[0].input_layernorm.weight.fill_(1.0)
        model.model.layers[0].post_attention_layernorm.weight.fill_(1.0)
        emb = model.model.embed_tokens.weight
        head = model.lm_head.weight
        other = len(CYCLE)
        emb[:, other] = 1.0  # every token outside the cycle -> direction `other`
        for i, tok in enumerate(CYCLE):
            emb[tok].zero_()
            emb[tok, i] = 1.0
            head[CYCLE[(i + 1) % len(CYCLE)], i] = 10.0
        head[CYCLE[0], other] = 10.0  # after any other token, start the cycle
    model.save_pretrained(path, safe_serialization=True)
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    ):
        shutil.copy(STORIES / name, path / name)
    return path


@pytest.fixture(scope="module")
def cycle_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model = _make_cycle_model(tmp_path_factory.mktemp("cycle-model"))
    srv = start_server(tmp_path_factory.mktemp("serve-cycle"), "--served-model-name", "cycle", model=model)
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def test_multibyte_output_streams_without_replacement_char(cycle_server: Server) -> None:
    n_tokens = 4 * len(CYCLE) + 7  # ends inside the emoji's bytes
    body = {"prompt": PROMPT, "max_tokens": n_tokens, "temperature": 0, "ignore_eos": True}
    full = httpx.post(cycle_server.url + "/v1/completions", json=body, timeout=120).json()
    text = full["choices"][0]["text"]
    assert text.startswith(CYCLE_TEXT * 4 + " 日é")
    for stream_body in (body, body | {"max_tokens": 4 * len(CYCLE)}):
        pieces, _ = _stream_text(cycle_server, stream_body)
        assert len(pieces) >= 2 * 4
        assert all("\ufffd" not in p for p in pieces[:-1]), pieces
    pieces, _ = _stream_text(cycle_server, body | {"max_tokens": 4 * len(CYCLE)})
    assert "".join(pieces) == CYCLE_TEXT * 4
    pieces, _ = _stream_text(cycle_server, body)
    assert "".join(pieces) == text
    # the request ended with an unfinished emoji: only the final chunk may carry its bytes as U+FFFD
    assert text.endswith("\ufffd") and "\ufffd" not in text[: len(CYCLE_TEXT) * 4]
    # a stop string made of multi-byte characters, spanning byte tokens
    body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stop": ["é😀 日é"]}
    pieces, chunks = _stream_text(cycle_server, body)
    assert "".join(pieces) == " 日"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    chat = httpx.post(
        cycle_server.url + "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 2 * len(CYCLE),
            "ignore_eos": True,
        },
        timeout=120,
    ).json()
    assert chat["choices"][0]["message"]["content"] == CYCLE_TEXT * 2
