"""Tool-call and reasoning parsers on canned model texts, streamed token by token (Qwen3's
byte-level BPE tokenizer) and in random pieces: the joined deltas equal the non-streamed result,
a call's name comes before its arguments, and the argument fragments join to valid JSON."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from transformers import AutoTokenizer

from surge.server.chat_tools import ChatPlan, plan_chat
from surge.server.parsers import REASONING_PARSERS, TOOL_PARSERS, ChatOutputParser, DeltaMessage
from surge.server.parsers.forced import NamedToolParser, RequiredToolParser
from surge.server.protocol import ChatCompletionRequest
from tests.conftest import QWEN3_8B_DIR, qwen3_8b_dir_or_skip

Result = tuple[str, str, list[tuple[str, str]]]


def _ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call-{next(counter)}"


def _collect(deltas: list[DeltaMessage]) -> Result:
    content = "".join(d.content for d in deltas)
    reasoning = "".join(d.reasoning for d in deltas)
    calls: dict[int, list[str]] = {}
    ids: dict[int, str] = {}
    for d in deltas:
        for t in d.tool_calls:
            if t.name is not None:
                assert t.index not in calls, "a call is named once"
                assert t.id is not None
                calls[t.index] = [t.name, ""]
                ids[t.index] = t.id
            assert t.index in calls, "the name comes before the arguments"
            calls[t.index][1] += t.arguments
    assert sorted(calls) == list(range(len(calls)))
    assert len(set(ids.values())) == len(ids)
    return content, reasoning, [(name, args) for name, args in (calls[i] for i in sorted(calls))]


def _pieces_by_token(text: str) -> list[str]:
    qwen3_8b_dir_or_skip()
    tok = _tokenizer()
    ids = tok.encode(text, add_special_tokens=False)
    pieces, prev = [], ""
    for i in range(len(ids)):
        cur = tok.decode(ids[: i + 1])
        if cur.endswith("\ufffd"):
            continue
        pieces.append(cur[len(prev) :])
        prev = cur
    pieces.append(text[len(prev) :])
    assert "".join(pieces) == text
    return pieces


_TOK: list[object] = []


def _tokenizer():  # type: ignore[no-untyped-def]
    if not _TOK:
        _TOK.append(AutoTokenizer.from_pretrained(str(QWEN3_8B_DIR), local_files_only=True))
    return _TOK[0]


def _random_pieces(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 7)
        out.append(text[i : i + n])
        i += n
    return out


def _check(make: Callable[[], ChatOutputParser], text: str) -> Result:
    whole = _collect([make().parse(text)])
    for pieces in [_pieces_by_token(text), [*text]] + [_random_pieces(text, s) for s in range(5)]:
        parser = make()
        deltas = [parser.feed(p) for p in pieces] + [parser.finish()]
        assert _collect(deltas) == whole
    for _, args in whole[2]:
        json.loads(args)
    return whole


def _parser(
    tools: str | None = None, reasoning: str | None = None, starts_in_reasoning: bool | None = None
) -> Callable[[], ChatOutputParser]:
    def make() -> ChatOutputParser:
        ids = _ids()
        return ChatOutputParser(
            REASONING_PARSERS[reasoning](starts_in_reasoning) if reasoning else None,
            TOOL_PARSERS[tools](ids) if tools else None,
        )

    return make


HERMES_TWO = (
    "Let me check both.\n\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Zürich}", "opts": {"unit": "c", "days": [1, 2]}}}\n'
    "</tool_call>\n<tool_call>\n"
    '{"name": "get_time", "arguments": {}}\n</tool_call>\n'
)


CALL_ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'


def test_hermes_two_calls_and_content() -> None:
    content, reasoning, calls = _check(_parser("hermes"), HERMES_TWO)
    assert content == "Let me check both.\n\n"
    assert reasoning == ""
    assert calls == [
        ("get_weather", '{"city": "Zürich}", "opts": {"unit": "c", "days": [1, 2]}}'),
        ("get_time", "{}"),
    ]


@pytest.mark.parametrize(
    ("text", "content"),
    [
        (CALL_ADD + "\nDone.\n", ""),
        ("hello " + CALL_ADD + " mid " + CALL_ADD + " end", "hello "),
        (CALL_ADD + "\n \n" + CALL_ADD + "\n", ""),
        (" \n" + CALL_ADD + " after <tool_c", " \n"),
    ],
)
def test_hermes_text_after_a_call_is_dropped(text: str, content: str) -> None:
    """vLLM 0.26's hermes parser answers only the text before the first ``<tool_call>`` as
    content: text between and after calls is dropped (non-streamed it slices the answer there;
    streamed it never sends past the tag). Surge kept it ("hello  mid  end"), streamed or not."""
    result = _check(_parser("hermes"), text)
    assert result[0] == content and [name for name, _ in result[2]] == ["add"] * text.count("<tool_call>")


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("Use <tool> tags, or <tool_c and more.", "Use <tool> tags, or <tool_c and more."),
        ("<tool_call>not json</tool_call> after", "<tool_call>not json</tool_call> after"),
        ("Unfinished <tool_call>", "Unfinished <tool_call>"),
    ],
)
def test_hermes_text_that_is_not_a_call_is_content(text: str, content: str) -> None:
    assert _check(_parser("hermes"), text) == (content, "", [])


def test_hermes_arguments_before_name_and_cut_call() -> None:
    text = '<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>'
    assert _check(_parser("hermes"), text)[2] == [("f", '{"x": 1}')]
    cut = '<tool_call>\n{"name": "f", "arguments": {"x": [1, 2'
    parser = _parser("hermes")()
    out = _collect([parser.feed(cut), parser.finish()])
    assert out[2] == [("f", '{"x": [1, 2')]  # max_tokens cut, streamed: what was generated
    assert _collect([_parser("hermes")().parse(cut)]) == (cut, "", [])  # not streamed: content


@pytest.mark.parametrize(
    "answer",
    [
        '<tool_call>\n{"name": "f", "arguments": {"x":',  # cut by max_tokens
        "Sure. <tool_call>",  # cut right after the tag
        '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>\n<tool_call>{"name": "g", "argu',
        '<tool_call>{"name": "f", "arguments": {"x": 1}</tool_call>',  # the outer object is not closed
        '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>not json</tool_call>',
        # a string never closed: the tag inside it ends no block, and the JSON does not parse
        '<tool_call>{"name": "f", "arguments": {"x": "a}</tool_call> after',
    ],
)
def test_hermes_malformed_call_is_content_when_not_streamed(answer: str) -> None:
    """As vLLM's non-streamed hermes parser: when a call's JSON does not parse, the whole answer
    is content and there are no tool calls (arguments a client's json.loads would choke on never
    come back); the reasoning stays apart."""
    assert _collect([_parser("hermes")().parse(answer)]) == (answer, "", [])
    text = "<think>Call f.</think>\n\n" + answer
    # the answer after </think> keeps its leading whitespace (vLLM)
    assert _collect([_parser("hermes", "qwen3")().parse(text)]) == ("\n\n" + answer, "Call f.", [])


def test_hermes_cut_after_a_complete_call_is_a_call() -> None:
    # max_tokens cut right after the JSON, before </tool_call>: the JSON parses, so it is a call
    text = 'Sure. <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n'
    assert _check(_parser("hermes"), text) == ("Sure. ", "", [("f", '{"x": 1}')])


ECHO_ARGS = '{"text": "a </tool_call> b"}'
ECHO = '<tool_call>{"name": "echo", "arguments": ' + ECHO_ARGS + "}</tool_call>"


@pytest.mark.parametrize(
    ("text", "args", "content"),
    [
        (ECHO, ECHO_ARGS, ""),
        (  # escaped quotes and backslashes before and after the tag, then text after the call
            'Sure. <tool_call>\n{"name": "echo", "arguments": {"text": "\\"</tool_call>\\\\", '
            '"n": ["</tool_call>"]}}\n</tool_call> Done.',
            '{"text": "\\"</tool_call>\\\\", "n": ["</tool_call>"]}',
            "Sure. ",
        ),
        (  # the tag and its start inside the string, a call without a closing tag (cut after its JSON)
            '<tool_call>{"name": "echo", "arguments": {"text": "</tool_call></tool_"}}',
            '{"text": "</tool_call></tool_"}',
            "",
        ),
    ],
)
def test_hermes_a_closing_tag_inside_a_string_argument_stays_in_it(
    text: str, args: str, content: str
) -> None:
    """``</tool_call>`` inside a JSON string of the call (an argument's text) ended the block
    there: the call was cut to ``{"text": "a `` (the whole answer then content, not streamed; a
    broken call and the rest as content, streamed). The block ends at the first tag outside a
    JSON string: one call with its whole arguments, streamed in pieces of any size or not."""
    whole = _collect([_parser("hermes")().parse(text)])
    assert whole == (content, "", [("echo", args)])
    for seed in range(40):
        parser = _parser("hermes")()
        deltas = [parser.feed(p) for p in _random_pieces(text, seed)] + [parser.finish()]
        streamed = _collect(deltas)
        assert len(streamed[2]) == 1 and streamed[2][0][1] == args, (seed, streamed)
        assert streamed == whole and json.loads(streamed[2][0][1]) == json.loads(args)
    assert _check(_parser("hermes"), text) == whole  # by the model's tokens too (with its tokenizer)


def test_llama3_json_calls_and_content() -> None:
    text = '<|python_tag|>{"name": "f", "parameters": {"a": 1, "s": "x;y}"}}; {"name": "g", "parameters": {}}'
    assert _check(_parser("llama3_json"), text) == ("", "", [("f", '{"a": 1, "s": "x;y}"}'), ("g", "{}")])
    assert _check(_parser("llama3_json"), ' {"name": "f", "parameters": {"a": 1}}')[2] == [("f", '{"a": 1}')]
    # a trailing ";" (or several): calls streamed and not streamed alike (it was content when not streamed)
    for tail in (";", "; ", ";\n;"):
        answer = '{"name": "f", "parameters": {"a": 1}}' + tail
        assert _check(_parser("llama3_json"), answer) == ("", "", [("f", '{"a": 1}')])
    assert _check(_parser("llama3_json"), "Hello {there}") == ("Hello {there}", "", [])
    assert _check(_parser("llama3_json"), '{"not": "a call"}') == ('{"not": "a call"}', "", [])


@pytest.mark.parametrize(
    "answer",
    [
        '{"name": "f", "parameters": {"a":',  # cut by max_tokens
        '<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "param',
        '{"name": "f", "parameters": {"a": 1}} and then some text',
    ],
)
def test_llama3_json_malformed_calls_are_content_when_not_streamed(answer: str) -> None:
    """As vLLM's non-streamed llama3_json parser: calls that do not parse make the whole answer
    content, with no tool calls."""
    assert _collect([_parser("llama3_json")().parse(answer)]) == (answer, "", [])


def test_reasoning_parsers() -> None:
    qwen3 = _parser(reasoning="qwen3")
    # the answer is all the text after </think>, as vLLM's partition gives it
    assert _check(qwen3, "<think>\nThe capital.\n</think>\n\nParis.") == (
        "\n\nParis.",
        "\nThe capital.\n",
        [],
    )
    assert _check(qwen3, "Paris, no thinking.") == ("Paris, no thinking.", "", [])
    assert _check(qwen3, "<think>cut short") == ("", "cut short", [])
    r1 = _parser(reasoning="deepseek_r1")
    assert _check(r1, "Hmm, France.</think>Paris") == ("Paris", "Hmm, France.", [])
    assert _check(r1, "<think>Hmm</think>\nParis") == ("\nParis", "Hmm", [])
    assert _check(r1, "never ends") == ("", "never ends", [])


def test_qwen3_reads_think_end_as_vllm_0_26() -> None:
    """vLLM 0.26's qwen3 parser starts inside the reasoning and drops a ``</think>`` it meets in
    the answer: an output that starts with ``</think>`` has an empty reasoning, and every later
    ``</think>`` leaves the answer; DeepSeek-R1's ``partition`` keeps them as text."""
    qwen3 = _parser(reasoning="qwen3")
    assert _check(qwen3, "</think></think></think></think>") == ("", "", [])
    assert _check(qwen3, "</think></think>Paris</think>.") == ("Paris.", "", [])
    assert _check(qwen3, "\n</think>\n\n</think>Paris") == ("\n\nParis", "", [])
    assert _check(qwen3, "<think>Hmm.</think>\n\n</think>Paris </thi") == ("\n\nParis </thi", "Hmm.", [])
    assert _check(qwen3, "</thin") == ("</thin", "", [])  # not the tag: the answer
    parser = qwen3()
    pieces = [parser.feed(p) for p in ["</think>", "</think>", "Par", "is <", "/think>."]] + [parser.finish()]
    assert [d.content for d in pieces] == ["", "", "Par", "is ", ".", ""]
    assert parser.reasoning is not None and parser.reasoning.reasoning_ended
    r1 = _parser(reasoning="deepseek_r1")
    assert _check(r1, "</think></think>Paris") == ("</think>Paris", "", [])


def test_qwen3_drops_think_end_left_to_right_however_the_stream_splits() -> None:
    """The text on both sides of a dropped ``</think>`` never joins into a new tag: the answer
    ``<</think>/think>`` is ``</think>`` as vLLM's lexer reads it left to right, streamed in
    any pieces (a ``<`` held as a possible tag start used to meet ``/think>`` after the
    dropped tag, and the stream lost a ``</think>`` the whole answer kept)."""
    text = "<think>a</think>b<</think>/think>c"
    qwen3 = _parser(reasoning="qwen3")
    assert _check(qwen3, text) == ("b</think>c", "a", [])
    for pieces in (["<think>a</think>b<", "</think>/think>c"], ["<think>a</think>b<</think>", "/think>c"]):
        parser = qwen3()
        deltas = [parser.feed(p) for p in pieces] + [parser.finish()]
        assert _collect(deltas) == ("b</think>c", "a", [])


@pytest.mark.parametrize(
    ("text", "qwen3", "deepseek_r1"),
    [
        # whitespace before </think> is the reasoning (qwen3 dropped it: a null reasoning)
        ("\n</think>Paris", ("Paris", "\n", []), ("Paris", "\n", [])),
        ("\n\n</think>\n\nParis", ("\n\nParis", "\n\n", []), ("\n\nParis", "\n\n", [])),
        ("<think>\n\n</think>\n\nParis", ("\n\nParis", "\n\n", []), ("\n\nParis", "\n\n", [])),
        # qwen3 drops every <think> inside the reasoning, keeping the whitespace before one
        ("\n<think>\nHmm</think>Hi", ("Hi", "\n\nHmm", []), ("Hi", "\nHmm", [])),
        ("<think>a<think>b</think>c", ("c", "ab", []), ("c", "a<think>b", [])),
        # deepseek_r1: None where vLLM's two paths differ (text before a first <think>)
        ("a<think>b<th", ("", "ab<th", []), None),
        ("<th<think>ink>.</think><think>", ("<think>", "<think>.", []), None),
    ],
)
def test_an_output_that_starts_inside_the_reasoning_reads_as_vllm_0_26(
    text: str, qwen3: Result, deepseek_r1: Result | None
) -> None:
    """As the chat plan starts it (inside the reasoning): vLLM 0.26's qwen3 parser starts in its
    reasoning state, where every ``<think>`` is dropped and everything else, leading whitespace
    included, is reasoning up to ``</think>`` (``"\n</think>Hi"`` has reasoning ``"\n"``;
    Surge stripped the whitespace before a leading tag and kept a second ``<think>``);
    deepseek_r1's ``partition`` drops only a leading ``<think>`` (with the whitespace before it).
    Streamed in any pieces as not."""
    assert _check(_parser(reasoning="qwen3", starts_in_reasoning=True), text) == qwen3
    if deepseek_r1 is not None:
        assert _check(_parser(reasoning="deepseek_r1", starts_in_reasoning=True), text) == deepseek_r1


@pytest.mark.parametrize("reasoning", ["qwen3", "deepseek_r1"])
def test_the_answer_keeps_the_whitespace_after_think_end(reasoning: str) -> None:
    """vLLM's parsers answer ``model_output.partition("</think>")[2]``: Qwen3's ``</think>\n\n``
    leaves ``"\n\n"`` at the start of the answer, streamed (in any pieces) as not streamed,
    also when nothing else follows."""
    make = _parser(reasoning=reasoning)
    assert _check(make, "<think>\nHmm.\n</think>\n\nParis.\n") == ("\n\nParis.\n", "\nHmm.\n", [])
    assert _check(make, "<think>Hmm.</think>\n\n") == ("\n\n", "Hmm.", [])
    assert _check(make, "<think>Hmm.</think> \t") == (" \t", "Hmm.", [])
    parser = make()
    pieces = [parser.feed(p) for p in ["<think>Hmm.</think>", "\n", "\n", "Paris."]] + [parser.finish()]
    assert [d.content for d in pieces] == ["", "\n", "\n", "Paris.", ""]


def test_reasoning_then_hermes_call() -> None:
    text = "<think>I need the weather.</think>\n\n" + HERMES_TWO
    content, reasoning, calls = _check(_parser("hermes", "qwen3"), text)
    assert reasoning == "I need the weather."
    assert content == "\n\nLet me check both.\n\n"
    assert [name for name, _ in calls] == ["get_weather", "get_time"]


def test_forced_required_and_named() -> None:
    text = '[{"name": "f", "parameters": {"a": [1, {"b": 2}]}}, {"name": "g", "parameters": {}}]'

    def required() -> ChatOutputParser:
        return ChatOutputParser(None, RequiredToolParser(_ids()))

    assert _check(required, text) == ("", "", [("f", '{"a": [1, {"b": 2}]}'), ("g", "{}")])

    def named() -> ChatOutputParser:
        return ChatOutputParser(None, NamedToolParser("f", _ids()))

    assert _check(named, '{"a": 1}') == ("", "", [("f", '{"a": 1}')])


@pytest.mark.parametrize(
    ("answer", "calls"),
    [
        ('[{"nam', []),
        (
            '[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {"b": "x',
            [("f", '{"a": 1}'), ("g", '{"b": "x')],
        ),
        ('[{"name": "f", "parameters": {"a": 1}}, {"na', [("f", '{"a": 1}')]),
    ],
)
@pytest.mark.parametrize("lead", ["", "Weather.</think>\n\n"])
def test_required_calls_cut_short_read_the_same_streamed_and_not(
    answer: str, calls: list[tuple[str, str]], lead: str
) -> None:
    """``max_tokens`` or a stop string cut the ``required`` array: not streamed, the answer is
    the calls the stream sends (the last with the arguments written so far), not the array's
    text as content (which a stream never sent); text before a call's name is complete opens no
    call; after a reasoning, the reasoning stays apart."""
    make = _forced("required") if lead else (lambda: ChatOutputParser(None, RequiredToolParser(_ids())))
    text = lead + answer
    whole = _collect([make().parse(text)])
    assert whole[1:] == ("Weather." if lead else "", calls)
    for pieces in ([text], [*text], *(_random_pieces(text, s) for s in range(3))):
        parser = make()
        assert _collect([parser.feed(p) for p in pieces] + [parser.finish()]) == whole


@pytest.mark.parametrize(
    ("kind", "answer"),
    [
        ("hermes", 'Sure. <tool_call>\n{"name": "f", "arguments": {"a": "x'),
        ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": tru}}\n</tool_call>'),
        ("hermes", "<tool_call>\n{bad}\n</tool_call>"),
        ("llama3_json", '{"name": "f", "parameters": {"a": '),
        ("named", '{"a": "x'),
    ],
)
@pytest.mark.parametrize("finish", ["stop", "length"])
def test_a_message_as_streamed_is_the_joined_stream(kind: str, answer: str, finish: str) -> None:
    """``as_streamed`` (the Responses API's unstreamed answer): calls that do not parse stay the
    calls the stream sent, where chat's unstreamed answer is the raw text (vLLM's)."""
    plan = _plan(kind)
    msg, reason = plan.message(answer, finish, as_streamed=True)
    for pieces in ([answer], _random_pieces(answer, 1)):
        deltas, streamed_reason = _stream(plan, pieces, finish)
        content = "".join(d.get("content") or "" for d in deltas)
        calls: dict[int, list[str]] = {}
        for d in deltas:
            for t in d.get("tool_calls") or ():
                calls.setdefault(t["index"], ["", ""])
                calls[t["index"]][0] += t["function"].get("name") or ""
                calls[t["index"]][1] += t["function"].get("arguments") or ""
        assert (msg["content"] or "", reason) == (content, streamed_reason)
        got = [[c["function"]["name"], c["function"]["arguments"]] for c in msg.get("tool_calls") or ()]
        assert got == [calls[i] for i in sorted(calls)]


def _required() -> ChatOutputParser:
    return ChatOutputParser(None, RequiredToolParser(_ids()))


@pytest.mark.parametrize(
    ("make", "answer"),
    [
        (_required, '[{"name": "f", "parameters": {}}, {"name": "g", "'),
        (_required, '[{"name": "g",'),
        (_required, '[{"name": "g", "para'),
        (_parser("hermes"), '<tool_call>\n{"name": "g", "arguments": '),  # before that key: content
        (_parser("llama3_json"), '{"name": "g", "parameters": '),  # before that key: content
    ],
)
def test_a_streamed_call_cut_after_its_name_has_no_made_up_arguments(
    make: Callable[[], ChatOutputParser], answer: str
) -> None:
    """``max_tokens`` cut a call after its name, before its arguments: streamed, the call's
    arguments are what was generated of them (nothing), not a ``{}`` that parses as a complete
    call without arguments (and need not validate against the tool's schema)."""
    for pieces in ([answer], [*answer]):
        parser = make()
        calls = _collect([parser.feed(p) for p in pieces] + [parser.finish()])[2]
        assert calls[-1] == ("g", "")
    # a closed call without arguments is still a call with none (not for hermes: content)
    assert _check(_required, '[{"name": "g"}]')[2] == [("g", "{}")]


def test_named_call_cut_by_max_tokens_stays_the_call() -> None:
    """A named call's arguments cut by ``max_tokens`` stay the call's, non-streamed as streamed
    (vLLM's answer; the finish reason says "length"); after a reasoning, the reasoning stays apart."""
    answer = '{"city"'
    assert _collect([ChatOutputParser(None, NamedToolParser("f", _ids())).parse(answer)]) == (
        "",
        "",
        [("f", answer)],
    )
    text = "Weather.</think>\n\n" + answer
    assert _collect([_forced("named")().parse(text)]) == ("", "Weather.", [("f", "\n\n" + answer)])


def _forced(kind: str) -> Callable[[], ChatOutputParser]:
    """qwen3 reasoning, then a forced ``tool_choice`` (``"required"`` or the named ``f``), as
    the chat plan of a thinking request builds it: the grammar waits for ``</think>`` and the
    output starts inside the reasoning."""
    tools = [{"type": "function", "function": {"name": name}} for name in ("f", "g")]
    choice = "required" if kind == "required" else {"type": "function", "function": {"name": "f"}}
    return _planned({"tools": tools, "tool_choice": choice})


def _planned(fields: dict[str, Any]) -> Callable[[], ChatOutputParser]:
    """The output parser the chat plan (``plan_chat``, ``--reasoning-parser qwen3``, the real
    Qwen3 tokenizer) builds for a request with ``fields``, whose grammar waits for ``</think>``."""
    qwen3_8b_dir_or_skip()
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Hi"}], **fields})
    plan = plan_chat(body, _tokenizer(), None, "qwen3")
    assert plan.reasoning_gated and plan.starts_in_reasoning

    def make() -> ChatOutputParser:
        parser = plan.new_parser()
        assert parser is not None
        return parser

    return make


@pytest.mark.parametrize(("think", "lead"), [("", ""), ("<think>", ""), ("\n<think>\n", "\n\n")])
def test_forced_calls_after_reasoning_without_or_with_think(think: str, lead: str) -> None:
    """A grammar gated on ``</think>`` makes the output reasoning up to it, whether or not the
    model wrote ``<think>`` (the template may have put it in the prompt; a random model skips
    it): the forced calls are parsed from the text after ``</think>`` only, and stay JSON. The
    ``<think>`` is dropped and the whitespace around it kept, as vLLM 0.26's qwen3 parser reads it."""
    reasoning = "Weather first, then the time.\n"
    required = (
        think
        + reasoning
        + '</think>\n\n[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {}}]'
    )
    calls = [("f", '{"a": 1}'), ("g", "{}")]
    assert _check(_forced("required"), required) == ("", lead + reasoning, calls)
    named = think + reasoning + '</think>\n\n{"a": [1, "</think>"]}'
    # the arguments are the text after </think>, its whitespace first (vLLM's named call)
    args = '\n\n{"a": [1, "</think>"]}'
    assert _check(_forced("named"), named) == ("", lead + reasoning, [("f", args)])


@pytest.mark.parametrize("kind", ["required", "named"])
def test_forced_call_whose_reasoning_never_ends(kind: str) -> None:
    """Cut (or stopped) before ``</think>``: no call, and the text reads as on the plain chat
    path: all reasoning and no answer, ``<think>`` or not."""
    text = "Still thinking about [{"
    plain = _parser(reasoning="qwen3", starts_in_reasoning=True)  # the plain chat path
    for cut in (text, "<think>" + text):
        assert _check(_forced(kind), cut) == ("", text, []) == _check(plain, cut)
        parser = _forced(kind)()
        parser.parse(cut)
        assert parser.in_reasoning and not parser.has_tool_calls


def test_a_gated_reasoning_streams_as_it_comes() -> None:
    """Streamed under a grammar that waits for ``</think>``, the reasoning is released as it
    comes (only a possible start of ``</think>`` is held), then the call after ``</think>``."""
    parser = _forced("named")()
    assert _collect([parser.feed("Weather")]) == ("", "Weather", [])
    assert _collect([parser.feed(" first.</thi")]) == ("", " first.", [])
    assert _collect([parser.feed('nk>{"a": 1}')]) == ("", "", [("f", '{"a": 1}')])


def test_a_tool_call_inside_a_gated_reasoning_stays_reasoning() -> None:
    """Under a grammar that waits for the ``</think>`` token, a ``<tool_call>`` written inside the
    reasoning does not end it (it does without a grammar, as vLLM 0.26's qwen3 parser reads it):
    the parser agrees with the grammar, which starts only after ``</think>``, so the forced calls
    are the JSON after it (docs/structured-outputs.md says why vLLM's rule is not followed)."""
    inner = 'Call f.<tool_call>\n{"name": "f"}\n</tool_call>'
    text = inner + '</think>[{"name": "g", "parameters": {}}]'
    assert _check(_forced("required"), text) == ("", inner, [("g", "{}")])


def test_a_gate_needs_an_output_that_starts_inside_the_reasoning() -> None:
    """A grammar gated on ``</think>`` is planned only for an output that starts inside the
    reasoning; a parser asked to read one that does not is refused, not guessed at."""
    with pytest.raises(ValueError, match="starts inside the reasoning"):
        REASONING_PARSERS["qwen3"](gated=True)
    with pytest.raises(ValueError, match="starts inside the reasoning"):
        REASONING_PARSERS["deepseek_r1"](False, gated=True)
    assert REASONING_PARSERS["deepseek_r1"](gated=True).in_reasoning is False  # starts there


def test_json_answer_after_reasoning_without_think() -> None:
    """``response_format`` with a reasoning parser: the content is the JSON after ``</think>``;
    an output that never writes it is all reasoning, as without the grammar."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    gated = _planned(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}}
    )
    assert _check(gated, 'Hmm.</think>\n{"a": 1}') == ('\n{"a": 1}', "Hmm.", [])
    assert _check(gated, "Hmm, cut") == ("", "Hmm, cut", [])
    # a grammar from the first token (no single-token </think>): the output is the answer
    ungated = _parser(reasoning="deepseek_r1", starts_in_reasoning=False)
    assert _check(ungated, '{"a": 1}') == ('{"a": 1}', "", [])
    assert _check(gated, "<think>Hmm</think>Paris") == ("Paris", "Hmm", [])
    # the prompt opened <think>: reasoning until </think>, as deepseek_r1, closed or not
    opened = _parser(reasoning="qwen3", starts_in_reasoning=True)
    assert _check(opened, "Hmm</think>Paris") == ("Paris", "Hmm", [])
    assert _check(opened, "Hmm, cut") == ("", "Hmm, cut", [])


def _plan(kind: str, single_call: bool = False) -> ChatPlan:
    if kind == "named":
        return ChatPlan([{}], None, tool_parser=lambda: NamedToolParser("f", _ids()), single_call=single_call)
    return ChatPlan([{}], None, tool_parser=lambda: TOOL_PARSERS[kind](_ids()), single_call=single_call)


def _stream(plan: ChatPlan, pieces: list[str], finish: str) -> tuple[list[dict], str | None]:
    parser = plan.new_parser()
    deltas, reason = [], None
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        delta, reason = plan.delta(parser, piece, finish if last else None)
        deltas.append(delta)
    return deltas, reason


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        ("named", '{"zone": "'),
        ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {"zone": "'),
        ("hermes", '<tool_call>\n{"name": "get_time", '),
    ],
)
def test_a_call_cut_by_a_stop_string_keeps_stop(kind: str, text: str) -> None:
    """A stop string cut the call: streamed, the finish reason was "tool_calls" with arguments
    that do not parse (a client loop would run them); now "stop", as the message says too (a
    named call keeps its cut arguments as the call; an auto parser's text is content)."""
    msg, reason = _plan(kind).message(text, "stop")
    if kind == "named":  # the cut arguments stay the call's (vLLM), streamed or not
        assert reason == "stop" and msg["tool_calls"][0]["function"] == {
            "name": "f",
            "arguments": text,
        }
    else:
        assert reason == "stop" and "tool_calls" not in msg
    _, streamed = _stream(_plan(kind), [text[:5], text[5:]], "stop")
    assert streamed == "stop"
    whole = (
        '{"zone": "UTC"}' if kind == "named" else '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    )
    finished = "stop" if kind == "named" else "tool_calls"  # a named tool_choice keeps "stop"
    assert _plan(kind).message(whole, "stop")[1] == finished
    assert _stream(_plan(kind), [whole], "stop")[1] == finished


@pytest.mark.parametrize("finish", ["stop", "length"])
def test_only_auto_and_required_calls_finish_as_tool_calls(finish: str) -> None:
    """OpenAI and vLLM: complete ``auto`` and ``required`` calls finish with "tool_calls", a
    forced named function with the engine's reason ("stop"), streamed and not."""
    required = '[{"name": "f", "parameters": {}}]'
    plans = {
        "named": (_plan("named"), '{"zone": "UTC"}', finish),
        "hermes": (
            _plan("hermes"),
            '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>',
            "tool_calls",
        ),
        "required": (
            ChatPlan([{}], None, tool_parser=lambda: RequiredToolParser(_ids())),
            required,
            "tool_calls",
        ),
    }
    for plan, text, expected in plans.values():
        expected = finish if finish == "length" else expected
        msg, reason = plan.message(text, finish)
        assert msg["tool_calls"] and reason == expected
        for cut in (len(text), 4):
            assert _stream(plan, [text[:cut], text[cut:]], finish)[1] == expected


def test_a_named_call_opens_with_its_first_argument_text() -> None:
    """An answer with no argument text (max_tokens 1 spent on </think>) has no call, not a call
    whose arguments are "" (which no client can parse)."""
    msg, reason = _plan("named").message("", "length")
    assert "tool_calls" not in msg and reason == "length"
    msg, reason = _plan("named").message("", "stop")
    assert "tool_calls" not in msg and reason == "stop"
    assert _stream(_plan("named"), [""], "stop") == ([{"content": ""}], "stop")
    msg, _ = _plan("named").message(" ", "length")  # whitespace is not JSON either
    assert "tool_calls" not in msg and msg["content"] == " "
    # streamed alike: held, then content (it was a call whose arguments were " ")
    deltas, reason = _stream(_plan("named"), [" ", "\n"], "length")
    assert (
        all("tool_calls" not in d for d in deltas) and "".join(d.get("content", "") for d in deltas) == " \n"
    )
    # leading whitespace becomes the arguments' first fragment once the JSON starts
    deltas, _ = _stream(_plan("named"), ["\n", '{"a"', ": 1}"], "stop")
    args = [t["function"]["arguments"] for d in deltas for t in d.get("tool_calls", [])]
    assert "".join(args) == '\n{"a": 1}' and _plan("named").message('\n{"a": 1}', "stop")[1] == "stop"


def test_parallel_tool_calls_false_keeps_the_first_call_under_auto() -> None:
    """As vLLM's maybe_filter_parallel_tool_calls: streamed and not, only index 0."""
    msg, reason = _plan("hermes", single_call=True).message(HERMES_TWO, "stop")
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_weather"] and reason == "tool_calls"
    deltas, _ = _stream(_plan("hermes", single_call=True), _random_pieces(HERMES_TWO, 0), "stop")
    names = [
        t["function"].get("name")
        for d in deltas
        for t in d.get("tool_calls", [])
        if t["function"].get("name")
    ]
    assert names == ["get_weather"]
    assert len(_plan("hermes").message(HERMES_TWO, "stop")[0]["tool_calls"]) == 2


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        ("named", '{"zone": "UTC"}'),
        ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'),
    ],
)
def test_a_streamed_delta_has_one_entry_per_call(kind: str, text: str) -> None:
    """A chunk that opens a call and carries its first argument text (or a whole call) has one
    ``tool_calls`` entry for it, with the id, the name and the text, as vLLM streams it: a client
    reading ``delta.tool_calls[0].function.arguments`` must not lose the first fragment."""
    for cut in (len(text), 3, 20):
        deltas, _ = _stream(_plan(kind), [text[:cut], text[cut:]], "stop")
        entries = [t for d in deltas for t in d.get("tool_calls", [])]
        for d in deltas:
            indices = [t["index"] for t in d.get("tool_calls", [])]
            assert len(indices) == len(set(indices)), d
        assert entries[0]["id"] and entries[0]["function"]["name"] in ("f", "get_time")
        assert "".join(t["function"]["arguments"] for t in entries) == '{"zone": "UTC"}'


DEEP = "[" * 3000  # nested past the depth of Python's JSON parser (a RecursionError, not a ValueError)


@pytest.mark.parametrize(
    ("kind", "answer"),
    [
        ("required", '[{"name": "f", "parameters": {"a": ' + DEEP),
        ("required", '[{"name": "f", "parameters": {"a": ' + DEEP + "]" * 3000 + "}}]"),
        ("named", '{"a": ' + DEEP),
        ("named", '{"a": ' + DEEP + "]" * 3000 + "}"),
        ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": ' + DEEP + "]" * 3000 + "}}\n</tool_call>"),
        ("hermes", '<tool_call>\n{"arguments": {"a": ' + DEEP + "]" * 3000 + '}, "name": "f"}\n</tool_call>'),
        ("llama3_json", '{"name": "f", "parameters": {"a": ' + DEEP + "]" * 3000 + "}}"),
        ("llama3_json", '{"name": "f", "parameters": {"a": ' + DEEP),
    ],
    ids=[
        "required-cut",
        "required",
        "named-cut",
        "named",
        "hermes",
        "hermes-name-last",
        "llama3",
        "llama3-cut",
    ],
)
@pytest.mark.parametrize("finish", ["stop", "length"])
def test_arguments_nested_past_the_json_parser_are_parsed_as_cut_json(
    kind: str, answer: str, finish: str
) -> None:
    """A model can write arguments nested deeper than ``json`` parses (a client's ``logit_bias``
    on ``[``, with ``tool_choice: "required"`` over an array parameter, made the tiny Qwen3 write
    1,700 of them): the answer is read as JSON that does not parse (cut), never a
    RecursionError, which was a 500 for a non-streamed chat completion and a stream cut off
    without its end (chat and Responses)."""
    plan = (
        ChatPlan([{}], None, tool_parser=lambda: RequiredToolParser(_ids()))
        if kind == "required"
        else _plan(kind)
    )
    message, _ = plan.message(answer, finish)
    calls = message.get("tool_calls") or []
    assert (message["content"] or "") + "".join(c["function"]["arguments"] for c in calls) != ""
    for pieces in ([answer], _random_pieces(answer, 0)):
        deltas, _ = _stream(plan, pieces, finish)
        streamed = "".join(d.get("content") or "" for d in deltas) + "".join(
            t["function"].get("arguments") or "" for d in deltas for t in d.get("tool_calls") or ()
        )
        assert DEEP in streamed


