"""The chat plan with ``--reasoning-parser qwen3`` (and the hermes tool parser) on canned
outputs, with the real Qwen3 tokenizer: the parsers read the output as the grammar does
(with a grammar gated on ``</think>``, everything before it is reasoning, ``<think>`` or not),
so forced calls and ``response_format`` answers are only the text after ``</think>``; an
output without ``</think>`` reads as on the plain chat path; streamed deltas join to the message."""

from __future__ import annotations

import json
from typing import Any

import pytest

from surge.server.chat_tools import ChatPlan, plan_chat, prompt_closes_reasoning
from surge.server.protocol import ChatCompletionRequest
from surge.server.serving_responses import _output_items
from tests.conftest import STORIES
from tests.server.test_parsers import _pieces_by_token, _tokenizer

TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
    {"type": "function", "function": {"name": "noop"}},
]
MSGS = [{"role": "user", "content": "Time?"}]
NAMED = {"type": "function", "function": {"name": "get_time"}}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "t", "schema": TIME}}


def _plan(reasoning: str = "qwen3", tokenizer: Any = None, **fields: Any) -> ChatPlan:
    body = ChatCompletionRequest.model_validate({"messages": MSGS, **fields})
    return plan_chat(body, tokenizer or _tokenizer(), "hermes", reasoning)


def _streamed(plan: ChatPlan, text: str, finish: str) -> tuple[dict[str, Any], str | None, list[dict]]:
    """The message a client builds from the stream of ``text`` (token by token), the streamed
    finish reason and the deltas."""
    parser = plan.new_parser()
    pieces = _pieces_by_token(text)
    deltas, last = [], None
    for i, piece in enumerate(pieces):
        end = finish if i == len(pieces) - 1 else None
        delta, last = plan.delta(parser, piece, end)
        deltas.append(delta)
    msg: dict[str, Any] = {"role": "assistant", "content": None}
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        if "content" in d:
            msg["content"] = (msg["content"] or "") + d["content"]
        if "reasoning" in d:  # under both names, as vLLM's and DeepSeek's clients read it
            assert d["reasoning_content"] == d["reasoning"], d
            for key in ("reasoning", "reasoning_content"):
                msg[key] = msg.get(key, "") + d[key]
        assert ("reasoning" in d) == ("reasoning_content" in d), d
        for t in d.get("tool_calls", []):
            call = calls.setdefault(t["index"], {"id": t.get("id"), "type": "function", "function": {}})
            fn = call["function"]
            if "name" in t["function"]:
                fn["name"] = t["function"]["name"]
            fn["arguments"] = fn.get("arguments", "") + t["function"]["arguments"]
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg, last, deltas


def _both(plan: ChatPlan, text: str, finish: str = "stop") -> tuple[dict[str, Any], str | None]:
    """The non-streamed message and finish reason; the streamed ones must be the same (ids
    aside; with tool calls, streamed chunks may carry ``content: ""``, the message null)."""
    msg, reason = plan.message(text, finish)
    streamed, streamed_reason, _ = _streamed(plan, text, finish)
    streamed.setdefault("reasoning", None)
    streamed.setdefault("reasoning_content", None)
    if plan.forced:  # a forced tool_choice's message content is a string, "" for none (vLLM)
        streamed["content"] = streamed["content"] or ""
    elif "tool_calls" in streamed and streamed["content"] == "":
        streamed["content"] = None
    for a, b in zip(msg.get("tool_calls", []), streamed.get("tool_calls", []), strict=True):
        b["id"] = a["id"]
    assert (streamed, streamed_reason) == (msg, reason)
    return msg, reason


def _msg(content: str | None, reasoning: str | None) -> dict[str, Any]:
    """A message with its reasoning under both names (``reasoning``: vLLM's; ``reasoning_content``:
    DeepSeek's and vLLM's older one)."""
    return {"role": "assistant", "content": content, "reasoning": reasoning, "reasoning_content": reasoning}


