"""Tokenizer-free checks of a structured-output request, and the xgrammar grammar it builds."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from typing import Any

import msgspec

from surge.sampling_params import StructuredOutputsParams
from surge.structured.regex_support import regex_problem
from surge.structured.schema_support import check_json_schema

JSON_OBJECT_SCHEMA = '{"type": "object"}'
"""``json_object``: any JSON object (properties of any name and value)."""
_XGR_PREFIX = re.compile(r"^\[[0-9:]+\]\s+\S+:\d+:\s*(Check failed: .*? is false: )?")
_XGR_CHECK = re.compile(r"Check failed: \(.*?\) is false:?\s*")
_XGR_SOURCE = re.compile(r"\S*/\S+\.(?:cc|cpp|h|hpp):\d+:?\s*")
# picojson's assertion when a keyword's value has another JSON type than xgrammar reads
_XGR_TYPE_MISMATCH = re.compile(r"type mismatch! call is<type>\(\) before get<type>\(\).*?is<([\w:]+)>\(\)")
_PICOJSON_TYPES = {
    "std::string": "a string",
    "double": "a number",
    "int64_t": "an integer",
    "bool": "a boolean",
    "picojson::array": "an array",
    "array": "an array",
    "picojson::object": "an object",
    "object": "an object",
}
_ERROR_MAX_CHARS = 300

_LENGTH_STRING_CHAR = re.compile(r"^(\S+_characters) ::= \(\(\[\^\\\"\\\\\\r\\n\]\)\)$", re.MULTILINE)
"""A rule xgrammar 0.2.9 writes for one character of a JSON string with ``minLength`` or
``maxLength``: ``X_characters ::= (([^\"\\\r\n]))``, which lets the other control characters
(U+0000 to U+001F: a tab, a form feed...) through raw, though JSON allows them only escaped."""
_JSON_STRING_CHAR = r"(([^\0-\x1f\"\\]))"
"""That rule's body without any control character (the printed form of xgrammar's own
``basic_string`` class); escapes stay out, as xgrammar counts one character a repetition."""


def clean_error(e: BaseException) -> str:
    """xgrammar's error message, short and on one line, without its C++ source locations,
    ``Check failed`` conditions, the echoed JSON text or picojson's type assertions (a keyword's
    value of the wrong type reads "a keyword's value has the wrong type (expected a string)")."""
    text = " ".join(str(e).split())
    mismatch = _XGR_TYPE_MISMATCH.search(text)
    if mismatch is not None:
        expected = _PICOJSON_TYPES.get(mismatch.group(1), "another type")
        return f"a keyword's value has the wrong type (expected {expected})"
    text = _XGR_PREFIX.sub("", text)
    text = _XGR_CHECK.sub("", text)
    text = _XGR_SOURCE.sub("", text)
    text = re.sub(r"^\[[0-9:]+\]\s*", "", text)
    text = text.split(" The JSON string is:")[0].strip()
    if len(text) > _ERROR_MAX_CHARS:
        text = text[: _ERROR_MAX_CHARS - 3] + "..."
    return text or type(e).__name__


def ebnf_string_literal(text: str) -> str:
    """``text`` as an EBNF string literal (xgrammar escapes: backslash, quote, newline...)."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def choice_grammar(choices: tuple[str, ...]) -> str:
    """An EBNF grammar whose language is exactly ``choices``."""
    return "root ::= " + " | ".join(ebnf_string_literal(c) for c in choices)


MAX_CHOICE_OPTIONS = 2048
"""Most options of a ``choice``: every row under the grammar pays for its options at every step
(40,000 options: about 35 ms per row and step on a 2-core machine, 4.6-15 s of stall for every
stream at ``n: 128``-1,024; 3,000 options with 1,024 rows: 0.38 s)."""
MAX_CHOICE_CHARS = 65_536
"""Most characters of a ``choice``'s options together: xgrammar's compile time grows about with
their square (10,000 options of 65 characters, 650 KB: 6 s; 2.8 MB: 70 s, while every later
structured request of any client waited for the one compile worker)."""


MAX_GRAMMAR_RULES = 1024
"""Most rules of an EBNF ``grammar`` as xgrammar normalizes it (a repetition or a group may add
rules of its own). The engine's compilation with the tokenizer grows faster than the rule count
where rules start with other rules or follow each other: a chain of 4,000 rules ``r_i ::= r_{i+1}
| "a"`` (86 KB) held the one compile worker 30 s on a 2-core machine, and a sequence of 20,000
(540 KB) 73 s, while every later structured request of any client waited; 1,000 such rules take
0.1-0.3 s. Rules inline (a sequence of 20,000 character classes in one rule) cost far less.
This bounds the grammar's size, not its compile time, which also depends on the vocabulary: with
Qwen3's, 400 rules ``r_i ::= r_{i+1} r_{i+1} | "a"`` took 88 s (docs/server-limits.md)."""


def _check_grammar_size(grammar: Any) -> None:
    """Raise ValueError when ``grammar`` (an ``xgrammar.Grammar`` of an EBNF text) has more than
    :data:`MAX_GRAMMAR_RULES` rules."""
    rules = len(json.loads(grammar.serialize_json())["rules"])
    if rules > MAX_GRAMMAR_RULES:
        raise ValueError(
            f"the grammar has {rules:,} rules (after xgrammar's normalization), at most "
            f"{MAX_GRAMMAR_RULES:,}: a grammar of that many rules takes too long to compile; "
            "inline rules used once"
        )


_FORMAT_TAG_KEYS = frozenset({"type", "format"})
"""Top-level keys of xgrammar's structural tag (``{"type": "structural_tag", "format": ...}``)."""
_LEGACY_TAG_KEYS = frozenset({"type", "structures", "triggers"})
"""Top-level keys of the older structural tag form (``structures`` with ``triggers``)."""


def _structural_tag_spec(text: str) -> dict[str, Any]:
    """The parsed structural tag of ``text``, its embedded JSON schemas and regexes checked as
    :func:`check_enforceable` checks whole ones (a keyword xgrammar would drop inside a tag is
    refused as it is outside).

    Raises:
        ValueError: not a JSON object, a top-level key neither form reads (``triggers`` beside
            ``format``), or an embedded schema or regex that cannot be enforced;
            the message locates it (``format.content.json_schema``, ``structures[1].schema``).
    """
    try:
        spec = json.loads(text)
    except RecursionError:
        raise ValueError("invalid structural_tag: nested too deeply") from None
    except ValueError as e:
        raise ValueError(f"invalid structural_tag: not JSON ({e})") from None
    if not isinstance(spec, dict):
        raise ValueError("invalid structural_tag: it must be a JSON object")

    def schema_at(schema: Any, where: str) -> None:
        try:
            check_json_schema(schema)
        except ValueError as e:
            raise ValueError(f"invalid structural_tag: {where}: {e}") from None

    form_keys = _LEGACY_TAG_KEYS if "structures" in spec else _FORMAT_TAG_KEYS
    unknown = sorted(set(spec) - form_keys)
    if unknown:  # neither form reads it (xgrammar would ignore it)
        raise ValueError(
            f"invalid structural_tag: unknown key {unknown[0]!r} (the format form has "
            "'type' and 'format', its triggers inside the format, e.g. triggered_tags; the older "
            "form has 'structures' and 'triggers')"
        )
    if "structures" in spec:  # the older form: JSON schemas between begin and end strings
        structures, triggers = spec["structures"], spec.get("triggers")
        if not isinstance(structures, list) or not structures:
            raise ValueError("invalid structural_tag: structures must be a non-empty list")
        if (
            not isinstance(triggers, list)
            or not triggers
            or not all(isinstance(t, str) and t for t in triggers)
        ):
            raise ValueError("invalid structural_tag: triggers must be a non-empty list of non-empty strings")
        for i, item in enumerate(structures):
            if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in ("begin", "end")):
                raise ValueError(f"invalid structural_tag: structures[{i}] needs string 'begin' and 'end'")
            if "schema" not in item:
                raise ValueError(f"invalid structural_tag: structures[{i}] needs a 'schema'")
            schema_at(item["schema"], f"structures[{i}].schema")
        return spec

    def walk(node: Any, where: str) -> None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{where}[{i}]")
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind == "json_schema" and "json_schema" in node:
                schema_at(node["json_schema"], f"{where}.json_schema")
                return
            if kind == "regex" and isinstance(node.get("pattern"), str):
                problem = regex_problem(node["pattern"])
                if problem is not None:
                    raise ValueError(f"invalid structural_tag: {where}.pattern: unsupported regex: {problem}")
                return
            for key, value in node.items():
                walk(value, f"{where}.{key}" if where else key)

    try:
        walk(spec, "")
    except RecursionError:
        raise ValueError("invalid structural_tag: nested too deeply") from None
    return spec


