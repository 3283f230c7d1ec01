"""The regular-expression features the grammar backend (xgrammar 0.2.9) drops or rejects.

xgrammar compiles a JSON Schema ``pattern`` and a ``guided_regex`` with the same regex parser,
which ignores some features (a lookahead, a ``^``/``$`` inside the match, an unknown letter
escape) and rejects others; :func:`regex_problem` finds the first of them in one pass so that
the request is refused with a reason instead of generating text that does not match
(``tests/structured/test_schema_support.py`` checks each case against xgrammar).
"""

from __future__ import annotations

import math
import re

_KNOWN_ESCAPES = frozenset("dDwWsStnrfvxuc0")
_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")


def regex_problem(pattern: str) -> str | None:
    """The first feature of ``pattern`` that xgrammar would drop or reject, or None.

    Refused: lookahead and lookbehind, backreferences (``\\1``, ``\\k<name>``, ``(?P=name)``),
    word boundaries (``\\b``, ``\\B``), Unicode property escapes (``\\p{..}``), inline flags and
    other ``(?...)`` group modifiers (named and ``(?:`` groups, and a leading ``(?i)``, are fine),
    letter escapes other than ``\\d \\D \\w \\W \\s \\S \\t \\n \\r \\f \\v \\x \\u \\c`` (xgrammar
    matches ``\\A``, ``\\Z``, ``\\z``, ``\\h``... as the letter itself, ``\\a`` and ``\\e`` as control
    characters), a UTF-16 surrogate escape (``\\ud83d``: xgrammar never matches the character a
    surrogate pair spells), a digit escape in a character class, and a ``^`` or ``$`` that is not
    at the start or the end of the match (xgrammar ignores it; anchors at the ends of alternatives
    are fine).
    xgrammar matches the whole string in both uses (JSON Schema ``pattern`` and a
    ``guided_regex``), so anchors at the ends change nothing.
    """
    return _RegexScan(pattern).run()


class _Group:
    """The state of one open group of a regex scan."""

    __slots__ = ("leading", "alt_empty", "alt_closed", "any_closed", "anchored")

    def __init__(self, leading: bool) -> None:
        self.leading = leading  # nothing can come before the group in a match
        self.alt_empty = True  # nothing yet in the current alternative
        self.alt_closed = False  # the current alternative ended with '$'
        self.any_closed = False  # some alternative ended with '$'
        self.anchored = False  # the group holds an anchor


class _RegexScan:
    """A single pass over a regex that finds what xgrammar would drop or reject."""

    def __init__(self, pattern: str) -> None:
        self.p = pattern
        self.i = 0
        self.stack = [_Group(leading=True)]

    def run(self) -> str | None:
        p = self.p
        if p.startswith("(?i)"):
            self.i = 4  # a leading case-insensitive flag: xgrammar applies it to the whole pattern
        while self.i < len(p):
            c = p[self.i]
            top = self.stack[-1]
            if c == "|":
                top.alt_empty, top.alt_closed = True, False
                self.i += 1
            elif c == "^":
                at = self.i
                if not (top.leading and top.alt_empty):
                    return f"'^' at position {at} is not at the start of the match (xgrammar ignores it)"
                top.anchored = True
                self.i += 1
                if self.quantifier() is not None:
                    return f"a quantified anchor at position {at}"
            elif c == "$":
                at = self.i
                top.anchored = top.alt_closed = top.any_closed = True
                top.alt_empty = False
                self.i += 1
                if self.quantifier() is not None:
                    return f"a quantified anchor at position {at}"
            elif c == ")":
                problem = self.close_group()
                if problem is not None:
                    return problem
            else:
                problem = self.atom()
                if problem is not None:
                    return problem
        return None

    def atom(self) -> str | None:
        """Consume one atom (a character, an escape, a class or a group opening)."""
        p, start, top = self.p, self.i, self.stack[-1]
        if top.alt_closed:
            return f"'$' before position {start} is not at the end of the match (xgrammar ignores it)"
        first, top.alt_empty = top.alt_empty, False
        c = p[start]
        if c == "\\":
            if start + 1 >= len(p):
                self.i = len(p)
                return None  # a trailing backslash: xgrammar rejects it
            problem = _escape_problem(p[start + 1], in_class=False) or _surrogate_escape(p, start)
            if problem is not None:
                return f"{problem} at position {start}"
            self.i = start + 2
        elif c == "[":
            problem = self.char_class()
            if problem is not None:
                return problem
        elif c == "(":
            return self.open_group(leading=top.leading and first)
        else:
            self.i = start + 1
        self.quantifier()
        return None

    def char_class(self) -> str | None:
        p = self.p
        j = self.i + 1
        if j < len(p) and p[j] == "^":
            j += 1
        while j < len(p) and p[j] != "]":
            if p[j] == "\\" and j + 1 < len(p):
                problem = _escape_problem(p[j + 1], in_class=True) or _surrogate_escape(p, j)
                if problem is not None:
                    return f"{problem} at position {j}"
                j += 2
            else:
                j += 1
        self.i = j + 1  # past ']' (an unterminated class: xgrammar rejects it)
        return None

    def open_group(self, leading: bool) -> str | None:
        """Consume a group opening; ``leading``: nothing can come before it in a match."""
        p, start = self.p, self.i
        if p.startswith("(?", start):
            rest = p[start + 2 : start + 4]
            if rest[:1] in ("=", "!"):
                return f"a lookahead at position {start}"
            if rest in ("<=", "<!"):
                return f"a lookbehind at position {start}"
            if rest[:2] == "P=":
                return f"a backreference at position {start}"
            if rest[:1] == ":":
                self.i = start + 3
            elif rest[:1] == "<" or rest == "P<":
                end = p.find(">", start)
                self.i = len(p) if end < 0 else end + 1
            else:
                return f"an inline flag or group modifier '(?{rest[:1]}' at position {start}"
        else:
            self.i = start + 1
        self.stack.append(_Group(leading))
        return None

    def close_group(self) -> str | None:
        if len(self.stack) == 1:
            self.i += 1
            return None  # unbalanced: xgrammar rejects it
        group = self.stack.pop()
        parent = self.stack[-1]
        self.i += 1
        repeat = self.quantifier()
        if group.anchored:
            parent.anchored = True
            if repeat is not None and repeat > 1:
                return f"an anchor inside a repeated group (before position {self.i})"
        if group.any_closed:
            parent.alt_closed = parent.any_closed = True
        return None

    def quantifier(self) -> float | None:
        """Consume a quantifier at the scan position; its largest count (None: none there)."""
        p, i = self.p, self.i
        if i >= len(p):
            return None
        most: float
        if p[i] in "*+":
            most, i = math.inf, i + 1
        elif p[i] == "?":
            most, i = 1, i + 1
        else:
            m = _QUANTIFIER.match(p, i)
            if m is None:
                return None
            most = int(m.group(1)) if m.group(2) is None else (int(m.group(3)) if m.group(3) else math.inf)
            i = m.end()
        if i < len(p) and p[i] in "?+":  # lazy or possessive
            i += 1
        self.i = i
        return most


