"""``--tool-call-parser pythonic`` on hand-written model texts, as vLLM's ``PythonicToolParser``
reads them: the whole answer a Python list of calls with literal keyword arguments, streamed at
every split point (and character by character) to the same calls as the non-streamed parse, the
name of a call before its arguments, whose fragments join to its ``json.dumps`` arguments."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest

from surge.server.chat_tools import ChatPlan
from surge.server.parsers import TOOL_PARSERS, ChatOutputParser, DeltaMessage, pythonic
from surge.server.parsers.pythonic import parse_calls

Calls = list[tuple[str, str]]


def _ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call-{next(counter)}"


def _parser() -> ChatOutputParser:
    return ChatOutputParser(None, TOOL_PARSERS["pythonic"](_ids()))


def _collect(deltas: list[DeltaMessage]) -> tuple[str, Calls]:
    content = "".join(d.content for d in deltas)
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for t in d.tool_calls:
            if t.name is not None:
                assert t.index not in calls and t.id == f"call-{t.index}", "a call opens once, with its id"
                calls[t.index] = [t.name, ""]
            assert t.index in calls, "the name comes before the arguments"
            calls[t.index][1] += t.arguments
    assert sorted(calls) == list(range(len(calls)))
    return content, [(name, args) for name, args in (calls[i] for i in sorted(calls))]


def _streamed(pieces: list[str]) -> tuple[tuple[str, Calls], str | None]:
    parser = _parser()
    deltas = [parser.feed(p) for p in pieces] + [parser.finish()]
    assert parser.tools is not None
    return _collect(deltas), parser.tools.malformed_text()


def _check(text: str) -> tuple[str, Calls]:
    """The non-streamed answer, after checking that every stream of ``text`` (split at each
    point, and character by character) gives it too."""
    whole = _collect([_parser().parse(text)])
    splits = [[text[:k], text[k:]] for k in range(len(text) + 1)] + [[*text]]
    for pieces in splits:
        assert _streamed(pieces) == (whole, None), pieces
    for _, args in whole[1]:
        assert isinstance(json.loads(args), dict)
    return whole


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ("[get_time()]", [("get_time", "{}")]),
        ("[get_weather(city='Paris')]", [("get_weather", '{"city": "Paris"}')]),
        (
            "[get_weather(city='Paris', unit=\"c\"), get_time()]",
            [("get_weather", '{"city": "Paris", "unit": "c"}'), ("get_time", "{}")],
        ),
        (
            "\n[get_weather( city = 'Zürich' , days=3 ,),\n  get_time(zone='UTC'),]\n",
            [("get_weather", '{"city": "Zürich", "days": 3}'), ("get_time", '{"zone": "UTC"}')],
        ),
        (
            "[get_time(),  # the time (first)\n get_weather(city='#1', # ) here\n)] # done",
            [("get_time", "{}"), ("get_weather", '{"city": "#1"}')],
        ),
    ],
    ids=["no-arguments", "one", "two", "spaces-and-trailing-commas", "comments"],
)
def test_a_list_of_calls(text: str, calls: Calls) -> None:
    assert _check(text) == ("", calls)
    assert parse_calls(text) == calls


def test_literal_arguments_nested_and_escaped() -> None:
    text = (
        "[search(filters={'tags': ['a', \"b\"], 'range': [1, -2.5, +3], 'n': None, 1: True}, "
        "strict=False, flags=[{'x': null, 'y': true, 'z': false}], "
        r"text='it\'s \"é\"\n\t\\ \x41\101\N{DIGIT ONE}\u00e9 \ud83d\ude00', raw=r'\d+\'', "
        "doc='''two\nlines ''quoted'' ''', joined='a' \"b\")]"
    )
    content, [(name, args)] = _check(text)
    assert content == "" and name == "search"
    assert json.loads(args) == {
        "filters": {"tags": ["a", "b"], "range": [1, -2.5, 3], "n": None, "1": True},
        "strict": False,
        "flags": [{"x": None, "y": True, "z": False}],
        "text": 'it\'s "é"\n\t\\ AA1é 😀',
        "raw": "\\d+\\'",
        "doc": "two\nlines ''quoted'' ",
        "joined": "ab",
    }
    # vLLM's form: json.dumps of the keyword arguments, non-ASCII kept
    assert args == json.dumps(json.loads(args), ensure_ascii=False)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("[write(text='''a\r\nb\r\n''')]", "a\nb\n"),
        ('[write(text=r"""a\r\nb\\\r\nc""")]', "a\nb\\\nc"),
        ("[write(text='''a\\\r\nb''')]", "ab"),  # a line continuation
        ("[write(text='''a\rb\r''')]", "a\nb\n"),
    ],
)
def test_a_crlf_in_a_triple_quoted_string_streams_as_one_newline(text: str, value: str) -> None:
    """Python reads a ``\\r\\n`` in a triple-quoted string as one newline: a stream split between
    the ``\\r`` and the ``\\n`` decoded each apart, two newlines, so the streamed arguments
    (``{"text": "a\\n\\nb``) were no prefix of the call's and never closed."""
    content, [(name, args)] = _check(text)
    assert content == "" and name == "write" and json.loads(args) == {"text": value}


@pytest.mark.parametrize(
    "text",
    [
        "The weather is nice.",
        "Sure: [get_time()]",  # text before the list
        "[1, 2, 3] are numbers",
        "[]",
        "[see(below)]",  # a positional argument before any keyword: no call opened
        "[get_weather(**{'city': 'Paris'})]",
        "[Paris](https://en.wikipedia.org/wiki/Paris)",
        "[get_time",  # cut before a call opened
        "",
        "  \n",
    ],
)
def test_text_that_is_not_a_call_list_is_content(text: str) -> None:
    assert _check(text) == (text, [])
    assert parse_calls(text) is None


@pytest.mark.parametrize(
    "text",
    [
        "[get_weather(city='Par",  # cut by max_tokens
        "[get_weather(city='Paris'), get_ti",
        "[get_weather(city='Paris')",
        "[get_weather(city=paris)]",  # a name, not a literal
        "[get_weather(city='Paris'.upper())]",
        "[get_weather(city='Paris', 3)]",
        "[get_weather(city='Paris', city='Rome')]",
        "[get_weather(city=b'Paris')]",
        "[get_weather(city=f'{x}')]",
        "[get_weather(days=(1, 2))]",
        "[get_weather(days={1, 2})]",
        "[get_weather(days=1e999)]",
        "[get_weather(city='\\ud83d')]",  # a lone surrogate
        "[get_weather(days=[1, 2)]",
        "[get_weather(city='Paris'), 42]",
        "[get_weather(city='Paris')] Done!",  # text after the list
        "[get_weather(city='Paris')]\n[get_time()]",
    ],
)
def test_a_malformed_call_list_is_content_when_not_streamed(text: str) -> None:
    """As vLLM's ``extract_tool_calls``: calls that do not parse make the whole answer content; a
    stream has already sent the call it opened (and cannot take it back)."""
    assert _collect([_parser().parse(text)]) == (text, [])
    assert parse_calls(text) is None
    for k in range(len(text) + 1):
        (content, calls), malformed = _streamed([text[:k], text[k:]])
        assert malformed == text and calls and calls[0][0] == "get_weather" and content == ""


def test_arguments_stream_as_they_are_written() -> None:
    """A string argument's text is released as it comes, an escape once it cannot grow (``\\1``
    may still become ``\\12``); other values once they end."""
    parser = _parser()
    released = []
    for piece in ["[get_weather(", "city='Pa", "ris\\1", "2", " x', days=1", "2", ")", "]"]:
        released.append([(t.name, t.arguments) for t in parser.feed(piece).tool_calls])
    assert released == [
        [],
        [("get_weather", ""), (None, '{"city": "Pa')],
        [(None, "ris")],
        [],
        [(None, '\\n x"')],
        [],
        [(None, ', "days": 12}')],
        [],
    ]
    joined = "".join(a for step in released for _, a in step)
    assert joined == '{"city": "Paris\\n x", "days": 12}'
    assert parser.finish().tool_calls == [] and parser.tools is not None
    assert parser.tools.malformed_text() is None


def _plan(single_call: bool = False) -> ChatPlan:
    return ChatPlan([{}], None, tool_parser=lambda: TOOL_PARSERS["pythonic"](_ids()), single_call=single_call)


TWO = "[get_weather(city='Paris'), get_time(zone='UTC')]"


def _stream_plan(plan: ChatPlan, text: str, finish: str) -> tuple[list[dict[str, Any]], str | None]:
    parser = plan.new_parser()
    deltas, reason = [], None
    pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
    for i, piece in enumerate(pieces):
        delta, reason = plan.delta(parser, piece, finish if i == len(pieces) - 1 else None)
        deltas.append(delta)
    return deltas, reason


def test_a_chat_message_and_stream_finish_as_tool_calls() -> None:
    msg, reason = _plan().message(TWO, "stop")
    assert reason == "tool_calls" and msg["content"] is None
    assert [c["function"] for c in msg["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"name": "get_time", "arguments": '{"zone": "UTC"}'},
    ]
    assert [c["id"] for c in msg["tool_calls"]] == ["call-0", "call-1"]
    deltas, reason = _stream_plan(_plan(), TWO, "stop")
    assert reason == "tool_calls" and not any(d.get("content") for d in deltas)
    # cut by max_tokens, or by a stop string: the engine's reason, and content when not streamed
    for finish in ("length", "stop"):
        msg, reason = _plan().message(TWO[:30], finish)
        assert reason == finish and msg == {"role": "assistant", "content": TWO[:30]}
        assert _stream_plan(_plan(), TWO[:30], finish)[1] == finish


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    msg, reason = _plan(single_call=True).message(TWO, "stop")
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_weather"] and reason == "tool_calls"
    deltas, _ = _stream_plan(_plan(single_call=True), TWO, "stop")
    names = [t["function"].get("name") for d in deltas for t in d.get("tool_calls", [])]
    assert [n for n in names if n] == ["get_weather"]


def test_the_server_takes_the_parser_name() -> None:
    from surge.cli import build_parser

    args = build_parser().parse_args(
        ["serve", "/m", "--enable-auto-tool-choice", "--tool-call-parser", "pythonic"]
    )
    assert args.tool_call_parser == "pythonic"


def test_a_long_string_argument_streams_without_rebuilding_the_arguments(monkeypatch) -> None:
    """Each piece of a string argument releases just its own text: the arguments text is not
    rebuilt (nor its keyword written again as JSON) at every piece, which made a long argument's
    stream quadratic (a 128,000-character one in 4-character pieces took 0.53 s)."""
    written: list[Any] = []
    json_text = pythonic.json_text
    monkeypatch.setattr(pythonic, "json_text", lambda value: written.append(value) or json_text(value))
    body = "ab" * 2000
    text = f"[f(a=1, text='{body}', b=[2])]"
    (content, calls), malformed = _streamed([text[i : i + 4] for i in range(0, len(text), 4)])
    assert (content, calls, malformed) == ("", [("f", json.dumps({"a": 1, "text": body, "b": [2]}))], None)
    assert len(written) < 20  # at every piece: over 1,000


@pytest.mark.parametrize("escape", ["\\N{", "\\x4", "\\12"])
def test_an_escape_is_read_a_bounded_number_of_characters_per_piece(escape: str, monkeypatch) -> None:
    """Whether the open string's last escape can still grow reads its first few characters (an
    ``\\N{`` escape's once, for its ``}``), not all the text after it at every piece: an
    ``'\\N{xxx...`` left open was read whole at every piece (quadratic: 128,000 characters took
    0.14 s)."""
    read = 0
    escape_done = pythonic._escape_done

    def counting(text: str) -> bool:
        nonlocal read
        read += len(text)
        return escape_done(text)

    monkeypatch.setattr(pythonic, "_escape_done", counting)
    text = f"[f(a='{escape}" + "x" * 8000 + "}')]"
    (content, calls), malformed = _streamed([text[i : i + 4] for i in range(0, len(text), 4)])
    if escape == "\\12":
        assert (content, calls, malformed) == ("", [("f", json.dumps({"a": "\n" + "x" * 8000 + "}"}))], None)
    else:  # not a string Python reads: the call is malformed
        assert malformed == text
    assert read <= 12 * (len(text) // 4), f"{read} characters read for {len(text) // 4} pieces"
