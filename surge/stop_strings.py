"""Stop-string matching whose cost per character does not depend on the number of stop strings.

An Aho-Corasick automaton (A. V. Aho and M. J. Corasick, "Efficient string matching: an aid to
bibliographic search", CACM 18(6), 1975) over a request's stop strings, fed the decoded text
incrementally. Its state after any text is the longest suffix of that text which is a prefix of
some stop string, which is exactly the text a streaming detokenizer must hold back; a stop
string ends at a position when the state there (or one of its suffix links) is a whole string.

Libraries such as ``pyahocorasick`` search a whole string but do not expose the state between
pieces of a stream, which the hold-back needs; the automaton is small enough to keep here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class StopMatch:
    """A stop string found in fed text.

    Attributes:
        start: offset of its first character in the text fed since :meth:`StopAutomaton.feed`'s
            ``state`` was the root, counted from the start of the piece passed to that call
            (negative when it began in earlier, held-back text).
        stop: the stop string.
    """

    start: int
    stop: str


class StopAutomaton:
    """An immutable Aho-Corasick automaton over stop strings (shared by a request's choices).

    Build it with :meth:`build` (cached per stop list). States are ints; 0 is the root.
    Per fed character the cost is amortized O(1), whatever the number of stop strings.

    Args:
        stops: the stop strings (empty strings are ignored; duplicates keep their first index).
    """

    __slots__ = ("stops", "_goto", "_fail", "_depth", "_match_len", "_match_index")

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        goto: list[dict[str, int]] = [{}]
        depth = [0]
        own: list[int] = [-1]  # index of the stop string ending exactly at this node, or -1
        for i, s in enumerate(self.stops):
            node = 0
            for ch in s:
                nxt = goto[node].get(ch)
                if nxt is None:
                    nxt = len(goto)
                    goto[node][ch] = nxt
                    goto.append({})
                    depth.append(depth[node] + 1)
                    own.append(-1)
                node = nxt
            if own[node] < 0:
                own[node] = i
        fail = [0] * len(goto)
        # longest stop string that is a suffix of the node's string (0 = none), and its index
        match_len = [depth[n] if own[n] >= 0 else 0 for n in range(len(goto))]
        match_index = list(own)
        queue: deque[int] = deque(goto[0].values())
        while queue:
            node = queue.popleft()
            for ch, child in goto[node].items():
                f = fail[node]
                while f and ch not in goto[f]:
                    f = fail[f]
                target = goto[f].get(ch, 0)
                fail[child] = target if target != child else 0
                if match_len[child] == 0 and match_len[fail[child]]:
                    match_len[child] = match_len[fail[child]]
                    match_index[child] = match_index[fail[child]]
                queue.append(child)
        self._goto = goto
        self._fail = fail
        self._depth = depth
        self._match_len = match_len
        self._match_index = match_index

    @staticmethod
    @lru_cache(maxsize=128)
    def build(stops: tuple[str, ...]) -> StopAutomaton:
        """The automaton of ``stops``, cached so that ``n`` choices and repeated lists share one."""
        return StopAutomaton(stops)

    def held_back(self, state: int) -> int:
        """Characters at the end of the fed text that could still start a stop string."""
        return self._depth[state]

    def advance(self, state: int, text: str) -> int:
        """Advance ``state`` over ``text`` without looking for matches (text in which no stop
        string may end, such as the first ``min_tokens`` tokens' text): the state after it still
        lets :meth:`feed` find a match that starts in ``text`` and ends after it."""
        goto, fail = self._goto, self._fail
        for ch in text:
            nxt = goto[state].get(ch)
            while nxt is None and state:
                state = fail[state]
                nxt = goto[state].get(ch)
            state = nxt or 0
        return state

    def feed(self, state: int, text: str) -> tuple[int, StopMatch | None]:
        """Advance ``state`` over ``text``.

        Among the stop strings ending inside ``text``, the match is the one that starts first
        (on a tie, the one listed first), as a search of the whole unreleased text would find.

        Args:
            state: the state after the text fed before (0 at the start).
            text: the new text.

        Returns:
            (the new state, the match or None). After a match the state is meaningless.
        """
        goto, fail, match_len, match_index = self._goto, self._fail, self._match_len, self._match_index
        best: StopMatch | None = None
        best_key = (0, 0)
        for pos, ch in enumerate(text):
            nxt = goto[state].get(ch)
            while nxt is None and state:
                state = fail[state]
                nxt = goto[state].get(ch)
            state = nxt or 0
            n = match_len[state]
            if n:
                key = (pos + 1 - n, match_index[state])
                if best is None or key < best_key:
                    best, best_key = StopMatch(key[0], self.stops[key[1]]), key
            elif best is not None and pos + 1 - self._depth[state] > best.start:
                break  # every later match would start after the one found
        if best is not None:
            return state, best
        return state, None