def check_enforceable(params: StructuredOutputsParams) -> None:
    """Refuse a JSON schema or regex that uses what xgrammar would silently drop (a keyword
    such as ``uniqueItems``, a regex lookahead...), so that it is refused instead of ignored
    (:mod:`surge.structured.schema_support`), and a ``choice`` over :data:`MAX_CHOICE_OPTIONS`
    options or :data:`MAX_CHOICE_CHARS` characters. Other kinds pass.

    Raises:
        ValueError: the message names the keyword and its location in the schema (e.g.
            ``keyword 'uniqueItems' at #/properties/tags is not supported: ...``), the
            regex feature (``unsupported regex: ...``), or the choice limit.
    """
    if params.kind == "json":
        assert params.json is not None
        try:
            # msgspec first: the standard parser holds the GIL about 5x longer (a 4 MB schema:
            # 0.37 s), which stalls the API process's event loop even from a thread
            schema = _json_value(params.json)
        except RecursionError:
            raise ValueError("invalid json: the schema is nested too deeply") from None
        except ValueError:
            return  # not JSON: xgrammar says why
        check_json_schema(schema)
    elif params.kind == "structural_tag":
        assert params.structural_tag is not None
        _structural_tag_spec(params.structural_tag)
    elif params.kind == "regex":
        assert params.regex is not None
        problem = regex_problem(params.regex)
        if problem is not None:
            raise ValueError(f"unsupported regex: {problem}")
    elif params.kind == "choice":
        options = params.choice or ()
        if len(options) > MAX_CHOICE_OPTIONS:
            raise ValueError(f"invalid choice: at most {MAX_CHOICE_OPTIONS:,} options, got {len(options):,}")
        chars = sum(len(c) for c in options)
        if chars > MAX_CHOICE_CHARS:
            raise ValueError(
                f"invalid choice: the options may hold at most {MAX_CHOICE_CHARS:,} characters together, "
                f"got {chars:,}"
            )


