"""What the grammar backend enforces of a JSON schema or a regular expression; the rest is refused.

xgrammar turns a JSON schema into a grammar and silently drops what it cannot express: some
keywords only print a warning on stderr (``uniqueItems``, ``contains``, ``not``, ``if``,
``dependentRequired``, ``multipleOf`` on numbers, a lookahead in a ``pattern``), others are
dropped without a word (``patternProperties`` next to ``properties``, a ``required`` name that
``properties`` does not declare, any keyword next to ``$ref``, ``enum``, ``const`` or
``anyOf``, a keyword in a schema without ``type``). The output then violates the schema while
the request succeeds. :func:`check_json_schema` walks a schema the way xgrammar 0.2.9 reads it
and raises ``ValueError`` for every such keyword, naming it and its location (a JSON pointer
into the schema); :func:`surge.structured.regex_support.regex_problem` finds the regex features
xgrammar drops.

What is refused (each checked against xgrammar 0.2.9 by compiling the schema and matching
instances that violate it; ``tests/structured/test_schema_support.py`` repeats the checks):

- anywhere: ``not``, ``if`` with ``then``/``else``, ``$dynamicRef``, ``$recursiveRef``; a
  ``$ref`` that is not local (``#`` or ``#/...``) or sits under a nested ``$id``; an empty
  ``anyOf``/``oneOf``; ``allOf`` with more than one schema; ``oneOf`` whose branches cannot be
  proven disjoint (xgrammar then enforces ``anyOf``); an assertion next to ``$ref``, ``const``,
  ``enum``, ``anyOf``, ``oneOf`` or ``allOf`` (a ``type`` that every value already has is
  accepted); an assertion in a schema without ``type`` that xgrammar reads as "any value";
  ``type: []``; a schema nested deeper than :data:`MAX_SCHEMA_DEPTH`, with more than
  :data:`MAX_SUBSCHEMAS` subschemas, whose nesting costs more than :data:`MAX_NESTING_COST` or
  whose optional properties cost more than :data:`MAX_OPTIONAL_PROPERTY_COST` (enforceable, but
  too slow to compile).
- strings: ``pattern`` next to a supported ``format`` (a ``format`` outside
  :data:`SUPPORTED_FORMATS` is an annotation, as JSON Schema 2020-12 makes it by default); ``minLength``/``maxLength`` next to ``pattern`` or a supported ``format``; a
  ``pattern`` with a feature of :func:`~surge.structured.regex_support.regex_problem`; patterns
  whose counted repetitions exceed :data:`MAX_PATTERN_REPEAT_COST` (enforceable, but too slow to
  compile).
- numbers: ``multipleOf`` (on integers it is enforced for an integer of at most 1,024 with no
  bounds or with both bounds spanning at most 10,000 integers, and ``multipleOf: 1`` always).
- arrays: ``uniqueItems: true`` (unless ``maxItems`` is at most 1), ``contains``.
- objects: ``patternProperties``, ``propertyNames`` next to ``properties``, a ``required`` name
  missing from ``properties``, ``dependentRequired``, ``dependentSchemas``, ``dependencies``,
  ``minProperties`` above the required properties where other keys are allowed (a key may
  repeat and count twice).

Only what xgrammar would compile is walked: ``$defs``/``definitions`` entries are checked where
a ``$ref`` reaches them. Keywords that JSON Schema itself does not assert (annotations such as
``title``, ``description``, ``default``, ``examples``, ``contentEncoding``, and unknown
keywords such as ``discriminator``) are accepted, as are keywords without effect
(``uniqueItems: false``, ``minLength: 0``, ``minContains`` without ``contains``,
``additionalItems`` next to an ``items`` schema...).
"""

from __future__ import annotations

import json
import math
from typing import Any

from surge.structured.regex_support import regex_problem, repeat_cost

SUPPORTED_FORMATS = frozenset(
    {
        "date",
        "time",
        "date-time",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "uri-template",
        "uuid",
        "json-pointer",
        "relative-json-pointer",
    }
)
"""String ``format`` values xgrammar 0.2.9 turns into a regex (others are ignored)."""

INTEGER_MULTIPLE_OF_MAX = 1024
"""The largest integer ``multipleOf`` xgrammar 0.2.9 enforces."""

INTEGER_MULTIPLE_OF_RANGE_MAX = 10_000
"""The most integers a bounded range may hold for xgrammar 0.2.9 to enforce ``multipleOf``."""

_STRING_KEYWORDS = ("format", "pattern", "minLength", "maxLength")
_NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_ARRAY_KEYWORDS = (
    "items",
    "prefixItems",
    "unevaluatedItems",
    "contains",
    "minItems",
    "maxItems",
    "uniqueItems",
)
_OBJECT_KEYWORDS = (
    "properties",
    "patternProperties",
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "required",
    "minProperties",
    "maxProperties",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
)
_GENERIC_KEYWORDS = ("type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf", "not", "if")
_ASSERTIONS = _GENERIC_KEYWORDS + _STRING_KEYWORDS + _NUMBER_KEYWORDS + _ARRAY_KEYWORDS + _OBJECT_KEYWORDS
"""The JSON Schema keywords that constrain a value (annotations and unknown keywords do not)."""