@pytest.mark.parametrize("kind", ["required", "llama3_json"])
def test_a_raw_control_character_in_a_string_argument_does_not_hide_the_calls_end(kind: str) -> None:
    """xgrammar's own grammar let a string with ``maxLength`` hold a raw tab (Surge's grammar
    has kept it out since session 60; a model's unconstrained text still may): a
    tiny Qwen3 under ``tool_choice: "required"`` wrote ``{"city": "')<TAB>eval˟"}``. The call
    scanner's strict JSON decoder failed on the tab, never found the call's end, and gave the
    array's closing ``}]`` to the arguments, streamed and not. The arguments are now the
    object the model wrote, and the strict check still decides the finish reason (a raw tab is
    not JSON for ``json.loads``): "stop", not "tool_calls"."""
    arguments = '{"city": "a\tb"}'
    if kind == "required":
        text = f'[{{"name": "f", "parameters": {{"a": 1}}}}, {{"name": "g", "parameters": {arguments}}}]'
        plan = ChatPlan([{}], None, tool_parser=lambda: RequiredToolParser(_ids()))
    else:
        text = f'{{"name": "f", "parameters": {{"a": 1}}}}; {{"name": "g", "parameters": {arguments}}}'
        plan = _plan(kind)
    calls = [("f", '{"a": 1}'), ("g", arguments)]
    for pieces in ([text], [*text], *(_random_pieces(text, s) for s in range(3))):
        deltas, reason = _stream(plan, pieces, "stop")
        streamed: dict[int, list[str]] = {}
        for d in deltas:
            for t in d.get("tool_calls") or ():
                entry = streamed.setdefault(t["index"], ["", ""])
                entry[0] += t["function"].get("name") or ""
                entry[1] += t["function"].get("arguments") or ""
        assert [tuple(v) for _, v in sorted(streamed.items())] == calls
        assert reason == "stop"
    message, reason = plan.message(text, "stop")
    if kind == "required":  # a forced call keeps its calls, as the stream sent them
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == calls
    else:  # an auto call whose JSON does not parse is the raw text, as in vLLM
        assert message["content"] == text and not message.get("tool_calls")
    assert reason == "stop"