def _think_end_id() -> int:
    return _tokenizer().convert_tokens_to_ids("</think>")


@pytest.mark.parametrize("think", ["", "<think>\n"])
def test_required_calls_after_reasoning(think: str) -> None:
    plan = _plan(tools=TOOLS, tool_choice="required")
    assert plan.structured_outputs is not None
    assert plan.structured_outputs.reasoning_end_token_id == _think_end_id()
    text = think + 'The zone is UTC.</think>\n\n[{"name": "get_time", "parameters": {"zone": "UTC"}}]'
    msg, finish = _both(plan, text)
    assert finish == "tool_calls"
    assert msg["content"] == "" and msg["reasoning_content"].strip() == "The zone is UTC."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == [
        ("get_time", {"zone": "UTC"})
    ]


def test_named_call_arguments_are_the_json_after_reasoning() -> None:
    plan = _plan(tools=TOOLS, tool_choice=NAMED)
    msg, finish = _both(plan, 'UTC or CET? UTC.</think>\n\n{"zone": "UTC"}')
    assert finish == "stop" and msg["reasoning_content"] == "UTC or CET? UTC."
    (call,) = msg["tool_calls"]
    assert call["function"] == {"name": "get_time", "arguments": '\n\n{"zone": "UTC"}'}  # as vLLM


def test_response_format_answer_is_the_json_after_reasoning() -> None:
    plan = _plan(response_format=JSON_SCHEMA)
    msg, _ = _both(plan, 'Say UTC.</think>\n{"zone": "UTC"}')
    assert msg == _msg('\n{"zone": "UTC"}', "Say UTC.")


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": TOOLS, "tool_choice": "required"},
        {"tools": TOOLS, "tool_choice": NAMED},
        {"response_format": JSON_SCHEMA},
    ],
)
def test_output_that_never_closes_think_reads_as_the_plain_chat_path(fields: dict[str, Any]) -> None:
    """Cut by ``max_tokens`` (or ended) before any ``</think>``: the grammar never started, so
    the message is the plain chat path's, streamed or not, and has no calls: all reasoning
    (``content`` null, ``""`` under a forced tool_choice; no streamed delta carries ``content``),
    ``<think>`` or not, as vLLM 0.26's qwen3 parser starts inside the reasoning; all content
    after a prompt that closed the reasoning, where the grammar applies from the first token."""
    tok = _tokenizer()
    closed_prompt = tok.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    text = 'Thinking about [{"name": "get_time"'
    for finish in ("length", "stop"):
        for thought in (text, "<think>" + text):
            plan, plain = _plan(**fields), _plan()
            msg, reason = _both(plan, thought, finish)
            none = "" if plan.forced else None  # a forced tool_choice's empty answer is "" (vLLM)
            assert msg == _msg(none, text) and reason == finish
            assert (msg | {"content": None}, reason) == _both(plain, thought, finish)
            _, _, deltas = _streamed(plan, thought, finish)
            assert not any("content" in d for d in deltas), deltas
        plain = _plan()
        plain.see_prompt(tok, closed_prompt)
        assert _both(plain, text, finish)[0] == _msg(text, None)