_TYPED_KEYWORDS = {
    "string": _STRING_KEYWORDS,
    "integer": _NUMBER_KEYWORDS,
    "number": _NUMBER_KEYWORDS,
    "array": _ARRAY_KEYWORDS,
    "object": _OBJECT_KEYWORDS,
}
MAX_PATTERN_REPEAT_COST = 4_000_000
"""Largest sum of :func:`~surge.structured.regex_support.repeat_cost` over a schema's ``pattern``
strings: one ``{1,2000}``, about 0.17 s of xgrammar's JSON-schema conversion, which the API
process and the engine each run once; beyond it a small schema could hold a CPU for minutes."""
MAX_SCHEMA_DEPTH = 64
"""Most levels of subschemas in a JSON schema: a subschema under ``anyOf``/``oneOf``/``allOf``,
``not``, ``items``, ``prefixItems``, ``properties``, ``additionalProperties``, ``$defs``... or
reached through a ``$ref`` is one level below its parent (a ``$ref`` cycle counts once). Real
schemas stay far below (OpenAI's strict mode allows 10 levels of object nesting)."""

MAX_NESTING_COST = 1_000_000
"""Largest sum, over a schema's subschemas, of the square of each one's depth below the root of
its document (``$ref`` is not followed: xgrammar compiles each ``$ref`` target once, as a rule of
its own). xgrammar's JSON-schema conversion takes time growing with that sum: 400 nested
``anyOf`` (a 12 KB schema) took 4 s of the API process's grammar check on a 2-core machine, and
at the limit it takes about 0.3 s. Nesting moved into ``$defs`` and reached by ``$ref`` costs
nothing here."""
MAX_SUBSCHEMAS = 5_000
"""Most object subschemas a JSON schema may hold (the root included; ``$ref`` not followed).
xgrammar's conversion time grows with their number even when the schema is flat: 100,000
``anyOf`` branches (4 MiB) took 3.6 s of the API process's grammar check on a 2-core machine,
and the engine's compilation with the tokenizer (on the one compile worker every structured
request waits for) grows faster: 16,000 properties took 10 s of it, 4,000 about 0.5 s. OpenAI's
structured outputs allow 5,000 object properties in all."""
MAX_OPTIONAL_PROPERTY_COST = 250_000
"""Largest sum, over a schema's objects, of the square of the number of its ``properties`` that
``required`` does not name (``$ref`` not followed). xgrammar chains an object's optional
properties into one rule per property, each of which may start with the next, and the engine's
compilation with the tokenizer grows about with the cube of such a chain: 500 optional
properties in one object took 0.1 s on a 2-core machine, 1,000 took 1.7 s, 2,000 (a 60 KB
schema) 20 s, 3,000 50 s, while every later structured request of any client waited for the one
compile worker. At the limit: one object of 500 optional properties."""
_OBJECT_HINTS = ("properties", "additionalProperties", "unevaluatedProperties")
_ONE_SUBSCHEMA = (
    "not",
    "if",
    "then",
    "else",
    "items",
    "additionalItems",
    "unevaluatedItems",
    "contains",
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
)
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = (
    "properties",
    "patternProperties",
    "dependentSchemas",
    "dependencies",
    "$defs",
    "definitions",
)
_ARRAY_HINTS = ("items", "prefixItems", "unevaluatedItems")


def check_json_schema(schema: Any) -> None:
    """Refuse a JSON schema that uses a keyword or regex feature xgrammar would not enforce.

    ``schema`` is the parsed schema (a dict or a bool). Malformed schemas (a ``type`` that is
    not a type name, a non-list ``enum``...) pass: xgrammar rejects them with its own message.

    Raises:
        ValueError: a keyword xgrammar ignores; the message names the keyword, its location in
            the schema as a JSON pointer (``#/properties/tags``) and why.
    """
    try:
        _check_nesting(schema)
        _Walker(schema).walk(schema, (), None, False)
    except RecursionError:
        raise ValueError("the schema is nested too deeply") from None


# --- nesting: depth and compile cost ---------------------------------------------------------


def _subschemas(node: dict[str, Any]) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """The object subschemas directly below ``node`` (any keyword that holds a schema, whether
    or not xgrammar compiles it), each with its location relative to ``node``."""
    found: list[tuple[tuple[str, ...], dict[str, Any]]] = []
    for key in _ONE_SUBSCHEMA:
        value = node.get(key)
        if isinstance(value, dict):
            found.append(((key,), value))
    for key in _SUBSCHEMA_LISTS:
        value = node.get(key)
        if isinstance(value, list):
            found.extend(((key, str(i)), x) for i, x in enumerate(value) if isinstance(x, dict))
    for key in _SUBSCHEMA_MAPS:
        value = node.get(key)
        if isinstance(value, dict):
            found.extend(((key, str(name)), x) for name, x in value.items() if isinstance(x, dict))
    return found