def build_grammar(params: StructuredOutputsParams) -> Any:
    """The ``xgrammar.Grammar`` of ``params`` (no tokenizer needed; milliseconds, up to about
    0.2 s for a schema at :data:`~surge.structured.schema_support.MAX_PATTERN_REPEAT_COST`; the
    API process calls it on a tokenizer thread).

    JSON schemas are compiled with ``strict_mode`` (no properties beyond the schema's), as vLLM
    does, and compactly (``", "`` and ``": "`` separators, no other whitespace, none before the
    document) unless ``params.disable_any_whitespace`` is False (any whitespace between JSON
    tokens, vLLM's default). A structural tag is
    built by xgrammar's ``Grammar.from_structural_tag`` (its older ``structures``/``triggers``
    form through the deprecated pair of arguments, as vLLM does); it may embed EBNF, so it is
    held to :data:`MAX_GRAMMAR_RULES` too.

    Raises:
        ValueError: the schema, regex or grammar is invalid, asks for what the grammar
            cannot enforce (:func:`check_enforceable`), or is an EBNF grammar of more than
            :data:`MAX_GRAMMAR_RULES` rules; the message says why.
    """
    check_enforceable(params)
    import xgrammar as xgr

    kind = params.kind
    try:
        if kind == "json":
            assert params.json is not None
            return _strict_json_values(
                xgr.Grammar.from_json_schema(
                    params.json, any_whitespace=params.any_whitespace, strict_mode=True
                )
            )
        if kind == "regex":
            assert params.regex is not None
            return xgr.Grammar.from_regex(params.regex)
        if kind == "choice":
            assert params.choice is not None
            return xgr.Grammar.from_ebnf(choice_grammar(params.choice))
        if kind == "grammar":
            assert params.grammar is not None
            grammar = xgr.Grammar.from_ebnf(params.grammar)
        elif kind == "structural_tag":
            assert params.structural_tag is not None
            spec = _structural_tag_spec(params.structural_tag)
            if "structures" in spec:
                tags = [
                    xgr.StructuralTagItem(begin=t["begin"], schema=json.dumps(t["schema"]), end=t["end"])
                    for t in spec["structures"]
                ]
                grammar = xgr.Grammar.from_structural_tag(tags, spec["triggers"])
            else:
                grammar = xgr.Grammar.from_structural_tag(params.structural_tag)
            if not _has_own_rules(spec):  # a user's regex or EBNF is kept as written
                grammar = _strict_json_values(grammar)
        else:
            return xgr.Grammar.from_json_schema(
                JSON_OBJECT_SCHEMA, any_whitespace=params.any_whitespace, strict_mode=False
            )
    except Exception as e:  # xgrammar raises RuntimeError / ValueError / InvalidJSONError
        raise ValueError(f"invalid {kind}: {clean_error(e)}") from e
    _check_grammar_size(grammar)
    return grammar


