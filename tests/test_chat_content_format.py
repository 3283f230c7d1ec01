"""vLLM's ``--chat-template-content-format``: how a message's content reaches the chat template
(one string, or OpenAI's list of parts), and ``auto``'s per-template detection
(surge/chat_content_format.py, surge/tokenizer.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from surge.chat_content_format import (
    describe_content_format,
    detect_content_format,
    resolve_content_format,
)
from surge.tokenizer import apply_chat_template, content_parts, load_tokenizer, normalize_messages

SHARED = Path(__file__).resolve().parents[2] / "shared" / "assets" / "models"
STORIES = Path(__file__).resolve().parents[1] / "surge" / "assets" / "stories260K"

PARTS_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}:{% for part in m['content'] %}[{{ part['text'] }}]"
    "{% endfor %};{% endfor %}"
)
"""A user's template of the list kind: it loops over each message's content parts."""
STRING_TEMPLATE = "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}\n{% endfor %}"

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
    {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
]


def _render(template: str, content_format: str, messages: list[dict[str, Any]] = MESSAGES) -> str:
    tok = load_tokenizer(STORIES)
    texts: list[str] = []
    apply_chat_template(
        tok,
        messages,
        chat_template=template,
        add_generation_prompt=False,
        check_text=texts.append,
        content_format=content_format,
    )
    return texts[0]


def _shared_template(model: str) -> str:
    folder = SHARED / model
    if not folder.is_dir():
        pytest.skip(f"shared assets: {model} not found")
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    return json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]


@pytest.mark.parametrize(
    "model", ["qwen3-8b", "qwen3-32b", "llama-3.1-8b-instruct", "llama-3.1-70b-instruct"]
)
def test_the_served_models_templates_read_strings(model: str) -> None:
    """The Qwen3 and Llama 3.1 templates of ../shared/assets read content as a string, so
    ``auto`` keeps rendering them as before (vLLM detects them as 'string' too)."""
    template = _shared_template(model)
    assert detect_content_format(template) == "string"
    assert resolve_content_format("auto", template) == "string"


@pytest.mark.parametrize(
    "template",
    [
        PARTS_TEMPLATE,
        "{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}",
        # the message list through set, slices and filters; the content through a filter
        "{% set rest = messages[1:] %}{% set loop_over = rest | reverse %}"
        "{% for m in loop_over %}{% for p in m['content'] | list %}{{ p.text }}{% endfor %}{% endfor %}",
        # a variable named content, as multimodal templates write it
        "{% for m in messages %}{% set content = m['content'] %}{% if content is string %}{{ content }}"
        "{% else %}{% for p in content %}{{ p['text'] }}{% endfor %}{% endif %}{% endfor %}",
    ],
)
def test_templates_that_loop_over_content_parts_are_openai(template: str) -> None:
    assert detect_content_format(template) == "openai"


@pytest.mark.parametrize(
    "template",
    [
        STRING_TEMPLATE,
        # loops, but not over a message's content
        "{% for m in messages %}{% for t in m['tool_calls'] or [] %}{{ t }}{% endfor %}{% endfor %}",
        "{% for x in other %}{% for p in x['content'] %}{{ p }}{% endfor %}{% endfor %}",
        "{% for m in messages %\n",  # does not parse: its rendering reports it
    ],
)
def test_other_templates_are_string(template: str) -> None:
    assert detect_content_format(template) == "string"


def test_detection_is_cached_per_template_text() -> None:
    template = PARTS_TEMPLATE + "{# cache probe #}"
    before = detect_content_format.cache_info()
    assert detect_content_format(template) == "openai"
    assert detect_content_format(template) == "openai"
    after = detect_content_format.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)


def test_resolve_and_refuse() -> None:
    assert resolve_content_format("openai", STRING_TEMPLATE) == "openai"
    assert resolve_content_format("string", PARTS_TEMPLATE) == "string"
    assert resolve_content_format("auto", PARTS_TEMPLATE) == "openai"
    assert resolve_content_format("auto", None) == "string"
    with pytest.raises(
        ValueError, match="chat_template_content_format must be 'auto', 'string' or 'openai', got 'x'"
    ):
        resolve_content_format("x", PARTS_TEMPLATE)


def test_a_parts_template_renders_the_text_under_auto_and_openai() -> None:
    """The silent bug: with each content passed as a string, a template that loops over the
    parts loops over characters and writes none of the text."""
    expected = "system:[Be brief.];user:[Hi][there];assistant:[No.];"
    assert _render(PARTS_TEMPLATE, "auto") == expected
    assert _render(PARTS_TEMPLATE, "openai") == expected
    wrong = _render(PARTS_TEMPLATE, "string")  # one empty part per character
    assert wrong.startswith("system:[][][]") and "Hi" not in wrong and "brief" not in wrong


def test_string_templates_unchanged() -> None:
    expected = "system:Be brief.\nuser:Hi\nthere\nassistant:No.\n"
    assert _render(STRING_TEMPLATE, "auto") == _render(STRING_TEMPLATE, "string") == expected


def test_content_parts_as_vllm_passes_them() -> None:
    """A string is one text part, no content none; refusal / input_text / output_text /
    thinking parts become text parts, with the part's other keys; a tool message's content
    stays one string (vLLM joins a tool result's text parts)."""
    assert content_parts("hi") == [{"type": "text", "text": "hi"}]
    assert content_parts(None) == []
    parts = [
        {"type": "input_text", "text": "a", "cache_control": {"type": "ephemeral"}},
        {"type": "thinking", "thinking": "b"},
        {"type": "output_text", "text": "c"},
    ]
    assert content_parts(parts) == [
        {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "b"},
        {"type": "text", "text": "c"},
    ]
    msgs = normalize_messages(
        [
            {"role": "assistant"},
            {"role": "tool", "content": [{"type": "text", "text": "1"}, {"type": "text", "text": "2"}]},
        ],
        "openai",
    )
    assert msgs[0]["content"] == [] and msgs[1]["content"] == "1\n2"


def test_refused_parts_stay_refused_under_openai() -> None:
    for content, message in [
        ([{"type": "image_url", "image_url": {"url": "x"}}], "only text content parts"),
        ([{"type": "text", "text": None}], "a content part of type 'text' needs a string 'text'"),
        (5, "content must be a string or a list of text parts"),
    ]:
        with pytest.raises(ValueError, match=message):
            _render(PARTS_TEMPLATE, "openai", [{"role": "user", "content": content}])


def test_no_template_renders_strings_whatever_the_format() -> None:
    """The fallback of a tokenizer without a template writes each content as a string."""
    tok = load_tokenizer(STORIES)
    texts: list[str] = []
    apply_chat_template(tok, MESSAGES[1:2], content_format="openai", check_text=texts.append)
    assert texts == ["user: Hi\nthere\nassistant:"]


def test_start_up_lines() -> None:
    level, line = describe_content_format("auto", PARTS_TEMPLATE, "the --chat-template")
    assert level == logging.INFO
    assert line.startswith("chat template content format: 'openai', detected in the --chat-template")
    level, line = describe_content_format("auto", STRING_TEMPLATE, "the model's chat template")
    assert level == logging.INFO and "'string', detected in the model's chat template" in line
    level, line = describe_content_format("openai", STRING_TEMPLATE, "the model's chat template")
    assert level == logging.WARNING and "'openai' as given" in line
    assert describe_content_format("openai", PARTS_TEMPLATE, "x") is None
    assert describe_content_format("auto", None, "x") is None


def test_named_templates_render_the_one_transformers_picks() -> None:
    """A tokenizer of named templates (``chat_template`` a dict, as Hermes 2 Pro's ``default``
    and ``tool_use``) renders the one transformers' ``get_chat_template`` picks, as vLLM's
    ``resolve_chat_template``: ``tool_use`` for a request with tools, else ``default``, each
    detected for the content format on its own. The dict reached the detection's cache (a
    TypeError, unhashable: the server's start-up log line failed, and every chat with it) and
    transformers' ``apply_chat_template`` ("chat template error: unhashable type")."""
    from surge.tokenizer import resolve_chat_template

    tok = load_tokenizer(STORIES)
    tok.chat_template = {"default": STRING_TEMPLATE, "tool_use": "tools;" + PARTS_TEMPLATE}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for fmt in ("auto", "string", "openai"):
        texts: list[str] = []
        apply_chat_template(tok, MESSAGES[:2], content_format="string", check_text=texts.append)
        apply_chat_template(tok, MESSAGES[:2], content_format="auto", check_text=texts.append)
        apply_chat_template(tok, MESSAGES[:2], tools=tools, content_format=fmt, check_text=texts.append)
        want = "tools;system:[Be brief.];user:[Hi][there];" if fmt != "string" else None
        assert texts[:2] == ["system:Be brief.\nuser:Hi\nthere\n"] * 2, texts
        if want is not None:
            assert texts[2] == want, texts
    assert resolve_chat_template(tok) == STRING_TEMPLATE
    assert resolve_chat_template(tok, tools=tools) == "tools;" + PARTS_TEMPLATE
    assert resolve_chat_template(tok, "mine", tools=tools) == "mine"
    tok.chat_template = {"tool_use": PARTS_TEMPLATE}  # no default: one line naming the chat template
    with pytest.raises(ValueError, match="^chat template: "):
        apply_chat_template(tok, MESSAGES[:2])
    assert resolve_chat_template(tok, tools=tools) == PARTS_TEMPLATE


def test_named_templates_start_up_line_and_offline_chat(caplog: pytest.LogCaptureFixture) -> None:
    """The start-up line (server) and ``LLM.chat``'s first-use line describe the named template
    in use (``default``; ``tool_use`` for a chat with tools); named templates without a default
    give no line, and the chat's rendering names the problem."""
    from surge import LLM, SamplingParams
    from surge.tokenizer import described_chat_template

    tok = load_tokenizer(STORIES)
    tok.chat_template = {"default": STRING_TEMPLATE, "tool_use": PARTS_TEMPLATE}
    line = describe_content_format("auto", described_chat_template(tok), "the model's chat template")
    assert line is not None and "'string', detected in the model's chat template" in line[1]
    assert described_chat_template(tok, tools=[{"type": "function"}]) == PARTS_TEMPLATE
    assert described_chat_template(tok, "mine") == "mine"
    tok.chat_template = {"tool_use": PARTS_TEMPLATE}
    assert described_chat_template(tok) is None
    with LLM(STORIES, device="cpu", num_kv_blocks=64) as llm:
        llm.get_tokenizer().chat_template = {"default": PARTS_TEMPLATE}
        with caplog.at_level(logging.INFO, logger="surge.llm"):
            out = llm.chat(MESSAGES[:2], SamplingParams(max_tokens=2, temperature=0.0))[0]
        assert out.prompt == "system:[Be brief.];user:[Hi][there];"
        assert "chat template content format: 'openai'" in caplog.text
