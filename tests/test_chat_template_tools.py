"""Tools, assistant tool calls and tool results render through the Qwen3 and Llama 3.1 chat
templates (arguments given as a JSON string reach the template as an object)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from surge.tokenizer import apply_chat_template, load_tokenizer
from tests.conftest import SHARED, STORIES

LLAMA = SHARED / "models" / "llama-3.1-8b-instruct"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]


@pytest.fixture(scope="module")
def qwen3_tok(qwen3_8b_dir: Path) -> Any:
    return load_tokenizer(qwen3_8b_dir)


def test_qwen3_template_renders_tools_calls_and_results(qwen3_tok: Any) -> None:
    text = qwen3_tok.decode(apply_chat_template(qwen3_tok, HISTORY, tools=TOOLS))
    assert "<tools>\n" + json.dumps(TOOLS[0]) in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\nsunny\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_llama31_template_renders_tools_calls_and_results(qwen3_tok: Any) -> None:
    if not LLAMA.is_dir():
        pytest.skip("Llama 3.1 assets not found")
    template = json.loads((LLAMA / "tokenizer_config.json").read_text())["chat_template"]
    ids = apply_chat_template(qwen3_tok, HISTORY, tools=TOOLS, chat_template=template)
    text = qwen3_tok.decode(ids)
    assert '"name": "get_weather"' in text and "Environment: ipython" in text
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}' in text
    assert "<|start_header_id|>ipython<|end_header_id|>" in text and "sunny" in text


def test_fallback_template_and_bad_tool_calls() -> None:
    tok = load_tokenizer(STORIES)
    ids = apply_chat_template(tok, HISTORY[:1], tools=TOOLS)
    assert tok.decode(ids, skip_special_tokens=True).startswith("tools: [")
    bad = [
        HISTORY[0],
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{nope"}}]},
    ]
    with pytest.raises(ValueError, match="not valid JSON"):
        apply_chat_template(tok, bad)
