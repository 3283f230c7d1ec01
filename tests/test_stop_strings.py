"""The stop-string automaton against a plain search, and its cost with long stop lists."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from surge.stop_strings import StopAutomaton


def _reference(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[str], str | None]:
    """The former algorithm: search the unreleased text for every stop string, hold back prefixes."""
    out: list[str] = []
    pending = ""
    for piece in pieces:
        buf = pending + piece
        at, matched = -1, None
        for s in stops:
            i = buf.find(s)
            if i >= 0 and (at < 0 or i < at):
                at, matched = i, s
        if matched is not None:
            out.append(buf[:at])
            return out, matched
        hold = 0
        for s in stops:
            for k in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:k]):
                    hold = k
                    break
        out.append(buf[: len(buf) - hold])
        pending = buf[len(buf) - hold :]
    return out, None


def _automaton(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[str], str | None]:
    a = StopAutomaton(stops)
    out: list[str] = []
    pending, state = "", 0
    for piece in pieces:
        buf = pending + piece
        state, match = a.feed(state, piece)
        if match is not None:
            out.append(buf[: len(pending) + match.start])
            return out, match.stop
        hold = a.held_back(state)
        out.append(buf[: len(buf) - hold])
        pending = buf[len(buf) - hold :]
    return out, None


@settings(max_examples=400, deadline=None)
@given(
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=5), min_size=1, max_size=6),
    pieces=st.lists(st.text(alphabet="abcd", max_size=6), max_size=12),
)
def test_automaton_equals_plain_search(stops: list[str], pieces: list[str]) -> None:
    assert _automaton(tuple(stops), pieces) == _reference(tuple(stops), pieces)


def test_examples() -> None:
    assert _automaton(("abcd", "bc"), ["abcd"]) == ([""], "abcd")  # earliest start wins
    assert _automaton(("ab", "a"), ["xab"]) == (["x"], "ab")  # same start: first listed wins
    assert _automaton(("a", "ab"), ["xab"]) == (["x"], "a")
    assert _automaton(("hello",), ["he", "llo world"]) == (["", ""], "hello")
    assert _automaton(("hello",), ["he", "y"]) == (["", "hey"], None)


def test_cost_does_not_grow_with_the_list() -> None:
    """Feeding text costs about the same with 1 and with 10,000 stop strings (the old loop was O(list))."""
    text = "once upon a time there was a little girl named lily. " * 40

    def feed_time(stops: tuple[str, ...]) -> float:
        a = StopAutomaton(stops)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            state = 0
            for i in range(0, len(text), 4):
                state, match = a.feed(state, text[i : i + 4])
                assert match is None
            best = min(best, time.perf_counter() - t0)
        return best

    few = feed_time(("zzzz",))
    many = feed_time(tuple(f"q{i:05d}zz" for i in range(10_000)) + ("lily!",))
    assert many < 20 * few + 0.01, (few, many)