def repeat_cost(pattern: str) -> int:
    """The sum, over the counted repetitions of ``pattern`` (``{m}``, ``{m,}``, ``{m,n}``; not
    inside a character class or escaped), of the square of the count xgrammar expands (``n``,
    else ``m``; counts over 10**6 taken as 10**6).

    xgrammar 0.2.9 turns a JSON Schema ``pattern``'s counted repetition into that many copies, in
    a time that grows with the square of the count (measured on this project's CI machine:
    ``[a-z]{1,1000}`` 0.044 s, ``{1,2000}`` 0.17 s, ``{1,4000}`` 0.67 s, ``{1,20000}`` about 27 s;
    repetitions in sequence add up, nested ones cost no more than the largest); a
    ``guided_regex`` is not expanded so (``{1,20000}`` in 1 ms).
    """
    cost, i, n = 0, 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
        elif ch == "[":  # a class: its braces are literal
            i += 1
            if i < n and pattern[i] == "^":
                i += 1
            if i < n and pattern[i] == "]":
                i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            i += 1
        elif ch == "{" and (m := _QUANTIFIER.match(pattern, i)) is not None:
            count = m.group(3) if m.group(3) else m.group(1)
            bound = 10**6 if len(count) > 6 else min(int(count), 10**6)
            cost += bound * bound
            i = m.end()
        else:
            i += 1
    return cost


_SURROGATE_ESCAPE = re.compile(r"\\u([dD][89a-fA-F][0-9a-fA-F]{2})")


def _surrogate_escape(pattern: str, at: int) -> str | None:
    """What is wrong with a ``\\uD800`` to ``\\uDFFF`` escape at ``at``, or None: xgrammar reads it
    as a code point of its own and emits bytes that are not UTF-8 (the text shows U+FFFD), so a
    surrogate pair never matches the character it spells."""
    m = _SURROGATE_ESCAPE.match(pattern, at)
    if m is None:
        return None
    return (
        f"the UTF-16 surrogate escape '\\u{m.group(1)}' (no UTF-8 text holds one; write the character itself)"
    )


def _escape_problem(ch: str, in_class: bool) -> str | None:
    """What is wrong with the escape ``\\<ch>`` for xgrammar, or None."""
    if ch in "123456789":
        return "a digit escape in a character class" if in_class else "a backreference"
    if ch == "b" and in_class:
        return None  # backspace
    if ch in "bB":
        return "a word boundary"
    if ch in "pP":
        return "a Unicode property escape"
    if ch == "k":
        return "a named backreference"
    if ch in "ae":
        return f"the escape '\\{ch}' (a control character for xgrammar, the letter {ch!r} in JSON Schema)"
    if ch.isascii() and ch.isalpha() and ch not in _KNOWN_ESCAPES:
        return f"the escape '\\{ch}' (xgrammar would match the letter {ch!r} itself)"
    return None