@pytest.mark.parametrize(
    "answer",
    [
        '{"name": "Bob", "age": 3}',  # a JSON answer of a request with tools
        '{"name": "f"}',
        '{"age": 3, "name": "Bob"}',
        '{"name": "f", "parameters": {"a": 1}}; {"name": "Bob", "age": 3}',
    ],
)
def test_llama3_json_an_object_without_parameters_is_no_call(answer: str) -> None:
    """vLLM 0.26's llama3_json parser needs ``parameters`` (or ``arguments``) in a call object
    (``obj["parameters"]``; its ``KeyError`` makes the whole answer content): a Llama answering
    in JSON, with tools offered, wrote ``{"name": "Bob", "age": 3}``, which Surge returned as a
    call of a function ``Bob`` with ``{}`` arguments, streamed and not. It is content now, and a
    stream opens no call for it (the name waits for the arguments' key)."""
    make = _parser("llama3_json")
    assert _collect([make().parse(answer)]) == (answer, "", [])
    if answer.startswith('{"name": "f", "parameters"'):
        return  # the first call was streamed before the second object showed it is none
    for pieces in ([answer], [*answer], *(_random_pieces(answer, s) for s in range(3))):
        parser = make()
        assert _collect([parser.feed(p) for p in pieces] + [parser.finish()]) == (answer, "", [])


