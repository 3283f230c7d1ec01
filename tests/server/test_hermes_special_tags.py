"""``--tool-call-parser hermes`` on a model whose ``<tool_call>`` and ``</tool_call>`` are special
tokens (vLLM: "marked special in some models"): ``skip_special_tokens`` (true by default) dropped
the tags before the parser saw them, so the model's calls came back as bare JSON content. As
vLLM's hermes parser (``adjust_request``), a request with tools under ``tool_choice: "auto"``
now decodes special tokens unless it sets ``skip_special_tokens`` itself. The model is a tiny
random Qwen3 with the real Qwen3 tokenizer, its two tags marked special."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from surge.server.chat_tools import plan_chat
from surge.server.protocol import ChatCompletionRequest
from surge.tokenizer import IncrementalDetokenizer, load_tokenizer
from tests.conftest import qwen3_8b_dir_or_skip
from tests.server.conftest import Server, start_server

TAGS = {"151657": "<tool_call>", "151658": "</tool_call>"}
TOOLS: list[Any] = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
MSGS: list[Any] = [{"role": "user", "content": "Call f."}]


def _special_tags_model(path: Path) -> Path:
    from tests.structured.conftest import make_qwen3_vocab_model

    qwen3_8b_dir_or_skip()
    make_qwen3_vocab_model(path)
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for token_id, tag in TAGS.items():
        assert config["added_tokens_decoder"][token_id]["content"] == tag
        config["added_tokens_decoder"][token_id]["special"] = True
    config_path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _special_tags_model(tmp_path_factory.mktemp("qwen3-special-tags"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("serve-special-tags"),
        "--tool-call-parser",
        "hermes",
        "--load-format",
        "dummy",
        "--max-model-len",
        "1024",
        model=model_dir,
    )
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def _text(model_dir: Path, fields: dict[str, Any], ids: list[int]) -> tuple[str, Any]:
    """The text a chat request with ``fields`` decodes ``ids`` to, and its plan."""
    tokenizer = load_tokenizer(model_dir)
    body = ChatCompletionRequest.model_validate({"messages": MSGS, "tools": TOOLS, **fields})
    plan = plan_chat(body, tokenizer, "hermes", None)
    detok = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=plan.skip_special_tokens(body))
    text = "".join(detok.update([i]) for i in ids) + detok.flush()
    return text, plan


def test_an_auto_request_keeps_the_special_tags_so_its_call_parses(model_dir: Path) -> None:
    tokenizer = load_tokenizer(model_dir)
    answer = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    ids = tokenizer.encode(answer, add_special_tokens=False)
    assert ids[0] == 151657 and ids[-1] == 151658
    text, plan = _text(model_dir, {}, ids)
    assert text == answer
    message, finish = plan.message(text, "stop")
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        ("f", '{"a": 1}')
    ]
    assert finish == "tool_calls"
    # a request that sets the field keeps it (the tags are then dropped, and the call with them)
    assert _text(model_dir, {"skip_special_tokens": True}, ids)[0] == answer.removeprefix(
        "<tool_call>"
    ).removesuffix("</tool_call>")
    assert _text(model_dir, {"skip_special_tokens": False}, ids)[0] == answer
    # no parser reads the answer: the default stays
    for fields in ({"tool_choice": "none"}, {"tool_choice": "required"}):
        assert not _text(model_dir, fields, ids)[1].keeps_special_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_the_served_answer_keeps_a_special_tag(server: Server, stream: bool) -> None:
    """Over HTTP (``logit_bias`` makes the first token ``<tool_call>``): the answer's text holds
    the tag, as vLLM's would; ``skip_special_tokens: true`` sent by the client drops it."""
    for fields, content in (({}, "<tool_call>"), ({"skip_special_tokens": True}, "")):
        body = {
            "messages": MSGS,
            "tools": TOOLS,
            "max_tokens": 1,
            "logit_bias": {"151657": 100},
            "stream": stream,
            **fields,
        }
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        if stream:
            text = ""
            for event in r.text.strip().split("\n\n"):
                data = event.removeprefix("data: ")
                if data != "[DONE]":
                    text += "".join(c["delta"].get("content") or "" for c in json.loads(data)["choices"])
        else:
            text = r.json()["choices"][0]["message"]["content"] or ""
        assert text == content