def test_the_output_starts_inside_the_reasoning_unless_the_prompt_closed_it() -> None:
    """vLLM 0.26's qwen3 parser starts inside the reasoning whenever thinking is on: a Qwen3
    "Thinking-2507" template ends the prompt with ``<think>\n`` and the model writes
    ``X</think>Y`` (reasoning X, answer Y), and the stock template's prompt has neither tag, so
    the same holds there (an output that never writes ``</think>`` is all reasoning). A prompt
    that closed the reasoning (its last ``</think>`` after its last ``<think>``: a template that
    turns thinking off writes ``<think>\n\n</think>\n\n``) starts in the answer, as vLLM's
    stream reads the prompt (``is_reasoning_end``); an output's own ``<think>`` still opens it.
    Surge used to read ``X</think>Y`` as all content, ``</think>`` kept, unless the prompt ended
    with ``<think>``."""
    tok = _tokenizer()
    text = "Paris.</think>\n\nParis"
    thinking_2507 = tok.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n")
    stock = tok.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    closed_prompt = tok.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_closes_reasoning(tok, thinking_2507) and not prompt_closes_reasoning(tok, stock)
    assert prompt_closes_reasoning(tok, closed_prompt)
    for prompt in (thinking_2507, stock, None):
        plan = _plan()
        if prompt is not None:
            plan.see_prompt(tok, prompt)
        assert _both(plan, text)[0] == _msg("\n\nParis", "Paris.")
        assert _both(plan, "cut", "length")[0] == _msg(None, "cut")
        assert _both(plan, "<think>Hmm</think>Paris")[0] == _msg("Paris", "Hmm")
    closed = _plan()
    closed.see_prompt(tok, closed_prompt)
    assert _both(closed, text)[0] == _msg(text, None)
    assert _both(closed, "<think>Hmm</think>Paris")[0] == _msg("Paris", "Hmm")
    # a tool call inside the reasoning ends it (vLLM 0.26's qwen3 parser): the call is parsed
    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    msg, finish = _both(_plan(tools=TOOLS), "Need the time.\n" + call)
    assert finish == "tool_calls" and msg["reasoning"] == "Need the time.\n" and msg["content"] is None
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_time"]
    # enable_thinking false: no parser at all, the output is plain content
    off = _plan(chat_template_kwargs={"enable_thinking": False})
    off.see_prompt(tok, closed_prompt)
    assert _both(off, text)[0] == _msg(text, None)