@pytest.mark.parametrize(
    "answer",
    [
        '<tool_call>{"name": "f"}</tool_call>',
        'Sure. <tool_call>\n{"name": "f"}\n</tool_call>\n',
        '<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>',
        '<tool_call>{"parameters": {"x": 1}, "name": "f"}</tool_call>',
        '<tool_call>{"name": "f", "x": 1}</tool_call>',
        '<tool_call>\n{"name": "f", "argu',  # cut before the key is whole
    ],
)
def test_hermes_a_call_without_arguments_is_content(answer: str) -> None:
    """vLLM 0.26's hermes parser reads ``call["arguments"]``: a block without that key (none,
    or ``"parameters"``) makes its non-streamed answer all content, with no calls (Surge called
    ``f`` with ``{}``, or with the parameters). Streamed, the name waits for the key, so no call
    opens and the text is content too."""
    assert _check(_parser("hermes"), answer) == (answer, "", [])
    assert _check(_parser("hermes"), '<tool_call>{"arguments": {}, "name": "f"}</tool_call>')[2] == [
        ("f", "{}")
    ]


def _extent_cases() -> list[str]:
    """JSON objects and arrays whose strings hold brackets, quotes, escapes and tags."""
    return [
        '{"a": 1}',
        '[1, [2, {"b": "]}"}], "\\\\"]',
        '{"s": "a \\" } ] { [ b", "t": "\\\\\\"", "u": "\\u005d"}',
        '{"name": "f", "arguments": {"x": [{"y": "<\\/tool_call>"}], "z": "}}}"}}',
        '{"deep": ' + "[" * 40 + "]" * 40 + "}",
    ]