_RULE = re.compile(r"^(\S+) ::= (.*)$", re.MULTILINE)
_DATE = re.compile(r'(?<!\w)(\w+)\{4, 4\} "-" (\w+) "-" (\w+)')
"""The date xgrammar 0.2.9 writes for ``format`` ``date`` and inside ``date-time``: four digits
(:data:`_DIGIT`), a month (:data:`_MONTH`) and a day of 01 to 31 (:data:`_DAY`), whatever the
month (``2024-02-30``) or the year (``0000``, which no calendar library reads)."""
_DIGIT = "(([0-9]))"
_MONTH = '(("0" [1-9]) | ("1" [0-2]))'
_DAY = '(("0" [1-9]) | ([1-2] [0-9]) | ("3" [01]))'
_SECOND = '(([0-5] [0-9]) | ("6" "0"))'
"""xgrammar's seconds of ``time`` and ``date-time``: second 60 (a leap second) in any minute,
which Python's ``datetime`` (pydantic) and JSON Schema validators refuse there."""
_DATE_RULES = (
    'surge_rfc3339_date ::= ((surge_rfc3339_year "-" surge_rfc3339_month_day) | (surge_rfc3339_leap_year "-02-29"))\n'
    'surge_rfc3339_year ::= (([0-9] [0-9] [0-9] [1-9]) | ([0-9] [0-9] [1-9] "0") | ([0-9] [1-9] "00") | ([1-9] "000"))\n'
    'surge_rfc3339_month_day ::= ((("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])) | '
    '(("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30")) | ("02-" ("0" [1-9] | "1" [0-9] | "2" [0-8])))\n'
    'surge_rfc3339_leap_year ::= (([0-9] [0-9] ("0" [48] | [2468] [048] | [13579] [26])) | '
    '(("0" [48] | [2468] [048] | [13579] [26]) "00"))\n'
)
"""A real date: years 0001 to 9999, each month its days, February 29 in leap years only."""

_IPV4 = re.compile(r"\(\((\w+)\{3, 3\} (\w+)\)\)")
"""The body of the rule xgrammar 0.2.9 writes for ``format`` ``ipv4``: three octets each followed
by a dot (a rule ``((OCTET "."))``), then a fourth octet (:data:`_OCTET`)."""
_OCTET = re.compile(r'\(\("2" "5" \[0-5\]\) \| \("2" \[0-4\] \[0-9\]\) \| \((\w+) (\w+) \[0-9\]\)\)')
"""xgrammar's octet of an ``ipv4``: 250-255, 200-249, or an optional ``[0-1]`` (:data:`_OPT_01`)
and an optional digit (:data:`_OPT_DIGIT`) before a digit, which lets leading zeros through
(``01.2.3.4``, ``094.55.64.000``), though RFC 2673's dotted quad (JSON Schema's ``ipv4``) and
Python's ``ipaddress`` refuse them."""
_OPT_01 = '("" | ([0-1]))'
_OPT_DIGIT = '("" | ([0-9]))'
_REAL_OCTET = '(("2" "5" [0-5]) | ("2" [0-4] [0-9]) | ("1" [0-9] [0-9]) | ([1-9] [0-9]) | ([0-9]))'
"""An octet without leading zeros: 0 to 255, each written one way."""
_HOSTNAME = re.compile(r"\(\(\[a-z0-9\] (\w+) (\w+)\)\)")
"""The body of the rule xgrammar 0.2.9 writes for ``format`` ``hostname``: a label (its first
character, then the rest, :data:`_LABEL_REST`) and the dotted labels after it (a rule
``("" | ("." [a-z0-9] REST NEXT))`` that calls itself)."""
_LABEL_REST = r'("" | ([a-z0-9\-]* [a-z0-9]))'
"""xgrammar's rest of a hostname label after its first character: any length, though RFC 1123
(JSON Schema's ``hostname``) bounds a label to 63 characters."""
_REAL_LABEL_REST = r'("" | ([a-z0-9\-]{0, 61} [a-z0-9]))'
"""The rest of a label of at most 63 characters."""