def test_a_grammar_after_a_prompt_that_closed_the_reasoning_applies_from_the_first_token() -> None:
    """vLLM's chat decides ``reasoning_ended`` from the prompt: after a prompt that closed the
    reasoning, a grammar applies from the first token (not after a ``</think>``), and the
    answer is the constrained text; after one that did not, it waits for ``</think>``."""
    tok = _tokenizer()
    closed = _plan(response_format=JSON_SCHEMA)
    closed.see_prompt(tok, tok.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n"))
    assert closed.structured_outputs is not None and closed.structured_outputs.reasoning_end_token_id is None
    assert not closed.reasoning_gated
    assert _both(closed, '{"zone": "UTC"}')[0] == _msg('{"zone": "UTC"}', None)
    waits = _plan(response_format=JSON_SCHEMA)
    waits.see_prompt(tok, tok.encode("<|im_start|>assistant\n"))
    assert waits.structured_outputs is not None
    assert waits.structured_outputs.reasoning_end_token_id == _think_end_id()


@pytest.mark.parametrize("content", ["<think>\nLet me", [{"type": "text", "text": "<think>\nLet me"}]])
def test_a_continued_message_with_an_open_think_continues_the_reasoning(content: Any) -> None:
    """``continue_final_message`` on an assistant message that opened ``<think>`` without
    closing it: the model continues the reasoning, so its output is reasoning up to
    ``</think>`` (vLLM's ``is_reasoning_end`` on the prompt; it was all content, with the tag in
    it). A continued message whose reasoning is closed (the stock template renders one without
    reasoning after an empty think block) is continued as the answer."""
    tok = _tokenizer()
    text = " more.</think>\n\nParis"

    def plan(final: Any, prompt: str) -> ChatPlan:
        msgs = [*MSGS, {"role": "assistant", "content": final}]
        body = ChatCompletionRequest.model_validate(
            {"messages": msgs, "continue_final_message": True, "add_generation_prompt": False}
        )
        p = plan_chat(body, tok, "hermes", "qwen3")
        p.see_prompt(tok, tok.encode("<|im_start|>assistant\n" + prompt))
        return p

    assert _both(plan(content, "<think>\nLet me"), text)[0] == _msg("\n\nParis", " more.")
    # the stock template renders a continued answer after an empty think block: the prompt closed it
    closed = "<think>\nHm\n</think>\n\nThe"
    assert _both(plan("<think>\nHm</think>\n\nThe", closed), " end")[0] == _msg(" end", None)
    assert _both(plan("The", "<think>\n\n</think>\n\nThe"), text)[0]["content"] == text


def test_answer_after_think_end_is_unstripped_streamed_and_not() -> None:
    """Qwen3 writes ``</think>\n\n``: the message's content starts with ``"\n\n"`` (vLLM's
    partition) and the streamed content deltas join to it; an answer of whitespace alone is
    that whitespace, and only an output that ends at ``</think>`` has ``content: null``."""
    plan = _plan()
    text = "<think>\nThe capital of France.\n</think>\n\nParis."
    msg, _ = _both(plan, text)
    assert msg == _msg("\n\nParis.", "\nThe capital of France.\n")
    _, _, deltas = _streamed(plan, text, "stop")
    assert "".join(d.get("content", "") for d in deltas) == msg["content"]
    assert _both(plan, "<think>Hmm</think>\n\n")[0]["content"] == "\n\n"
    assert plan.message("<think>Hmm</think>", "stop")[0]["content"] is None


def test_grammar_from_the_first_token_means_no_reasoning_first() -> None:
    """A tokenizer without a one-token ``</think>`` (stories): the grammar applies from the
    first token, so even ``deepseek_r1`` (which starts inside the reasoning) reads the
    output as the answer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(STORIES))
    plan = _plan("deepseek_r1", tok, response_format=JSON_SCHEMA)
    assert plan.structured_outputs is not None and plan.structured_outputs.reasoning_end_token_id is None
    assert plan.message('{"zone": "UTC"}', "stop")[0]["content"] == '{"zone": "UTC"}'
    plain = _plan("deepseek_r1", tok)
    assert plain.message("never ends", "stop")[0]["reasoning_content"] == "never ends"


def test_an_empty_answer_after_the_reasoning_is_null() -> None:
    """Generation that stops right after ``</think>`` answers ``content: null``, as vLLM's
    parsers give it (streamed, the final chunk may carry ``content: ""``, as with tool calls);
    without a reasoning parser an empty output stays ``""``."""
    plan = _plan()
    msg = plan.message("<think>just thinking</think>", "stop")[0]
    assert msg == _msg(None, "just thinking")
    assert plan.message("", "stop")[0]["content"] is None
    assert _plan(None).message("", "stop")[0]["content"] == ""
    tools_only = _plan(None, tools=TOOLS)  # a tool parser that found no call: the text as it is
    assert tools_only.message("", "stop")[0] == {"role": "assistant", "content": ""}


def test_whitespace_next_to_tool_calls_is_no_answer() -> None:
    """Qwen3 writes ``</think>\n\n<tool_call>...``: with the call, the non-streamed ``content`` is
    null, as vLLM 0.26's parse gives it (it drops an answer of whitespace alone next to calls;
    it was ``"\n\n"``); streamed, the whitespace comes as it is, as in vLLM. Other text stays,
    and so does whitespace alone without a call."""
    plan = _plan(tools=TOOLS)
    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    for text in ("<think>\nUTC.\n</think>\n\n" + call, "\n\n" + call, " \n" + call + "\n"):
        msg, finish = plan.message(text, "stop")
        assert msg["content"] is None and finish == "tool_calls", (text, msg)
        assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_time"]
        streamed, _, _ = _streamed(plan, text, "stop")
        assert streamed["content"] in (None, "") or streamed["content"].isspace()
    assert plan.message("<think>UTC.</think>\n\nSure. " + call, "stop")[0]["content"] == "\n\nSure. "
    assert plan.message("<think>UTC.</think>\n\n", "stop")[0]["content"] == "\n\n"
    # the Responses API's unstreamed answer too: vLLM 0.26 parses it as chat's (``Parser.parse``),
    # so its output is the reasoning and the call, with no ``message`` item of "\n\n" (Surge's
    # had one, which the openai SDK's ``response.output_text`` read as the answer)
    responses = plan.message("<think>UTC.</think>\n\n" + call, "stop", as_streamed=True)[0]
    assert responses["content"] is None, responses
    assert [item["type"] for item in _output_items(responses, None)] == ["reasoning", "function_call"]
    text_too = plan.message("<think>UTC.</think>\n\nSure. " + call, "stop", as_streamed=True)[0]
    assert text_too["content"] == "\n\nSure. "


def test_reasoning_effort_is_passed_to_the_template_as_vllm_does() -> None:
    """``reasoning_effort`` (OpenAI's field, which vLLM honours): the template gets it as a
    variable and Qwen3's ``enable_thinking`` switch, off for ``"none"`` (then the parser is off
    too: everything is content), on for any other effort; ``chat_template_kwargs`` win. An
    effort outside OpenAI's values is refused by name."""
    tok = _tokenizer()
    body = ChatCompletionRequest.model_validate({"messages": MSGS, "reasoning_effort": "none"})
    assert body.template_kwargs == {"reasoning_effort": "none", "enable_thinking": False}
    off = plan_chat(body, tok, "hermes", "qwen3")
    assert not off.reasoning and off.message("<think>Hmm</think>Hi", "stop")[0] == _msg(
        "<think>Hmm</think>Hi", None
    )
    high = _plan(reasoning_effort="high")
    assert high.reasoning and high.message("<think>Hmm</think>Hi", "stop")[0] == _msg("Hi", "Hmm")
    both = {"messages": MSGS, "reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}
    assert ChatCompletionRequest.model_validate(both).template_kwargs == {
        "reasoning_effort": "none",
        "enable_thinking": True,
    }
    assert ChatCompletionRequest.model_validate({"messages": MSGS}).template_kwargs is None
    with pytest.raises(ValueError, match="reasoning_effort"):
        ChatCompletionRequest.model_validate({"messages": MSGS, "reasoning_effort": "extreme"})


def test_include_reasoning_false_parses_the_reasoning_out_and_drops_it() -> None:
    """vLLM's ``include_reasoning: false``: the answer is what it would be, the reasoning is
    not returned (null fields; no streamed delta carries it, so a delta of reasoning alone is
    empty and its chunk is not sent)."""
    plan = _plan(include_reasoning=False)
    text = "<think>\nThe capital of France.\n</think>\n\nParis."
    msg, _ = _both(plan, text)
    assert msg == _msg("\n\nParis.", None)
    _, _, deltas = _streamed(plan, text, "stop")
    assert not any("reasoning" in d or "reasoning_content" in d for d in deltas), deltas
    assert _both(plan, "<think>cut", "length")[0] == _msg(None, None)
    assert _plan().message(text, "stop")[0] == _msg("\n\nParis.", "\nThe capital of France.\n")


def test_include_reasoning_false_constrains_from_the_first_token() -> None:
    """With a grammar and ``include_reasoning: false`` the grammar applies from the first token
    (no free reasoning before it), as vLLM's ``resolve_reasoning_ended`` decides: the whole
    output is the constrained answer."""
    gated = _plan(response_format=JSON_SCHEMA)
    assert (
        gated.structured_outputs is not None
        and gated.structured_outputs.reasoning_end_token_id == _think_end_id()
    )
    plan = _plan(response_format=JSON_SCHEMA, include_reasoning=False)
    assert plan.structured_outputs is not None and plan.structured_outputs.reasoning_end_token_id is None
    assert not plan.reasoning_gated and plan.starts_in_reasoning is False
    assert _both(plan, '{"zone": "UTC"}')[0] == _msg('{"zone": "UTC"}', None)
    forced = _plan(tools=TOOLS, tool_choice="required", include_reasoning=False)
    assert forced.structured_outputs is not None and forced.structured_outputs.reasoning_end_token_id is None


@pytest.mark.parametrize("reasoning", [None, "qwen3"])
def test_a_forced_tool_choice_answers_an_empty_string(reasoning: str | None) -> None:
    """vLLM 0.26's chat completion gives a forced ``tool_choice`` (``"required"`` or named) a
    string ``content`` (``content or ""``): ``""`` next to the calls, after a reasoning, and when
    ``max_tokens`` cut the output before any call's name was complete (it was null with calls or
    a reasoning parser). ``auto`` keeps null next to calls, and the Responses API's parse
    (``as_streamed``) keeps null (no ``message`` item)."""
    think = "" if reasoning is None else "R</think>"
    call = '[{"name": "get_time", "parameters": {"zone": "UTC"}}]'
    for choice, text, finish in (
        ("required", call, "stop"),
        ("required", '[{"name": "get_t', "length"),
        ("required", "", "length"),
        (NAMED, '{"zone": "UTC"}', "stop"),
        (NAMED, "", "length"),
    ):
        plan = _plan(reasoning, tools=TOOLS, tool_choice=choice)
        msg, _ = plan.message(think + text, finish)
        assert msg["content"] == "", (choice, text, msg)
        assert ("tool_calls" in msg) == (text.endswith("}") or text.endswith("]")), msg
        if "tool_calls" in msg:
            assert plan.message(think + text, finish, as_streamed=True)[0]["content"] is None
    auto = _plan(reasoning, tools=TOOLS)
    hermes = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    assert auto.message(("<think>" + think if think else "") + hermes, "stop")[0]["content"] is None


def test_deepseek_r1_empty_reasoning_is_an_empty_string_not_null() -> None:
    """vLLM 0.26's deepseek_r1 parser answers ``partition("</think>")``: an output that starts
    with ``</think>`` (or ``<think></think>``) has reasoning ``""`` in a non-streamed message (it
    was null); a stream sends no reasoning delta for it, as vLLM's skips the lone ``</think>``.
    qwen3's parser answers ``reasoning or None``: null. The Responses API has no reasoning item."""
    r1 = _plan("deepseek_r1")
    for text in ("</think>Paris", "<think></think>Paris", "\n<think></think>Paris"):
        assert r1.message(text, "stop")[0] == _msg("Paris", ""), text
        _, _, deltas = _streamed(r1, text, "stop")
        assert not any("reasoning" in d for d in deltas), deltas
    assert r1.message("", "length")[0] == _msg(None, "")  # vLLM: ("", None)
    assert _plan("qwen3").message("</think>Paris", "stop")[0] == _msg("Paris", None)
    responses = r1.message("</think>Paris", "stop", as_streamed=True)[0]
    assert [item["type"] for item in _output_items(responses, None)] == ["message"]
    assert _plan("deepseek_r1", include_reasoning=False).message("</think>Paris", "stop")[0] == _msg(
        "Paris", None
    )


def test_qwen3_whitespace_alone_before_think_end_is_the_reasoning() -> None:
    """vLLM 0.26's qwen3 parser starts in its reasoning state and strips nothing: an output
    ``"\n</think>..."`` has reasoning ``"\n"``, streamed (its delta) and not (it was null: the
    whitespace before a leading ``</think>`` was dropped), with ``<think>`` first or not; only
    an empty reasoning is null."""
    plan = _plan()
    assert _both(plan, "\n</think>\n\nParis")[0] == _msg("\n\nParis", "\n")
    assert _both(plan, "<think>\n</think>\n\nParis")[0] == _msg("\n\nParis", "\n")
    assert _both(plan, "\n<think>\n\n</think>Paris")[0] == _msg("Paris", "\n\n\n")
    assert _both(plan, "<think></think>Paris")[0] == _msg("Paris", None)