@pytest.mark.parametrize("text", _extent_cases())
def test_json_extent_finds_the_parsers_end_in_any_pieces(text: str) -> None:
    """JsonExtent, fed a growing text in random pieces (a backslash may end a piece), ends the
    value where json's own parser does, and only once the closing bracket has come."""
    from surge.server.parsers.base import JsonExtent

    whole = "  " + text + ' , {"next": 1}'
    _, want = json.JSONDecoder().raw_decode(whole, 2)
    rng = random.Random(len(text))
    for _ in range(30):
        extent, size = JsonExtent(2), 2
        while size < len(whole):
            size = min(len(whole), size + rng.randint(1, 4))
            got = extent.scan(whole[:size])
            assert got == (want if size >= want else None)


@pytest.mark.parametrize("inside", ["", "abc", '\\"', "\\\\", 'a \\" } ] <\\/x> \\u005d b', '\\\\\\"'])
def test_json_string_end_ends_a_string_where_json_does_in_any_pieces(inside: str) -> None:
    """``json_string_end`` (the string reading shared by JsonExtent and the hermes block scan),
    resumed where it stopped as the text grows in random pieces (a backslash may end a piece),
    closes the string just past the quote where json's own parser ends it, and never earlier."""
    from surge.server.parsers.base import json_string_end

    text = '"' + inside + '", "next"]'
    want = json.JSONDecoder().raw_decode(text)[1]
    rng = random.Random(len(inside))
    for _ in range(30):
        i, size, closed = 1, 1, False
        while not closed:
            size = min(len(text), size + rng.randint(1, 4))
            i, closed = json_string_end(text, i, size)
            assert i <= size and (closed or size < want)
        assert i == want