def _short_pointer(loc: tuple[str, ...]) -> str:
    text = _pointer(loc)
    return text if len(text) <= 200 else text[:197] + "..."


def _too_deep(loc: tuple[str, ...]) -> ValueError:
    return ValueError(
        f"the schema is nested too deeply: more than {MAX_SCHEMA_DEPTH} levels of subschemas "
        f"(anyOf, items, properties, $ref...) at {_short_pointer(loc)}"
    )


MAX_ENUM_VALUES = 2048
"""Most ``enum`` values in a schema, all its ``enum`` lists together: as a ``choice``'s options
(:data:`surge.structured.validate.MAX_CHOICE_OPTIONS`), every row under the grammar pays for them at
every step (10,000 strings: about 7 ms per row and step on a 2-core machine)."""
MAX_ENUM_CHARS = 65_536
"""Most characters of a schema's ``enum`` and ``const`` values together, as JSON text (a
1,000,000-character ``const`` took 16 s to compile and 280 MB with Qwen3's vocabulary)."""


def _check_nesting(schema: Any) -> None:
    """Refuse a schema deeper than :data:`MAX_SCHEMA_DEPTH` (following local ``$ref``), with more
    than :data:`MAX_SUBSCHEMAS` subschemas, whose nesting costs more than
    :data:`MAX_NESTING_COST` to compile, whose optional properties cost more than
    :data:`MAX_OPTIONAL_PROPERTY_COST`, or with more than :data:`MAX_ENUM_VALUES` ``enum``
    and ``const`` values or :data:`MAX_ENUM_CHARS` characters of them; linear in the schema's
    size."""
    if not isinstance(schema, dict):
        return
    cost = 0
    count = 0
    optional_cost = 0
    enum_values = enum_chars = 0
    has_ref = False
    stack: list[tuple[dict[str, Any], tuple[str, ...], int]] = [(schema, (), 0)]
    while stack:  # the document's own tree, without following $ref
        node, loc, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise _too_deep(loc)
        count += 1
        if count > MAX_SUBSCHEMAS:
            raise ValueError(
                f"the schema has more than {MAX_SUBSCHEMAS:,} subschemas (anyOf branches, properties, "
                f"items...; the one past the limit at {_short_pointer(loc)}): split the task or simplify the schema"
            )
        cost += depth * depth
        if cost > MAX_NESTING_COST:
            raise ValueError(
                f"the schema is too large and too deeply nested to compile quickly: its subschemas' "
                f"depths squared sum to more than {MAX_NESTING_COST:,} (at {_short_pointer(loc)}); "
                "flatten it, or move nested subschemas into $defs and $ref them"
            )
        _check_values(node, loc)
        properties = node.get("properties")
        if isinstance(properties, dict) and properties:
            required = node.get("required")
            named = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
            optional = sum(1 for name in properties if name not in named)
            optional_cost += optional * optional
            if optional_cost > MAX_OPTIONAL_PROPERTY_COST:
                raise ValueError(
                    f"the schema has too many optional properties to compile quickly: the squares of its "
                    f"objects' counts of properties not in 'required' sum to more than "
                    f"{MAX_OPTIONAL_PROPERTY_COST:,} (one object of 500; {optional:,} at "
                    f"{_short_pointer(loc)}): list more of them in 'required' (allowing null where a "
                    "value may be missing, as OpenAI's strict mode does) or split the schema"
                )
        enum = node.get("enum")
        values = enum if isinstance(enum, list) else [node["const"]] if "const" in node else None
        if values is not None:
            enum_values += len(values)
            enum_chars += sum(len(json.dumps(v, ensure_ascii=False)) for v in values)
            if enum_values > MAX_ENUM_VALUES or enum_chars > MAX_ENUM_CHARS:
                raise ValueError(
                    f"the schema's enum lists and const values hold more than {MAX_ENUM_VALUES:,} values "
                    f"or {MAX_ENUM_CHARS:,} characters together (at {_short_pointer(loc)}): every token "
                    "generated under the grammar pays for them, and a long literal is slow to compile"
                )
        has_ref = has_ref or isinstance(node.get("$ref"), str)
        stack.extend((sub, (*loc, *part), depth + 1) for part, sub in reversed(_subschemas(node)))
    if has_ref:
        _RefDepth(schema).height(schema, (), 0)


_COUNT_KEYWORDS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)
_COUNT_MAX = 2**31 - 1
"""The largest length or count xgrammar 0.2.9 takes."""
_BOUND_PAIRS = (
    ("minLength", "maxLength"),
    ("minItems", "maxItems"),
    ("minProperties", "maxProperties"),
    ("minContains", "maxContains"),
    ("minimum", "maximum"),
)