def _real_formats(text: str) -> str:
    """``text`` (a grammar's EBNF) with xgrammar's dates (:data:`_DATE`) replaced by
    :data:`_DATE_RULES`, its leap seconds (:data:`_SECOND`) taken out, its ``ipv4`` octets
    without leading zeros (:data:`_OCTET`) and its ``hostname`` labels at most 63 characters
    (:data:`_LABEL_REST`); ``text`` itself when it has none of these. A rule is rewritten only
    within the whole shape xgrammar writes for its format (an ``ipv4``'s four octets and three
    dots, a ``hostname``'s labels), which a schema's ``pattern`` never writes (xgrammar 0.2.9
    prints a pattern as a ``Regex(...)`` rule of its own, even the format's very regex). Rule names grow with a schema's depth (``root_prop_a_prop_a...``), so the
    date's pattern starts only at a name's first character and runs only when a date may be
    there: tried at every character, a 64-level schema's 355 KB of rules took 0.6 s. The work is
    linear in the text: its rules' bodies, dates and rewritten rules, plus, per rule, a match
    against the ipv4 and hostname shapes."""
    has_date = '{4, 4} "-" ' in text
    if not has_date and _SECOND not in text and "{3, 3} " not in text and _LABEL_REST not in text:
        return text
    bodies = dict(_RULE.findall(text))
    new_bodies = {name: "(([0-5] [0-9]))" for name, body in bodies.items() if body == _SECOND}

    def octet(name: str) -> bool:
        m = _OCTET.fullmatch(bodies.get(name, ""))
        return m is not None and (bodies.get(m.group(1)), bodies.get(m.group(2))) == (_OPT_01, _OPT_DIGIT)

    for body in bodies.values():
        ipv4 = _IPV4.fullmatch(body)
        if ipv4 is not None:
            first = re.fullmatch(r'\(\((\w+) "\."\)\)', bodies.get(ipv4.group(1), ""))
            if first is not None and octet(first.group(1)) and octet(ipv4.group(2)):
                new_bodies[first.group(1)] = new_bodies[ipv4.group(2)] = _REAL_OCTET
        host = _HOSTNAME.fullmatch(body)
        if host is not None and bodies.get(host.group(1)) == _LABEL_REST:
            after = re.fullmatch(r'\("" \| \("\." \[a-z0-9\] (\w+) (\w+)\)\)', bodies.get(host.group(2), ""))
            if (
                after is not None
                and after.group(2) == host.group(2)
                and bodies.get(after.group(1)) == _LABEL_REST
            ):
                new_bodies[host.group(1)] = new_bodies[after.group(1)] = _REAL_LABEL_REST

    def date(m: re.Match[str]) -> str:
        parts = (bodies.get(m.group(1)), bodies.get(m.group(2)), bodies.get(m.group(3)))
        return "surge_rfc3339_date" if parts == (_DIGIT, _MONTH, _DAY) else m.group(0)

    fixed = _DATE.sub(date, text) if has_date else text
    if new_bodies:
        fixed = _RULE.sub(
            lambda m: (
                f"{m.group(1)} ::= {new_bodies[m.group(1)]}" if m.group(1) in new_bodies else m.group(0)
            ),
            fixed,
        )
    if "surge_rfc3339_date" in fixed and "surge_rfc3339_date ::=" not in fixed:
        fixed += "\n" + _DATE_RULES
    return fixed