def test_json_extent_closes_invalid_json_for_good() -> None:
    """A value whose brackets close but that does not parse ends there: no later text fixes it."""
    from surge.server.parsers.base import JsonExtent

    extent = JsonExtent(0)
    assert extent.scan('{"a": ]') == len('{"a": ]')
    assert extent.scan('{"a": ]}') == len('{"a": ]')


@pytest.mark.parametrize(
    ("parser", "template"),
    [
        ("hermes", '<tool_call>\n{{"name": "run", "arguments": {args}}}\n</tool_call>'),
        ("llama3_json", '{{"name": "run", "parameters": {args}}}'),
    ],
)
def test_streamed_json_call_is_parsed_once_not_per_token(
    parser: str, template: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long call streamed in 4-character pieces is parsed as JSON a bounded number of times,
    not once per piece (that made a 32,000-character call cost the API process 0.3-0.5 s of CPU,
    quadratic in its length), and its streamed arguments still join to the call's."""
    from surge.server.parsers import base

    args = json.dumps({"code": "x = [1, {2: '}'}]\n" * 400, "n": [1, 2, 3]})
    text = template.format(args=args)
    calls = 0
    real = base._DECODER

    class Counting(json.JSONDecoder):
        def raw_decode(self, s: str, idx: int = 0) -> tuple[Any, int]:
            nonlocal calls
            calls += 1
            return real.raw_decode(s, idx)

    monkeypatch.setattr(base, "_DECODER", Counting())
    p = TOOL_PARSERS[parser](_ids())
    deltas = [p.feed(text[i : i + 4]) for i in range(0, len(text), 4)]
    deltas.append(p.finish())
    content, _, got = _collect(deltas)
    assert got == [("run", args)] and content.strip() == ""
    assert calls <= 4, f"{calls} JSON parses for {len(text) // 4} pieces"


@pytest.mark.parametrize(
    ("parser", "template"),
    [
        ("hermes", '<tool_call>\n{{"name": "run", "arguments": {args}}}\n</tool_call>'),
        (
            "llama3_json",
            '<|python_tag|>{{"name": "run", "parameters": {args}}};{{"name": "b", "parameters": {{}}}}',
        ),
    ],
)
def test_streamed_json_call_releases_each_piece_without_the_whole_call(
    parser: str, template: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a long call streams, a piece's release reads that piece, not the call's arguments
    so far: the text handed to the whole-text release (``JsonToolCall._release``, which compares
    it with all that was released) is the call's once, not at every piece (quadratic: a
    128,000-character call took 0.21-0.28 s of the API process's CPU). Its arguments, released as
    they come, still join to the call's."""
    from surge.server.parsers import base

    args = json.dumps({"code": "x = [1, {2: '}'}]  <\n" * 400, "n": [1, 2, 3]})
    text = template.format(args=args)
    compared = 0
    release = base.JsonToolCall._release

    def counting(self: base.JsonToolCall, upto: str, out: list[base.ToolCallDelta]) -> None:
        nonlocal compared
        compared += len(upto)
        release(self, upto, out)

    monkeypatch.setattr(base.JsonToolCall, "_release", counting)
    p = TOOL_PARSERS[parser](_ids())
    deltas = [p.feed(text[i : i + 4]) for i in range(0, len(text), 4)]
    pieces = sum(bool(t.arguments) for d in deltas for t in d.tool_calls)
    deltas.append(p.finish())
    content, _, got = _collect(deltas)
    assert got[0] == ("run", args) and content.strip() == ""
    assert pieces > len(args) // 8  # the arguments streamed as they came
    assert compared <= 2 * len(args) + 10, f"{compared} characters compared for {len(args)}"


@pytest.mark.parametrize(
    ("kind", "name"),
    [("reasoning", "qwen3"), ("reasoning", "deepseek_r1"), ("tools", "pythonic"), ("tools", "llama3_json")],
)
def test_an_output_of_white_space_alone_is_read_once(
    kind: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parser that decides on the output's first non-space character reads a long run of white
    space once over the stream (``skip_space`` from where it stopped), not stripped whole at every
    piece (quadratic: 128,000 characters of it took 0.7 s of the API process's CPU). What it
    releases is unchanged: the white space, as content (or reasoning) at the end."""
    from surge.server.parsers import base, llama3_json, pythonic, reasoning

    read = 0

    def counting(text: str, i: int) -> int:
        nonlocal read
        j = base.skip_space(text, i)
        read += j - i + 1
        return j

    for module in (reasoning, pythonic, llama3_json):
        monkeypatch.setattr(module, "skip_space", counting)
    parser = REASONING_PARSERS[name]() if kind == "reasoning" else TOOL_PARSERS[name](_ids())
    text = " \n\t\n" * 2000
    released = [parser.feed(text[i : i + 4]) for i in range(0, len(text), 4)] + [parser.finish()]
    if kind == "reasoning":
        assert "".join(r + c for r, c in released) == text
    else:
        assert _collect(released)[0] == text
    assert read <= 2 * len(text), f"{read} characters read for {len(text)}"