def _short_value(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_values(node: dict[str, Any], loc: tuple[str, ...]) -> None:
    """Refuse keyword values that are malformed or contradict each other: a length or count that
    is not a non-negative integer (xgrammar reads ``maxLength: -1`` as no limit, fails on
    ``minLength: -3`` with an assertion, and takes ``minItems: -1``), a minimum above its maximum,
    a ``pattern`` or ``format`` that is not a string, a ``required`` that is not a list of strings.
    Checked on every subschema, compiled or not."""
    for keyword in _COUNT_KEYWORDS:
        if keyword in node:
            value = node[keyword]
            if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _COUNT_MAX):
                raise ValueError(
                    f"keyword {keyword!r} at {_short_pointer(loc)} must be a non-negative integer "
                    f"(at most {_COUNT_MAX}), got {_short_value(value)}"
                )
    for low, high in _BOUND_PAIRS:
        lo, hi = node.get(low), node.get(high)
        if _is_number(lo) and _is_number(hi) and lo > hi:
            raise ValueError(
                f"keyword {low!r} at {_short_pointer(loc)} is greater than {high!r} "
                f"({_short_value(lo)} > {_short_value(hi)}): no value matches"
            )
    for keyword in ("pattern", "format"):
        if keyword in node and not isinstance(node[keyword], str):
            raise ValueError(
                f"keyword {keyword!r} at {_short_pointer(loc)} must be a string, got {_short_value(node[keyword])}"
            )
    required = node.get("required")
    if "required" in node and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        raise ValueError(
            f"keyword 'required' at {_short_pointer(loc)} must be a list of strings, got {_short_value(required)}"
        )