def _has_own_rules(node: Any) -> bool:
    """Whether a structural tag (its parsed JSON, or a part of it) has a ``regex`` or
    ``grammar`` element: its rules print as xgrammar's own JSON rules may (``[0-5][0-9]|60`` as
    the seconds of a time), which :func:`_strict_json_values` would rewrite (60 refused)."""
    if isinstance(node, list):
        return any(_has_own_rules(item) for item in node)
    if not isinstance(node, dict):
        return False
    if node.get("type") in ("regex", "grammar"):
        return True
    return any(_has_own_rules(value) for key, value in node.items() if key not in ("json_schema", "schema"))


def _strict_json_values(grammar: Any) -> Any:
    """``grammar`` (an ``xgrammar.Grammar`` built from a JSON schema or a structural tag) with
    the characters of its length-bounded JSON strings (:data:`_LENGTH_STRING_CHAR`) kept from the
    control characters, its dates real ones, no leap second in its times, no leading zero in an
    ``ipv4``'s octets and no ``hostname`` label over 63 characters (:func:`_real_formats`), so
    that the output is JSON and values that strict parsers read (``json.loads``, pydantic,
    ``datetime``, ``ipaddress``); the grammar itself when it has none of these. Costs
    a parse of the grammar's text (about 20 ms for 80 bounded properties).

    Raises:
        ValueError: xgrammar cannot parse the rewritten text (never seen: its text round-trips).
    """
    import xgrammar as xgr

    text = str(grammar)
    fixed = _real_formats(_LENGTH_STRING_CHAR.sub(lambda m: f"{m.group(1)} ::= {_JSON_STRING_CHAR}", text))
    return grammar if fixed == text else xgr.Grammar.from_ebnf(fixed)


VERDICT_CACHE_SIZE = 1024
"""Most verdicts :func:`check_structured_outputs` keeps (least recently used first out); each
is keyed by a 32-byte digest, so the cache stays small whatever the schemas' size."""
_verdicts: OrderedDict[tuple[str, bytes], str | None] = OrderedDict()
_verdicts_lock = threading.Lock()


def _json_value(text: str) -> Any:
    """The value of the JSON ``text``: parsed by msgspec, or by the ``json`` module where msgspec
    refuses what it accepts (``NaN``, a lone surrogate), so the result is ``json.loads``'.

    Raises:
        ValueError, RecursionError: as ``json.loads(text)``.
    """
    try:
        return msgspec.json.decode(text)
    except (ValueError, RecursionError):  # DecodeError, or a lone surrogate UTF-8 cannot encode
        return json.loads(text)


def _verdict_key(params: StructuredOutputsParams) -> tuple[str, bytes]:
    """The kind and a digest of the grammar's text; a JSON schema by its canonical JSON (no
    whitespace between tokens, the keys in their order), so that a schema sent again, however
    it is spaced, hits the same verdict."""
    kind = params.kind
    if kind == "json":
        assert params.json is not None
        try:  # msgspec: compact, keys in order, about 5x faster than the json module
            return kind, hashlib.sha256(msgspec.json.encode(msgspec.json.decode(params.json))).digest()
        except (ValueError, RecursionError):
            pass  # what msgspec refuses (NaN, a lone surrogate) is keyed by the json module's text
        try:
            text = json.dumps(json.loads(params.json), ensure_ascii=False, separators=(",", ":"))
        except (ValueError, RecursionError):
            text = params.json
    elif kind == "choice":
        text = json.dumps(list(params.choice or ()), ensure_ascii=False)
    elif kind == "structural_tag":
        text = params.structural_tag or ""
    else:
        text = params.regex or params.grammar or ""
    return kind, hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def check_structured_outputs(params: StructuredOutputsParams) -> None:
    """Raise ValueError when ``params`` does not describe a valid grammar that xgrammar
    enforces in full.

    The verdict is cached (:data:`VERDICT_CACHE_SIZE` grammars, by their canonical text): the
    same schema sent again costs no xgrammar work.

    Raises:
        ValueError: as :func:`build_grammar`.
    """
    key = _verdict_key(params)
    verdict: str | None = None
    with _verdicts_lock:
        hit = key in _verdicts
        if hit:
            _verdicts.move_to_end(key)
            verdict = _verdicts[key]
    if not hit:
        try:
            build_grammar(params)
        except ValueError as e:
            verdict = str(e)
        with _verdicts_lock:
            _verdicts[key] = verdict
            while len(_verdicts) > VERDICT_CACHE_SIZE:
                _verdicts.popitem(last=False)
    if verdict is not None:
        raise ValueError(verdict)