class _RefDepth:
    """The depth of a schema with its local ``$ref`` targets counted as subschemas."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.heights: dict[int, int] = {}  # levels at and below a subschema, by its id
        self.active: set[int] = set()  # the subschemas on the current path (a $ref cycle stops)

    def height(self, node: dict[str, Any], loc: tuple[str, ...], depth: int) -> int:
        """Levels at and below ``node``, found at ``depth``.

        Raises:
            ValueError: a subschema lies deeper than :data:`MAX_SCHEMA_DEPTH`.
        """
        key = id(node)
        known = self.heights.get(key)
        if known is not None:
            if depth + known - 1 > MAX_SCHEMA_DEPTH:
                raise _too_deep(loc)
            return known
        if key in self.active:
            return 0
        if depth > MAX_SCHEMA_DEPTH:
            raise _too_deep(loc)
        self.active.add(key)
        below = 0
        for part, sub in _subschemas(node):
            below = max(below, self.height(sub, (*loc, *part), depth + 1))
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            found = _resolve(self.root, ref)
            if found is not None and isinstance(found[0], dict):
                below = max(below, self.height(found[0], found[1], depth + 1))
        self.active.discard(key)
        self.heights[key] = below + 1
        return below + 1


# --- JSON schema walk ----------------------------------------------------------------------


def _pointer(loc: tuple[str, ...]) -> str:
    return "#" + "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in loc)


def _unsupported(loc: tuple[str, ...], keyword: str, why: str) -> ValueError:
    return ValueError(f"keyword {keyword!r} at {_pointer(loc)} is not supported: {why}")


def _resolve(root: Any, ref: str) -> tuple[Any, tuple[str, ...]] | None:
    """The subschema a local ``$ref`` (``#`` or ``#/...``) points at and its location, or None."""
    if ref == "#":
        return root, ()
    node, loc = root, ()
    for raw in ref[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
        loc = (*loc, part)
    return node, loc


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _json_type(value: Any) -> str:
    """The JSON Schema type of a JSON value (a whole float is an integer)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: ``1 == 1.0``, but ``true != 1``."""
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _json_key(v: Any) -> Any:
    """A hashable key with :func:`_json_equal`'s equality: numbers by value (``1`` and ``1.0``
    alike), booleans apart from numbers, arrays and objects by their keys in order / sorted."""
    if isinstance(v, bool) or v is None:
        return ("b", v)
    if _is_number(v):
        return ("n", int(v) if isinstance(v, float) and v.is_integer() else v)
    if isinstance(v, str):
        return ("s", v)
    if isinstance(v, list):
        return ("a", tuple(_json_key(x) for x in v))
    if isinstance(v, dict):
        return ("o", tuple(sorted((str(k), _json_key(x)) for k, x in v.items())))
    return ("?", repr(v))


def _values_overlap(a: list[Any], b: list[Any]) -> bool:
    """Whether two const/enum value lists share a value (JSON equality), in linear time."""
    keys = {_json_key(x) for x in a}
    return any(_json_key(y) in keys for y in b)


_MAX_ONEOF_BRANCHES = 64
"""Most ``oneOf`` branches checked pair by pair for disjointness (all const/enum branches are
checked in one pass at any count); a larger ``oneOf`` is refused rather than checked in
quadratic time on the request's path."""


def _requires_undeclared(required: list[Any], other: dict[str, Any], other_props: dict[str, Any]) -> bool:
    """Whether an object of a branch requiring ``required`` can never satisfy ``other``, a closed
    object (no ``additionalProperties`` or ``false``, no ``patternProperties``, compiled in strict
    mode) that does not declare one of those names."""
    closed = other.get("additionalProperties", False) is False and "patternProperties" not in other
    return closed and any(isinstance(k, str) and k not in other_props for k in required)


def _types_overlap(a: frozenset[str], b: frozenset[str]) -> bool:
    numeric = {"integer", "number"}
    return any(x == y or (x in numeric and y in numeric) for x in a for y in b)


def _types_within(inner: frozenset[str], outer: frozenset[str]) -> bool:
    return all(t in outer or (t == "integer" and "number" in outer) for t in inner)


def _is_noop(node: dict[str, Any], key: str) -> bool:
    """Whether keyword ``key`` of ``node`` constrains nothing (so dropping it is harmless)."""
    value = node[key]
    if key in ("minLength", "minItems", "minProperties"):
        return _is_number(value) and value == 0
    if key in (
        "required",
        "properties",
        "patternProperties",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
    ):
        return value in ([], {})
    if key == "uniqueItems":
        return value is False
    if key in ("additionalProperties", "unevaluatedProperties", "items", "unevaluatedItems", "propertyNames"):
        return value is True or value == {}
    if key == "if":
        return "then" not in node and "else" not in node
    return False


def _constraints(node: dict[str, Any], keys: tuple[str, ...] = _ASSERTIONS) -> list[str]:
    """The keywords of ``keys`` in ``node`` that constrain the value, in schema order."""
    wanted = set(keys)
    return [k for k in node if k in wanted and not _is_noop(node, k)]


def _declared_types(node: dict[str, Any]) -> frozenset[str] | None:
    """The types of a ``type`` keyword (None when absent or malformed)."""
    t = node.get("type")
    if isinstance(t, str):
        return frozenset((t,))
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        return frozenset(t)
    return None


class _Walker:
    """One walk over a schema: checks each subschema xgrammar would compile, once."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.seen: set[tuple[tuple[str, ...], str | None, bool]] = set()
        self.types: dict[int, frozenset[str] | None] = {}  # types_of by id of the subschema
        self.repeat_cost = 0  # repeat_cost summed over the patterns walked

    # - $ref resolution and the types xgrammar can produce for a subschema -

    def resolve(self, ref: str) -> tuple[Any, tuple[str, ...]] | None:
        """The subschema a local ``$ref`` points at and its location, or None."""
        return _resolve(self.root, ref)

    def target(self, node: Any) -> Any:
        """``node`` with its local ``$ref`` chain followed (None when broken or circular)."""
        for _ in range(64):
            if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)):
                return node
            ref = node["$ref"]
            found = self.resolve(ref) if ref == "#" or ref.startswith("#/") else None
            if found is None:
                return None
            node = found[0]
        return None

    def types_of(self, node: Any) -> frozenset[str] | None:
        """The JSON types xgrammar may generate for ``node``; None for any (or unknown)."""
        node = self.target(node)
        if not isinstance(node, dict):
            return None
        if id(node) in self.types:  # memoized, or None while being computed (a cycle)
            return self.types[id(node)]
        self.types[id(node)] = None
        found = self._types_of(node)
        self.types[id(node)] = found
        return found

    def _types_of(self, node: dict[str, Any]) -> frozenset[str] | None:
        if "const" in node:
            return frozenset((_json_type(node["const"]),))
        if "enum" in node:
            values = node["enum"]
            return frozenset(_json_type(v) for v in values) if isinstance(values, list) else None
        for comb in ("anyOf", "oneOf", "allOf"):
            if comb in node:
                branches = node[comb]
                if not isinstance(branches, list) or not branches or (comb == "allOf" and len(branches) > 1):
                    return None
                found: frozenset[str] = frozenset()
                for branch in branches:
                    t = self.types_of(branch)
                    if t is None:
                        return None
                    found |= t
                return found
        declared = _declared_types(node)
        if declared is not None:
            return declared
        if any(k in node for k in _OBJECT_HINTS):
            return frozenset(("object",))
        if any(k in node for k in _ARRAY_HINTS):
            return frozenset(("array",))
        return None

    def finite_values(self, node: Any) -> list[Any] | None:
        """The values of a ``const`` or ``enum`` subschema (after ``$ref``), or None."""
        node = self.target(node)
        if not isinstance(node, dict):
            return None
        if "const" in node:
            return [node["const"]]
        values = node.get("enum")
        return values if isinstance(values, list) and values else None

    def disjoint(self, a: Any, b: Any) -> bool:
        """Whether no value can satisfy both ``a`` and ``b`` (each as xgrammar generates it):
        their types differ, their const/enum values differ, or both are objects with a
        property both require whose const/enum values differ (a discriminator)."""
        ta, tb = self.types_of(a), self.types_of(b)
        if ta is not None and tb is not None and not _types_overlap(ta, tb):
            return True
        va, vb = self.finite_values(a), self.finite_values(b)
        if va is not None and vb is not None:
            return not _values_overlap(va, vb)
        if ta != frozenset(("object",)) or tb != frozenset(("object",)):
            return False
        na, nb = self.target(a), self.target(b)
        props_a, props_b = na.get("properties"), nb.get("properties")
        req_a, req_b = na.get("required"), nb.get("required")
        if not all(isinstance(x, dict) for x in (props_a, props_b)):
            return False
        if not all(isinstance(x, list) for x in (req_a, req_b)):
            return False
        for key in req_a:
            if not isinstance(key, str) or key not in req_b or key not in props_a or key not in props_b:
                continue
            va, vb = self.finite_values(props_a[key]), self.finite_values(props_b[key])
            if va is not None and vb is not None and not _values_overlap(va, vb):
                return True
        # strict mode (how Surge compiles schemas): an object without additionalProperties
        # takes no undeclared key, so a property one branch requires and the other does not
        # declare tells them apart (a discriminator with a default, for instance)
        return _requires_undeclared(req_a, nb, props_b) or _requires_undeclared(req_b, na, props_a)

    # - the walk -

    def walk(self, node: Any, loc: tuple[str, ...], default_type: str | None, nested_id: bool) -> None:
        """Check ``node`` (at ``loc``) and the subschemas xgrammar compiles with it.

        ``default_type`` is the type xgrammar assumes for a schema without one (``string``
        under ``propertyNames``); ``nested_id`` tells that a ``$id`` below the root encloses it.

        Raises:
            ValueError: as :func:`check_json_schema`.
        """
        if not isinstance(node, dict):
            return  # true, false (xgrammar rejects false) or malformed (xgrammar rejects it)
        key = (loc, default_type, nested_id)
        if key in self.seen:
            return
        self.seen.add(key)
        if loc and "$id" in node:
            nested_id = True
        if "not" in node:
            raise _unsupported(loc, "not", "the grammar cannot exclude the values of a subschema")
        if "if" in node and not _is_noop(node, "if"):
            raise _unsupported(loc, "if", "conditional subschemas (if/then/else) are not enforced")
        for keyword in ("$dynamicRef", "$recursiveRef"):
            if keyword in node:
                raise _unsupported(loc, keyword, "only local $ref is supported")
        if "$ref" in node:
            self.walk_ref(node, loc, default_type, nested_id)
        elif "const" in node or "enum" in node:
            self.check_literal(node, loc)
        elif any(c in node for c in ("anyOf", "oneOf", "allOf")):
            self.walk_combinator(node, loc, default_type, nested_id)
        else:
            self.walk_typed(node, loc, default_type, nested_id)

    def check_siblings(self, node: dict[str, Any], loc: tuple[str, ...], used: str, types: Any) -> None:
        """Refuse the assertions next to ``used`` (which alone decides the grammar); a ``type``
        is accepted when ``types`` (what ``used`` generates) already fits it."""
        for keyword in _constraints(node):
            if keyword == used:
                continue
            if keyword == "type":
                declared = _declared_types(node)
                if declared is not None and types is not None and _types_within(types, declared):
                    continue
                why = f"'type' next to {used!r} is ignored (put it in the {used} subschema)"
            else:
                why = f"it is ignored next to {used!r} (move it into the {used} subschema)"
            raise _unsupported(loc, keyword, why)

    def walk_ref(
        self, node: dict[str, Any], loc: tuple[str, ...], default_type: str | None, nested_id: bool
    ) -> None:
        ref = node["$ref"]
        if not isinstance(ref, str):
            return  # xgrammar: "$ref must be a string"
        if ref != "#" and not ref.startswith("#/"):
            raise _unsupported(loc, "$ref", f"{ref!r} is not a local reference ('#' or '#/...')")
        if nested_id:
            raise _unsupported(loc, "$ref", "a $ref under a nested $id is resolved against the root schema")
        self.check_siblings(node, loc, "$ref", self.types_of(node))
        found = self.resolve(ref)
        if found is not None:  # else xgrammar: "Cannot find field"
            self.walk(found[0], found[1], default_type, False)

    def check_literal(self, node: dict[str, Any], loc: tuple[str, ...]) -> None:
        used = "const" if "const" in node else "enum"
        values = [node["const"]] if used == "const" else node["enum"]
        if not isinstance(values, list):
            return  # xgrammar: "enum must be an array"
        if used == "const" and "enum" in node:
            enum = node["enum"]
            if not isinstance(enum, list) or not any(_json_equal(values[0], v) for v in enum):
                raise _unsupported(
                    loc, "enum", "it is ignored next to 'const' (the const value is not in it)"
                )
            node = {k: v for k, v in node.items() if k != "enum"}
        self.check_siblings(node, loc, used, frozenset(_json_type(v) for v in values))

    def walk_combinator(
        self, node: dict[str, Any], loc: tuple[str, ...], default_type: str | None, nested_id: bool
    ) -> None:
        used = next(c for c in ("anyOf", "oneOf", "allOf") if c in node)
        self.check_siblings(node, loc, used, self.types_of(node))
        branches = node[used]
        if not isinstance(branches, list):
            return  # xgrammar: "anyOf must be an array"
        if not branches and used != "allOf":
            raise _unsupported(loc, used, "an empty list accepts no value")
        if used == "allOf" and len(branches) > 1:
            raise _unsupported(loc, "allOf", "only an allOf of one schema is enforced (merge the schemas)")
        if used == "oneOf":
            finite = [self.finite_values(b) for b in branches]
            if all(v is not None for v in finite):  # const/enum branches: one pass over the values
                owner: dict[Any, int] = {}
                for i, values in enumerate(finite):
                    for key in {_json_key(x) for x in values or ()}:
                        j = owner.setdefault(key, i)
                        if j != i:
                            raise _unsupported(
                                loc,
                                "oneOf",
                                f"branches {j} and {i} share a value and only anyOf semantics are enforced",
                            )
                branches_to_pair: list[Any] = []
            elif len(branches) > _MAX_ONEOF_BRANCHES:
                raise _unsupported(
                    loc,
                    "oneOf",
                    f"{len(branches)} branches are more than the {_MAX_ONEOF_BRANCHES} checked for disjointness "
                    "(only anyOf semantics are enforced: use anyOf)",
                )
            else:
                branches_to_pair = branches
            for i, a in enumerate(branches_to_pair):
                for j in range(i + 1, len(branches_to_pair)):
                    if not self.disjoint(a, branches_to_pair[j]):
                        raise _unsupported(
                            loc,
                            "oneOf",
                            f"branches {i} and {j} may both match and only anyOf semantics are enforced "
                            "(use anyOf, or make the branches differ by type or by a required const/enum "
                            "property)",
                        )
        for i, branch in enumerate(branches):
            self.walk(branch, (*loc, used, str(i)), default_type, nested_id)

    def walk_typed(
        self, node: dict[str, Any], loc: tuple[str, ...], default_type: str | None, nested_id: bool
    ) -> None:
        types: frozenset[str] | None
        if "type" in node:
            types = _declared_types(node)
            if types is None:
                return  # xgrammar: "Type should be a string"
            if not types:
                raise _unsupported(loc, "type", "an empty list of types accepts no value")
        elif default_type is not None:
            types = frozenset((default_type,))
        elif any(k in node for k in _OBJECT_HINTS):
            types = frozenset(("object",))
        elif any(k in node for k in _ARRAY_HINTS):
            types = frozenset(("array",))
        else:
            types = None
        if types is None:
            keywords = _constraints(
                node, _STRING_KEYWORDS + _NUMBER_KEYWORDS + _ARRAY_KEYWORDS + _OBJECT_KEYWORDS
            )
            if keywords:
                raise _unsupported(
                    loc,
                    keywords[0],
                    "a schema without 'type' allows any value and its keywords are ignored (add a 'type')",
                )
            return
        if "string" in types:
            self.check_string(node, loc)
        if "integer" in types:
            self.check_integer(node, loc)
        if "number" in types and "multipleOf" in node:
            raise _unsupported(loc, "multipleOf", "it is not enforced on numbers")
        if "array" in types:
            self.walk_array(node, loc, nested_id)
        if "object" in types:
            self.walk_object(node, loc, nested_id)

    def check_string(self, node: dict[str, Any], loc: tuple[str, ...]) -> None:
        fmt = node.get("format")
        # JSON Schema 2020-12 makes ``format`` an annotation unless a validator opts in: a format
        # xgrammar has no regex for (``int64``, ``binary``, ``password``...) asserts nothing here,
        # as in most validators; the ones it knows are enforced
        known = isinstance(fmt, str) and fmt in SUPPORTED_FORMATS
        lengths = _constraints(node, ("minLength", "maxLength"))
        if known and "pattern" in node:
            raise _unsupported(loc, "pattern", f"it is ignored next to format {fmt!r}")
        if known and lengths:
            raise _unsupported(loc, lengths[0], f"it is ignored next to format {fmt!r}")
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            if lengths:
                raise _unsupported(
                    loc, lengths[0], "it is ignored next to 'pattern' (bound the length in the pattern)"
                )
            problem = regex_problem(pattern)
            if problem is not None:
                raise _unsupported(loc, "pattern", problem)
            self.repeat_cost += repeat_cost(pattern)
            if self.repeat_cost > MAX_PATTERN_REPEAT_COST:
                raise _unsupported(
                    loc,
                    "pattern",
                    f"its counted repetitions are too large to compile: the squares of the schema's "
                    f"repetition counts sum to {self.repeat_cost}, at most {MAX_PATTERN_REPEAT_COST} "
                    f"(one {{1,2000}}); use + or * for long runs",
                )

    def check_integer(self, node: dict[str, Any], loc: tuple[str, ...]) -> None:
        m = node.get("multipleOf")
        if not _is_number(m) or m <= 0 or m == 1:
            return  # absent, malformed (xgrammar rejects it), or every integer
        if isinstance(m, float) and (not m.is_integer() or not math.isfinite(m)):
            raise _unsupported(loc, "multipleOf", "a fractional multipleOf is not enforced on integers")
        lo, hi = self.integer_bounds(node)
        bounded = lo is not None and hi is not None and hi - lo + 1 <= INTEGER_MULTIPLE_OF_RANGE_MAX
        if m > INTEGER_MULTIPLE_OF_MAX or not (bounded or (lo is None and hi is None)):
            raise _unsupported(
                loc,
                "multipleOf",
                f"on integers it is enforced only up to {INTEGER_MULTIPLE_OF_MAX}, with no bounds or with "
                f"a minimum and a maximum spanning at most {INTEGER_MULTIPLE_OF_RANGE_MAX:,} integers",
            )

    @staticmethod
    def integer_bounds(node: dict[str, Any]) -> tuple[int | None, int | None]:
        """The smallest and largest integer ``node``'s bounds allow (None: unbounded)."""

        def bound(key: str) -> float | None:
            v = node.get(key)
            return v if _is_number(v) and math.isfinite(v) else None

        lows, highs = [], []
        if (v := bound("minimum")) is not None:
            lows.append(math.ceil(v))
        if (v := bound("exclusiveMinimum")) is not None:
            lows.append(math.floor(v) + 1)
        if (v := bound("maximum")) is not None:
            highs.append(math.floor(v))
        if (v := bound("exclusiveMaximum")) is not None:
            highs.append(math.ceil(v) - 1)
        return (max(lows) if lows else None), (min(highs) if highs else None)

    def walk_array(self, node: dict[str, Any], loc: tuple[str, ...], nested_id: bool) -> None:
        max_items = node.get("maxItems")
        if node.get("uniqueItems") is True and not (_is_number(max_items) and max_items <= 1):
            raise _unsupported(loc, "uniqueItems", "the grammar cannot forbid repeated items")
        if "contains" in node:
            raise _unsupported(loc, "contains", "the grammar cannot require an item matching a subschema")
        prefix = node.get("prefixItems")
        if isinstance(prefix, list):
            for i, item in enumerate(prefix):
                self.walk(item, (*loc, "prefixItems", str(i)), None, nested_id)
        if "items" in node:
            self.walk(node["items"], (*loc, "items"), None, nested_id)
        elif "unevaluatedItems" in node:
            self.walk(node["unevaluatedItems"], (*loc, "unevaluatedItems"), None, nested_id)

    def walk_object(self, node: dict[str, Any], loc: tuple[str, ...], nested_id: bool) -> None:
        props = node.get("properties")
        props = props if isinstance(props, dict) else {}
        required = node.get("required")
        required = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
        for name in required:
            if name not in props:
                raise _unsupported(
                    loc,
                    "required",
                    f"{name!r} is not in 'properties' and only declared properties are required",
                )
        for keyword, why in (
            (
                "patternProperties",
                "property-name patterns are not enforced (list the properties, or use additionalProperties)",
            ),
            ("dependentRequired", "properties that require others are not enforced"),
            ("dependentSchemas", "properties that require a subschema are not enforced"),
            ("dependencies", "properties that require others are not enforced"),
        ):
            if keyword in node and not _is_noop(node, keyword):
                raise _unsupported(loc, keyword, why)
        if "propertyNames" in node and not _is_noop(node, "propertyNames"):
            if props:
                raise _unsupported(
                    loc,
                    "propertyNames",
                    "the names in 'properties' are not checked against it (drop one of the two)",
                )
            self.walk(node["propertyNames"], (*loc, "propertyNames"), "string", nested_id)
        if "additionalProperties" in node:
            extra = node["additionalProperties"] is not False
        elif "unevaluatedProperties" in node:
            extra = node["unevaluatedProperties"] is not False
        else:
            extra = not props
        min_props = node.get("minProperties")
        if extra and _is_number(min_props) and min_props > len(set(required)):
            raise _unsupported(
                loc,
                "minProperties",
                "other keys are allowed and the grammar cannot stop a key from repeating "
                "(a repeated key would count twice)",
            )
        for name, sub in props.items():
            self.walk(sub, (*loc, "properties", name), None, nested_id)
        if "additionalProperties" in node:
            self.walk(node["additionalProperties"], (*loc, "additionalProperties"), None, nested_id)
        elif "unevaluatedProperties" in node:
            self.walk(node["unevaluatedProperties"], (*loc, "unevaluatedProperties"), None, nested_id)
