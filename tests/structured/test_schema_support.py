"""JSON-schema keywords and regex features that xgrammar does not enforce are refused (a 400 in
the API process), and the ones it enforces are accepted.

Each case is also checked against the installed xgrammar (no tokenizer: the grammar matches
text): a refused keyword's grammar accepts an instance that violates the schema (jsonschema
says so), which is why it is refused; an accepted keyword's grammar rejects an instance that
violates it. An xgrammar upgrade that changes either side fails here.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from surge.sampling_params import StructuredOutputsParams
from surge.structured.regex_support import regex_problem
from surge.structured.schema_support import SUPPORTED_FORMATS, check_json_schema
from surge.structured.validate import build_grammar, check_structured_outputs

xgr_testing = pytest.importorskip("xgrammar.testing")

STR = {"type": "string"}
INT = {"type": "integer"}
SMALL_INTS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 3}}
CAT_DOG = {
    "$defs": {
        "Cat": {
            "type": "object",
            "properties": {"kind": {"const": "cat"}, "lives": INT},
            "required": ["kind", "lives"],
        },
        "Dog": {
            "type": "object",
            "properties": {"kind": {"const": "dog"}, "barks": {"type": "boolean"}},
            "required": ["kind", "barks"],
        },
    },
    "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
    "discriminator": {"propertyName": "kind"},
}
DRAFT7 = "http://json-schema.org/draft-07/schema#"

# (id, schema, refused keyword, its location, text of an instance that violates the schema and
# that xgrammar's grammar accepts; None where xgrammar rejects the schema itself or no instance
# can show it)
REFUSED: list[tuple[str, dict[str, Any], str, str, str | None]] = [
    ("negative lookahead", {"type": "string", "pattern": "^(?!ab)[a-z]+$"}, "pattern", "#", '"ab"'),
    ("lookahead", {"type": "string", "pattern": "^(?=.*1)[a-z0-9]+$"}, "pattern", "#", '"abc"'),
    ("lookbehind", {"type": "string", "pattern": "^[a-z](?<=a)$"}, "pattern", "#", None),
    ("backreference", {"type": "string", "pattern": "^(a)\\1$"}, "pattern", "#", None),
    ("word boundary", {"type": "string", "pattern": "^a\\b"}, "pattern", "#", None),
    ("unicode property", {"type": "string", "pattern": "^\\p{L}+$"}, "pattern", "#", None),
    ("inline flag", {"type": "string", "pattern": "^(?i)abc$"}, "pattern", "#", None),
    ("'^' in the middle", {"type": "string", "pattern": "a^b"}, "pattern", "#", '"ab"'),
    ("'$' in the middle", {"type": "string", "pattern": "a$b"}, "pattern", "#", '"ab"'),
    ("anchor in a repeated group", {"type": "string", "pattern": "^(^a)+$"}, "pattern", "#", '"aa"'),
    ("unknown escape", {"type": "string", "pattern": "^a\\Z"}, "pattern", "#", '"aZ"'),
    ("digit escape in a class", {"type": "string", "pattern": "^[\\1]$"}, "pattern", "#", '"1"'),
    (
        "pattern and maxLength",
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 2},
        "maxLength",
        "#",
        '"abc"',
    ),
    (
        "pattern and minLength",
        {"type": "string", "pattern": "^[a-z]+$", "minLength": 3},
        "minLength",
        "#",
        '"ab"',
    ),
    (
        "format and pattern",
        {"type": "string", "format": "date", "pattern": "^1"},
        "pattern",
        "#",
        '"2024-01-02"',
    ),
    (
        "format and maxLength",
        {"type": "string", "format": "date", "maxLength": 5},
        "maxLength",
        "#",
        '"2024-01-02"',
    ),
    ("multipleOf on a number", {"type": "number", "multipleOf": 0.5}, "multipleOf", "#", "1.25"),
    ("multipleOf, one bound", {"type": "integer", "multipleOf": 3, "minimum": 0}, "multipleOf", "#", "4"),
    (
        "multipleOf, wide range",
        {"type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 10000},
        "multipleOf",
        "#",
        "4",
    ),
    ("multipleOf above 1024", {"type": "integer", "multipleOf": 1025}, "multipleOf", "#", "1"),
    ("fractional multipleOf", {"type": "integer", "multipleOf": 1.5}, "multipleOf", "#", "4"),
    ("uniqueItems", {**SMALL_INTS, "uniqueItems": True, "minItems": 4}, "uniqueItems", "#", "[1, 1, 1, 1]"),
    ("contains", {**SMALL_INTS, "contains": {"const": 3}}, "contains", "#", "[1]"),
    (
        "patternProperties",
        {"type": "object", "properties": {"a1": STR}, "patternProperties": {"^a": INT}},
        "patternProperties",
        "#",
        '{"a1": "x"}',
    ),
    (
        "propertyNames and properties",
        {"type": "object", "properties": {"abc": INT}, "propertyNames": {"maxLength": 2}},
        "propertyNames",
        "#",
        '{"abc": 1}',
    ),
    (
        "required, undeclared",
        {"type": "object", "properties": {"a": INT}, "required": ["c"]},
        "required",
        "#",
        '{"a": 1}',
    ),
    (
        "dependentRequired",
        {"type": "object", "properties": {"a": INT, "b": INT}, "dependentRequired": {"a": ["b"]}},
        "dependentRequired",
        "#",
        '{"a": 1}',
    ),
    (
        "dependentSchemas",
        {
            "type": "object",
            "properties": {"a": INT, "b": INT},
            "dependentSchemas": {"a": {"required": ["b"]}},
        },
        "dependentSchemas",
        "#",
        '{"a": 1}',
    ),
    (
        "dependencies (draft 7)",
        {
            "$schema": DRAFT7,
            "type": "object",
            "properties": {"a": INT, "b": INT},
            "dependencies": {"a": ["b"]},
        },
        "dependencies",
        "#",
        '{"a": 1}',
    ),
    (
        "minProperties with other keys",
        {"type": "object", "additionalProperties": INT, "minProperties": 2},
        "minProperties",
        "#",
        '{"a": 1, "a": 2}',
    ),
    ("not", {"type": "integer", "not": {"const": 3}}, "not", "#", "3"),
    (
        "if/then/else",
        {"type": "integer", "if": {"minimum": 5}, "then": {"maximum": 6}, "else": {"maximum": 2}},
        "if",
        "#",
        "9",
    ),
    ("allOf of two", {"allOf": [{**STR, "maxLength": 3}, {**STR, "minLength": 2}]}, "allOf", "#", '"a"'),
    ("oneOf overlapping", {"oneOf": [INT, {**INT, "minimum": 0}]}, "oneOf", "#", "1"),
    ("empty anyOf", {"anyOf": []}, "anyOf", "#", None),
    ("type next to anyOf", {"type": "object", "anyOf": [{"required": ["a"]}]}, "type", "#", "5"),
    ("keyword next to anyOf", {"anyOf": [STR, INT], "maxLength": 2}, "maxLength", "#", '"abc"'),
    (
        "keyword next to $ref",
        {"$defs": {"s": STR}, "$ref": "#/$defs/s", "maxLength": 2},
        "maxLength",
        "#",
        '"abc"',
    ),
    ("enum value of another type", {"type": "string", "enum": ["a", 1]}, "type", "#", "1"),
    ("keyword next to enum", {"enum": ["a", "bbb"], "maxLength": 2}, "maxLength", "#", '"bbb"'),
    ("const outside enum", {"const": "a", "enum": ["b"]}, "enum", "#", '"a"'),
    ("no type: minimum", {"minimum": 3}, "minimum", "#", "1"),
    ("no type: required", {"required": ["a"]}, "required", "#", '{"b": 1}'),
    ("no type: format", {"format": "date"}, "format", "#", '"x"'),
    (
        "no type, in a property",
        {"type": "object", "properties": {"n": {"maximum": 3}}, "required": ["n"]},
        "maximum",
        "#/properties/n",
        '{"n": 5}',
    ),
    ("empty type list", {"type": []}, "type", "#", "1"),
    (
        "$ref to an anchor",
        {
            "$defs": {"s": {"$anchor": "S", **STR}},
            "type": "object",
            "properties": {"a": {"$ref": "#S"}},
            "required": ["a"],
        },
        "$ref",
        "#/properties/a",
        '{"a": 1}',
    ),
    (
        "remote $ref",
        {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}},
        "$ref",
        "#/properties/a",
        None,
    ),
    (
        "$ref under a nested $id",
        {
            "type": "object",
            "properties": {"a": {"$id": "http://example.com/a", "$defs": {"s": INT}, "$ref": "#/$defs/s"}},
            "required": ["a"],
            "$defs": {"s": STR},
        },
        "$ref",
        "#/properties/a",
        '{"a": "x"}',
    ),
    ("$dynamicRef", {"$dynamicRef": "#meta"}, "$dynamicRef", "#", None),
    # where: the location names the subschema
    (
        "in a property",
        {"type": "object", "properties": {"tags": {**SMALL_INTS, "uniqueItems": True}}, "required": ["tags"]},
        "uniqueItems",
        "#/properties/tags",
        '{"tags": [1, 1]}',
    ),
    (
        "in a $defs entry",
        {
            "$defs": {"Tags": {**SMALL_INTS, "uniqueItems": True}},
            "type": "object",
            "properties": {"t": {"$ref": "#/$defs/Tags"}},
        },
        "uniqueItems",
        "#/$defs/Tags",
        '{"t": [1, 1]}',
    ),
    (
        "in an anyOf branch",
        {"anyOf": [INT, {**SMALL_INTS, "uniqueItems": True}]},
        "uniqueItems",
        "#/anyOf/1",
        "[2, 2]",
    ),
    (
        "in items",
        {"type": "array", "items": {"type": "number", "multipleOf": 0.5}},
        "multipleOf",
        "#/items",
        "[0.3]",
    ),
    (
        "in prefixItems",
        {"type": "array", "prefixItems": [{"type": "string", "pattern": "a$b"}]},
        "pattern",
        "#/prefixItems/0",
        '["ab"]',
    ),
    (
        "in additionalProperties",
        {"type": "object", "additionalProperties": {"not": INT}},
        "not",
        "#/additionalProperties",
        '{"x": 1}',
    ),
    (
        "in propertyNames",
        {"type": "object", "propertyNames": {"pattern": "^(?!ab)[a-z]+$"}},
        "pattern",
        "#/propertyNames",
        '{"ab": 1}',
    ),
    (
        "escaped location",
        {"type": "object", "properties": {"a/b~c": {"type": "number", "multipleOf": 2}}},
        "multipleOf",
        "#/properties/a~1b~0c",
        '{"a/b~c": 3}',
    ),
    (
        "in tool-call style nesting",
        {"type": "array", "items": {"anyOf": [{"type": "object", "properties": {"p": {"not": STR}}}]}},
        "not",
        "#/items/anyOf/0/properties/p",
        '[{"p": "x"}]',
    ),
]

# (id, schema, an instance that satisfies it, one that violates a keyword; the grammar accepts
# the first and rejects the second)
ACCEPTED: list[tuple[str, Any, str, str | None]] = [
    ("unknown format is an annotation", {**STR, "format": "int64"}, '"x"', None),
    (
        "oneOf told apart by a required property the other branch lacks (strict mode)",
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"kind": {"const": "cat", "default": "cat"}, "meow": {"type": "integer"}},
                    "required": ["meow"],
                },
                {
                    "type": "object",
                    "properties": {"kind": {"const": "dog", "default": "dog"}, "bark": {"type": "integer"}},
                    "required": ["bark"],
                },
            ]
        },
        '{"kind": "cat", "meow": 1}',
        '{"meow": 1, "bark": 2}',
    ),
    ("minLength/maxLength", {**STR, "minLength": 2, "maxLength": 3}, '"ab"', '"abcd"'),
    ("pattern", {**STR, "pattern": "^[a-c]+$"}, '"abc"', '"abd"'),
    ("pattern with end anchors in alternatives", {**STR, "pattern": "^a$|^(b|c)$"}, '"c"', '"ab"'),
    (
        "pattern with groups and quantifiers",
        {**STR, "pattern": "^(?:ab){1,2}(?P<x>c)?\\d+?\\.[^\\s]$"},
        '"abc1.x"',
        '"ab1. "',
    ),
    ("leading case-insensitive flag", {**STR, "pattern": "(?i)^abc$"}, '"ABC"', '"x"'),
    ("minLength 0 next to pattern", {**STR, "pattern": "^a+$", "minLength": 0}, '"a"', '"b"'),
    ("integer bounds", {**INT, "minimum": -2, "maximum": 5}, "5", "6"),
    ("integer exclusive bounds", {**INT, "exclusiveMinimum": -2, "exclusiveMaximum": 5}, "4", "5"),
    ("number bounds", {"type": "number", "minimum": -2.5, "exclusiveMaximum": 5.5}, "5.25", "5.5"),
    ("integer multipleOf", {**INT, "multipleOf": 3}, "-6", "7"),
    ("integer multipleOf in a range", {**INT, "multipleOf": 3, "minimum": 0, "maximum": 9999}, "9", "10"),
    ("integer multipleOf 1024", {**INT, "multipleOf": 1024}, "2048", "2049"),
    ("integer multipleOf 1", {**INT, "multipleOf": 1, "minimum": 0}, "4", "-1"),
    ("enum", {"enum": ["a", 1, None]}, "1", '"b"'),
    ("enum and type", {**STR, "enum": ["a", "b"], "title": "Letter"}, '"a"', '"c"'),
    ("const and type", {**INT, "const": 3}, "3", "4"),
    ("const in enum", {"const": "a", "enum": ["a", "b"]}, '"a"', '"b"'),
    ("minItems/maxItems", {**SMALL_INTS, "minItems": 1, "maxItems": 2}, "[1, 2]", "[1, 2, 3]"),
    ("uniqueItems false", {**SMALL_INTS, "uniqueItems": False}, "[1, 1]", "[4]"),
    ("uniqueItems with maxItems 1", {**SMALL_INTS, "uniqueItems": True, "maxItems": 1}, "[1]", "[1, 1]"),
    ("prefixItems", {"type": "array", "prefixItems": [STR, INT], "items": False}, '["a", 1]', '["a", 1, 2]'),
    (
        "unevaluatedItems",
        {"type": "array", "prefixItems": [STR], "unevaluatedItems": INT},
        '["a", 1]',
        '["a", "b"]',
    ),
    ("minContains without contains", {**SMALL_INTS, "minContains": 0}, "[1]", "[5]"),
    (
        "required",
        {"type": "object", "properties": {"a": INT, "b": STR}, "required": ["a"]},
        '{"a": 1}',
        '{"b": "x"}',
    ),
    (
        "additionalProperties false",
        {"type": "object", "properties": {"a": INT}, "additionalProperties": False},
        '{"a": 1}',
        '{"c": 1}',
    ),
    (
        "additionalProperties schema",
        {"type": "object", "additionalProperties": INT},
        '{"c": 1}',
        '{"c": "x"}',
    ),
    (
        "unevaluatedProperties false",
        {"type": "object", "properties": {"a": INT}, "unevaluatedProperties": False},
        '{"a": 1}',
        '{"c": 1}',
    ),
    (
        "min/maxProperties",
        {"type": "object", "properties": {"a": INT, "b": INT}, "minProperties": 1, "maxProperties": 1},
        '{"a": 1}',
        '{"a": 1, "b": 2}',
    ),
    (
        "propertyNames",
        {"type": "object", "propertyNames": {"pattern": "^[a-c]+$"}, "additionalProperties": INT},
        '{"ab": 1}',
        '{"xy": 1}',
    ),
    ("object without type", {"properties": {"a": INT}, "required": ["a"]}, '{"a": 1}', '{"a": "x"}'),
    ("array without type", {"items": INT}, "[1]", '["x"]'),
    ("type list", {"type": ["string", "integer"], "maxLength": 2, "minimum": 0}, '"ab"', "-1"),
    (
        "nullable object",
        {"type": ["object", "null"], "properties": {"a": INT}, "required": ["a"]},
        "null",
        "{}",
    ),
    (
        "$ref and $defs",
        {"$defs": {"s": {**STR, "maxLength": 2}}, "$ref": "#/$defs/s", "description": "d"},
        '"ab"',
        '"abc"',
    ),
    (
        "definitions",
        {"definitions": {"s": STR}, "type": "object", "properties": {"a": {"$ref": "#/definitions/s"}}},
        '{"a": "x"}',
        '{"a": 1}',
    ),
    (
        "recursive $ref",
        {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}},
        '{"next": {"next": null}}',
        '{"next": 1}',
    ),
    ("type next to $ref that fits", {"$defs": {"s": STR}, "$ref": "#/$defs/s", "type": "string"}, '"a"', "1"),
    ("anyOf", {"anyOf": [STR, {"type": "null"}], "default": None, "title": "T"}, "null", "1"),
    ("oneOf by type", {"oneOf": [{**STR, "maxLength": 3}, {**INT, "minimum": 0}]}, "1", "-1"),
    ("oneOf by const", {"oneOf": [{"const": 1}, {"enum": [2, 3]}]}, "2", "4"),
    ("oneOf by discriminator", CAT_DOG, '{"kind": "cat", "lives": 9}', '{"kind": "dog", "lives": 9}'),
    ("allOf of one", {"allOf": [{**STR, "maxLength": 2}]}, '"ab"', '"abc"'),
    (
        "annotations",
        {**STR, "title": "t", "description": "d", "examples": ["a"], "$comment": "c", "deprecated": False},
        '"a"',
        "1",
    ),
    ("unknown keywords", {**INT, "x-unit": "kg", "nullable": False}, "1", '"a"'),
    ("dangling then", {**INT, "then": {"maximum": 0}}, "5", '"a"'),
    ("true", True, "1", None),
    ("empty schema", {}, '{"a": [1]}', None),
    (
        "$id at the root",
        {"$id": "https://example.com/s.json", "$defs": {"s": INT}, "$ref": "#/$defs/s"},
        "1",
        '"a"',
    ),
]
ACCEPTED += [
    (f"format {fmt}", {**STR, "format": fmt}, json.dumps(ok), '"x y"')
    for fmt, ok in {
        "date": "2024-01-02",
        "time": "03:04:05Z",
        "date-time": "2024-01-02T03:04:05Z",
        "duration": "P1D",
        "email": "a@b.co",
        "hostname": "example.com",
        "ipv4": "1.2.3.4",
        "ipv6": "::1",
        "uri": "http://a.b/c",
        "uri-reference": "/a/b",
        "uri-template": "http://a/{x}",
        "uuid": "123e4567-e89b-12d3-a456-426614174000",
        "json-pointer": "/a/b",
        "relative-json-pointer": "0/a",
    }.items()
]


def _xgrammar_grammar(schema: Any) -> Any:
    """The grammar xgrammar builds for ``schema`` with build_grammar's settings, unchecked."""
    import xgrammar as xgr

    return xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)


def _grammar_accepts(schema: Any, text: str) -> bool:
    return bool(xgr_testing._is_grammar_accept_string(_xgrammar_grammar(schema), text))


def _schema_valid(schema: Any, text: str) -> bool:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(json.loads(text))


@pytest.mark.parametrize(
    ("schema", "keyword", "where", "bad"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_refused_keyword_names_keyword_and_location(
    schema: dict[str, Any], keyword: str, where: str, bad: str | None
) -> None:
    with pytest.raises(ValueError, match=re.escape(f"keyword {keyword!r} at {where} is not supported: ")):
        check_json_schema(schema)
    with pytest.raises(ValueError, match=re.escape(f"keyword {keyword!r} at {where}")):
        check_structured_outputs(StructuredOutputsParams(json=json.dumps(schema)))


@pytest.mark.parametrize(
    ("schema", "bad"), [(c[1], c[4]) for c in REFUSED if c[4]], ids=[c[0] for c in REFUSED if c[4]]
)
def test_refused_keyword_is_not_enforced_by_xgrammar(schema: dict[str, Any], bad: str) -> None:
    """Why it is refused: the grammar accepts an instance that violates the schema."""
    assert not _schema_valid(schema, bad)
    assert _grammar_accepts(schema, bad)


XGRAMMAR_REJECTS = ("lookbehind", "backreference", "word boundary", "unicode property", "inline flag")


@pytest.mark.parametrize("schema", [c[1] for c in REFUSED if c[0] in XGRAMMAR_REJECTS], ids=XGRAMMAR_REJECTS)
def test_refused_regex_features_that_xgrammar_rejects_too(schema: dict[str, Any]) -> None:
    """These were 400s already (xgrammar's own error); the new message names the location."""
    with pytest.raises(Exception, match="Regex parsing error"):
        _xgrammar_grammar(schema)


@pytest.mark.parametrize(("schema", "good", "bad"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_accepted_keyword_is_enforced_by_xgrammar(schema: Any, good: str, bad: str | None) -> None:
    check_json_schema(schema)
    grammar = build_grammar(StructuredOutputsParams(json=json.dumps(schema)))
    assert _schema_valid(schema, good)
    assert xgr_testing._is_grammar_accept_string(grammar, good)
    if bad is not None:
        assert not xgr_testing._is_grammar_accept_string(grammar, bad)


def test_supported_formats_are_the_ones_xgrammar_turns_into_a_regex() -> None:
    for fmt in (*SUPPORTED_FORMATS, "regex", "idn-email", "iri", "byte"):
        enforced = not _grammar_accepts({**STR, "format": fmt}, '"x y"')
        assert enforced == (fmt in SUPPORTED_FORMATS), fmt


def test_integer_multiple_of_limits_match_xgrammar() -> None:
    """The widest range and the largest multipleOf accepted are enforced; one more is not."""
    widest = {**INT, "multipleOf": 3, "minimum": -5000, "maximum": 4999}  # 10,000 integers
    too_wide = {**widest, "maximum": 5000}
    check_json_schema(widest)
    assert not _grammar_accepts(widest, "4")
    with pytest.raises(ValueError, match="'multipleOf' at #"):
        check_json_schema(too_wide)
    assert _grammar_accepts(too_wide, "4")
    check_json_schema({**INT, "multipleOf": 3, "exclusiveMinimum": -1, "exclusiveMaximum": 10000})
    with pytest.raises(ValueError, match="'multipleOf' at #"):
        check_json_schema({**INT, "multipleOf": 3, "exclusiveMinimum": -1, "exclusiveMaximum": 10001})
    check_json_schema({**INT, "multipleOf": 1024})
    assert not _grammar_accepts({**INT, "multipleOf": 1024}, "1")
    with pytest.raises(ValueError, match="'multipleOf' at #"):
        check_json_schema({**INT, "multipleOf": 1025})


REGEX_REFUSED = [
    ("(?=a)a", "lookahead"),
    ("a(?!b)", "lookahead"),
    ("(?<=a)b", "lookbehind"),
    ("(?<!a)b", "lookbehind"),
    ("(a)\\1", "backreference"),
    ("(?<n>a)\\k<n>", "named backreference"),
    ("(?P<n>a)(?P=n)", "backreference"),
    ("\\bword", "word boundary"),
    ("a\\Bb", "word boundary"),
    ("\\p{L}", "Unicode property"),
    ("[\\P{L}]", "Unicode property"),
    ("a(?i)b", "inline flag"),
    ("(?s)a.b", "inline flag"),
    ("(?>a)", "group modifier"),
    ("\\A", "escape '\\A'"),
    ("a\\z", "escape '\\z'"),
    ("\\e", "control character"),
    ("[\\3]", "digit escape"),
    ("a^b", "'^' at position 1"),
    ("(a)^b", "'^' at position 3"),
    ("a?^b", "'^'"),
    ("x(^a)", "'^'"),
    ("a$b", "'$' before position 2"),
    ("(a$|b)c", "'$'"),
    ("(^a)+", "repeated group"),
    ("(a$){2}", "repeated group"),
    ("^*a", "quantified anchor"),
    ("\\ud83d\\ude00", "surrogate escape '\\ud83d'"),  # 😀 spelled as a surrogate pair
    ("x[\\ud800-\\udbff][\\uDC00-\\uDFFF]", "surrogate escape '\\ud800' (no UTF-8 text holds one"),
]
REGEX_ACCEPTED = [
    "\\d{3}-\\d{4}",
    "^abc$",
    "^a$|^b$",
    "a|^b",
    "(^a|b$)",
    "^(a|b)$",
    "(?:^a)$",
    "(^a)?b",
    "[\\^$]+\\$\\^",
    "[^a-z]",
    "[\\b\\d\\w\\s\\-\\]]",
    "\\x41\\u0041\\t\\n\\.\\/\\0",
    "(?<n>a)(?P<m>b)(?:c)",
    "a{2,}?b*+c??",
    "[(?=x)]",
    "\\(?=",
    "a{",
    "(?i)abc",
]


@pytest.mark.parametrize(("pattern", "words"), REGEX_REFUSED)
def test_regex_problem_finds_what_xgrammar_drops(pattern: str, words: str) -> None:
    problem = regex_problem(pattern)
    assert problem is not None and words in problem, problem
    with pytest.raises(ValueError, match="unsupported regex"):
        check_structured_outputs(StructuredOutputsParams(regex=pattern))


@pytest.mark.parametrize("pattern", REGEX_ACCEPTED)
def test_regex_problem_accepts_what_xgrammar_enforces(pattern: str) -> None:
    assert regex_problem(pattern) is None


def test_surrogate_escapes_never_match_the_character_they_spell() -> None:
    """Why a surrogate escape is refused: JSON Schema's regexes (ECMA-262) read a pair as the
    character it spells, xgrammar each half as a code point of its own, so the pair never
    matches 😀 (the model wrote bytes that are not UTF-8 instead)."""
    import xgrammar as xgr

    assert not xgr_testing._is_grammar_accept_string(xgr.Grammar.from_regex("\\ud83d\\ude00"), "\U0001f600")
    schema = {"type": "string", "pattern": "\\ud83d\\ude00"}
    with pytest.raises(ValueError, match="surrogate escape"):
        check_structured_outputs(StructuredOutputsParams(json=json.dumps(schema)))
    assert regex_problem("\\u00e9\\ud7ff\\ue000[\\u4e00-\\u9fff]\\\\ud83d") is None


@pytest.mark.parametrize(("regex", "bad"), [("a^b", "ab"), ("a$b", "ab"), ("(^a)+", "aa"), ("a\\Z", "aZ")])
def test_guided_regex_anchor_and_escape_are_ignored_by_xgrammar(regex: str, bad: str) -> None:
    """Why a guided_regex with them is refused: xgrammar matches text the regex does not."""
    import xgrammar as xgr

    assert re.fullmatch(regex, bad) is None
    assert xgr_testing._is_grammar_accept_string(xgr.Grammar.from_regex(regex), bad)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(-3, 3)
    | st.sampled_from(["", "a", "#", "#/a", "^a$"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "properties",
                    "items",
                    "required",
                    "$ref",
                    "anyOf",
                    "oneOf",
                    "allOf",
                    "enum",
                    "const",
                    "pattern",
                    "format",
                    "minimum",
                    "multipleOf",
                    "additionalProperties",
                    "$defs",
                    "a",
                    "string",
                    "object",
                    "integer",
                    "propertyNames",
                    "uniqueItems",
                    "prefixItems",
                    "minProperties",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_check_json_schema_raises_only_value_error(schema: Any) -> None:
    with contextlib.suppress(ValueError):
        check_json_schema(schema)


def test_self_referencing_schemas_terminate() -> None:
    loop = {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/a"}, {"type": "null"}]}}}
    check_json_schema({**loop, "$ref": "#/$defs/a"})
    with pytest.raises(ValueError, match="'oneOf' at #"):
        check_json_schema({**loop, "oneOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]})
    check_json_schema({"$defs": {"x": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"})
    deep: dict[str, Any] = {"type": "integer"}
    for _ in range(5000):
        deep = {"type": "array", "items": deep}
    with pytest.raises(ValueError, match="nested too deeply"):
        check_json_schema(deep)


def test_large_oneof_is_checked_in_linear_time_or_refused() -> None:
    """Disjointness of const/enum branches is one pass over the values (two 20,000-value enums:
    a pairwise comparison would take minutes on the request's path; such enums are now refused
    by the enum limit first, quickly); a oneOf of more than 64 other branches is refused instead
    of compared pair by pair."""
    import time

    start = time.perf_counter()
    with pytest.raises(ValueError, match="enum lists and const values hold more than"):
        check_json_schema({"oneOf": [{"enum": list(range(20_000))}, {"enum": list(range(20_000, 40_000))}]})
    check_json_schema({"oneOf": [{"enum": list(range(1024))}, {"enum": list(range(1024, 2048))}]})
    assert time.perf_counter() - start < 10
    with pytest.raises(ValueError, match="branches 0 and 1 share a value"):
        check_json_schema({"oneOf": [{"enum": [1, 2]}, {"enum": [3, 2.0]}]})
    check_json_schema({"oneOf": [{"enum": [1, "1", True]}, {"enum": [1.5, "2", False, None]}]})
    many = {
        "oneOf": [{"type": "object", "properties": {"k": {"const": i}}, "required": ["k"]} for i in range(65)]
    }
    with pytest.raises(ValueError, match="65 branches are more than the 64"):
        check_json_schema(many)
    check_json_schema({"oneOf": many["oneOf"][:64]})


def test_repeat_cost_counts_expanded_repetitions_only() -> None:
    from surge.structured.regex_support import repeat_cost

    assert repeat_cost("[a-z]{1,2000}") == 2000**2
    assert repeat_cost("a{3}b{2,}c{1,4}") == 9 + 4 + 16  # {m}: m, {m,}: m, {m,n}: n
    assert repeat_cost(r"\{1,5000\}") == 0  # escaped braces are literal
    assert repeat_cost("[{1,5000}]x") == 0  # so are braces in a class
    assert repeat_cost("[]{]{1,10}") == 100  # a class opening with ] ends at the next ]
    assert repeat_cost("(a{1,60}){1,60}") == 2 * 3600
    assert repeat_cost("x{" + "9" * 5000 + "}") == 10**12  # capped, not int() on 5,000 digits
    assert repeat_cost("a+b*c?") == 0


def test_patterns_too_slow_to_compile_are_refused_by_their_summed_cost() -> None:
    """xgrammar's JSON-schema conversion expands counted repetitions in quadratic time
    ({1,20000}: about half a minute): a schema whose patterns' squared counts sum past
    MAX_PATTERN_REPEAT_COST is refused at the pattern that crosses it; the largest accepted
    one compiles."""
    from surge.structured.schema_support import MAX_PATTERN_REPEAT_COST

    assert MAX_PATTERN_REPEAT_COST == 2000**2
    largest = {"type": "string", "pattern": "[a-z]{1,2000}"}
    check_json_schema(largest)
    build_grammar(StructuredOutputsParams(json=json.dumps(largest)))
    with pytest.raises(
        ValueError, match=r"'pattern' at #/properties/b .*too large to compile.*sum to 4500000"
    ):
        check_json_schema(
            {
                "type": "object",
                "properties": {
                    "a": {"type": "string", "pattern": "[a-z]{1,1500}"},
                    "b": {"type": "string", "pattern": "[a-z]{1500}"},
                },
            }
        )
    with pytest.raises(ValueError, match="too large to compile"):
        check_structured_outputs(
            StructuredOutputsParams(json=json.dumps({"type": "string", "pattern": "[a-z]{1,20000}"}))
        )


def _nested(keyword: str, depth: int) -> dict[str, Any]:
    """A schema whose deepest subschema is ``depth`` levels below the root, each level under
    ``keyword``."""
    node: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        node = {
            "anyOf": {"anyOf": [{"type": "null"}, node]},
            "oneOf": {"oneOf": [{"type": "null"}, node]},
            "allOf": {"allOf": [node]},
            "not": {"not": node},
            "items": {"type": "array", "items": node},
            "prefixItems": {"type": "array", "prefixItems": [node]},
            "properties": {"type": "object", "properties": {"a": node}},
            "additionalProperties": {"type": "object", "additionalProperties": node},
            "$defs": {"$defs": {"a": node}},
        }[keyword]
    return node


@pytest.mark.parametrize(
    "keyword",
    ["anyOf", "oneOf", "allOf", "not", "items", "prefixItems", "properties", "additionalProperties", "$defs"],
)
def test_schema_nesting_depth_is_bounded_over_every_subschema_keyword(keyword: str) -> None:
    """anyOf nested 400 deep (a 12 KB schema) took xgrammar 4 s to convert (time growing as the
    cube of the depth) and passed; now any schema deeper than MAX_SCHEMA_DEPTH is refused before
    xgrammar sees it, whatever keyword nests it."""
    from surge.structured.schema_support import MAX_SCHEMA_DEPTH

    for depth in (MAX_SCHEMA_DEPTH + 1, 400):
        with pytest.raises(ValueError, match=f"nested too deeply: more than {MAX_SCHEMA_DEPTH} levels"):
            check_json_schema(_nested(keyword, depth))
    try:
        check_json_schema(_nested(keyword, MAX_SCHEMA_DEPTH))
    except ValueError as e:  # refused for what it uses (not, a lone $defs...), never for its depth
        assert "nested too deeply" not in str(e)


def test_schema_depth_counts_ref_targets_and_stops_at_cycles() -> None:
    from surge.structured.schema_support import MAX_SCHEMA_DEPTH

    def chain(n: int) -> dict[str, Any]:
        defs = {f"a{i}": {"anyOf": [{"type": "null"}, {"$ref": f"#/$defs/a{i + 1}"}]} for i in range(n)}
        return {"$defs": {**defs, f"a{n}": {"type": "integer"}}, "$ref": "#/$defs/a0"}

    check_json_schema(chain(MAX_SCHEMA_DEPTH // 2 - 1))
    with pytest.raises(ValueError, match="nested too deeply"):
        check_json_schema(chain(MAX_SCHEMA_DEPTH))
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "$ref": "#/$defs/node",
    }
    check_json_schema(tree)


class _CountedScans:
    """A compiled pattern that adds up the characters each ``sub``/``findall`` call is given,
    to count how much grammar text a rewrite reads (work, not time: no clock in unit tests)."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern
        self.chars = 0

    def sub(self, repl: Any, text: str) -> str:
        self.chars += len(text)
        return self.pattern.sub(repl, text)

    def findall(self, text: str) -> list[Any]:
        self.chars += len(text)
        return self.pattern.findall(text)


def test_deep_and_wide_schemas_are_refused_by_their_nesting_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """Within the depth limit, xgrammar's conversion still grows with the schema's size times its
    depth squared (64 levels with 50 properties each: 0.6 s for 90 KB, and a 4 MiB body could hold
    far more): refused past MAX_NESTING_COST; the same levels moved into $defs cost nothing. The
    worst schemas accepted are bounded by work, not by a clock: their grammar stays under 1 MB of
    text (xgrammar's rules, 355 KB and 790 KB here), Surge's rewrite reads that text once when no
    date or time is there, a few times when one is, and the date pattern never starts inside a
    rule name (tried at every character of the long names of a deep schema, it took 0.6 s)."""
    import surge.structured.validate as validate

    def wide(width: int, depth: int, leaf: dict[str, Any] | None = None) -> dict[str, Any]:
        node: dict[str, Any] = leaf or {"type": "integer"}
        for _ in range(depth):
            props = {"a": node, **{f"p{i}": {"type": "string"} for i in range(width)}}
            node = {"type": "object", "properties": props, "required": list(props)}
        return node

    with pytest.raises(ValueError, match="too deeply nested to compile quickly"):
        check_json_schema(wide(50, 64))
    with pytest.raises(ValueError, match="too deeply nested to compile quickly"):
        check_json_schema(wide(150, 30))
    defs: dict[str, Any] = {"l0": {"type": "integer"}}
    for i in range(1, 31):
        props = {"a": {"$ref": f"#/$defs/l{i - 1}"}, **{f"p{j}": {"type": "string"} for j in range(150)}}
        defs[f"l{i}"] = {"type": "object", "properties": props, "required": list(props)}
    check_json_schema({"$defs": defs, "$ref": "#/$defs/l30"})
    date = {"type": "string", "format": "date"}
    for depth, width in ((64, 10), (32, 86)):  # the widest accepted at each depth (at 16: MAX_SUBSCHEMAS)
        check_json_schema(wide(width, depth))
        with pytest.raises(ValueError, match="too deeply nested"):
            check_json_schema(wide(width + 2, depth))
        for leaf, most_reads in ((None, 1), (date, 4)):
            scans = {
                name: _CountedScans(getattr(validate, name))
                for name in ("_LENGTH_STRING_CHAR", "_RULE", "_DATE")
            }
            for name, counted in scans.items():
                monkeypatch.setattr(validate, name, counted)
            text = str(build_grammar(StructuredOutputsParams(json=json.dumps(wide(width, depth, leaf)))))
            assert len(text) < 1_000_000
            assert sum(c.chars for c in scans.values()) <= most_reads * len(text)
            assert ("surge_rfc3339_date ::=" in text) == (leaf is date)
            monkeypatch.undo()
        # a deep schema's longest rule name, as the date's digits: the pattern may start only at its
        # first character (elsewhere it fails at once instead of reading on to the name's end)
        longest = max((line.split(" ", 1)[0] for line in text.splitlines()), key=len)
        probe = f'x ::= (({longest}{{4, 4}} "-" m "-" d))'
        start = probe.index(longest)
        assert len(longest) > 100
        assert validate._DATE.match(probe, start) is not None
        assert all(validate._DATE.match(probe, i) is None for i in range(start + 1, start + len(longest)))


def test_structured_output_verdicts_are_cached_by_canonical_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """A schema sent again (however it is spaced) costs no xgrammar work, valid or not; the
    cache is bounded."""
    import surge.structured.validate as validate

    calls: list[str] = []
    real = validate.build_grammar

    def counting(params: StructuredOutputsParams) -> Any:
        calls.append(params.kind)
        return real(params)

    monkeypatch.setattr(validate, "build_grammar", counting)
    monkeypatch.setattr(validate, "_verdicts", type(validate._verdicts)())
    good = {"type": "object", "properties": {"n": {"type": "integer", "description": "a cache test"}}}
    check_structured_outputs(StructuredOutputsParams(json=json.dumps(good)))
    check_structured_outputs(StructuredOutputsParams(json=json.dumps(good, indent=2)))
    assert len(calls) == 1
    bad = json.dumps({"type": "array", "uniqueItems": True, "description": "a cache test"})
    for _ in range(2):
        with pytest.raises(ValueError, match="'uniqueItems' at #"):
            check_structured_outputs(StructuredOutputsParams(json=bad))
    assert len(calls) == 2
    check_structured_outputs(StructuredOutputsParams(regex="a+"))
    check_structured_outputs(StructuredOutputsParams(regex="a+"))
    assert len(calls) == 3
    monkeypatch.setattr(validate, "VERDICT_CACHE_SIZE", 4)
    for i in range(10):
        check_structured_outputs(StructuredOutputsParams(choice=(str(i),)))
    assert len(validate._verdicts) == 4


def test_schema_text_is_read_as_json_loads_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The schema is parsed by msgspec (the json module held the GIL, and the API process's
    event loop, about 5x longer on a large schema); what msgspec refuses and json.loads takes
    (NaN, an integer past 64 bits) is read by json.loads, and keyed apart from what differs."""
    import surge.structured.validate as validate

    for text in (
        '{"type": "integer", "maximum": 1e308}',
        '{"const": NaN}',
        '{"const": 123456789012345678901234}',
    ):
        assert repr(validate._json_value(text)) == repr(json.loads(text))
    with pytest.raises(ValueError):
        validate._json_value('{"type": ')
    with pytest.raises(RecursionError):
        validate._json_value("[" * 100_000 + "]" * 100_000)
    keys = {
        validate._verdict_key(StructuredOutputsParams(json=t)) for t in ('{"const": NaN}', '{"const": null}')
    }
    assert len(keys) == 2
    spaced = ('{"a": "\u00e9", "b": [1, 2.5]}', '{"a":"é","b":[1,2.5]}')
    assert len({validate._verdict_key(StructuredOutputsParams(json=t)) for t in spaced}) == 1


def test_a_schema_text_msgspec_cannot_encode_is_read_by_json_loads() -> None:
    """A schema string holding a lone surrogate (the Python API's ``LLM``; the server refuses
    such a body before parsing) made msgspec raise UnicodeEncodeError, which escaped the parse
    and the verdict key: the error lost its "invalid json" line and was not cached."""
    import surge.structured.validate as validate

    text = '{"type": "string", "enum": ["\ud800"]}'
    assert validate._json_value(text) == json.loads(text)
    validate._verdict_key(StructuredOutputsParams(json=text))  # no UnicodeEncodeError
    with pytest.raises(ValueError, match="^invalid json"):
        check_structured_outputs(StructuredOutputsParams(json=text))


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "string", "minLength": -3}, "'minLength' at # must be a non-negative integer"),
        (
            {"type": "object", "properties": {"name": {"type": "string", "maxLength": -1}}},
            "'maxLength' at #/properties/name must be a non-negative integer",
        ),
        ({"type": "array", "minItems": -1}, "'minItems' at # must be a non-negative integer"),
        ({"type": "array", "maxItems": 2.5}, "'maxItems' at # must be a non-negative integer"),
        ({"type": "object", "minProperties": True}, "'minProperties' at # must be a non-negative integer"),
        ({"type": "object", "maxProperties": "3"}, "'maxProperties' at # must be a non-negative integer"),
        ({"type": "array", "minContains": -1}, "'minContains' at # must be a non-negative integer"),
        ({"type": "array", "maxContains": None}, "'maxContains' at # must be a non-negative integer"),
        ({"type": "string", "maxLength": 2**31}, "at most 2147483647"),
        (
            {"$defs": {"s": {"type": "string", "minLength": -1}}, "$ref": "#/$defs/s"},
            r"'minLength' at #/\$defs/s must",
        ),
        ({"type": "string", "minLength": 5, "maxLength": 3}, "'minLength' at # is greater than 'maxLength'"),
        ({"type": "array", "minItems": 2, "maxItems": 1}, "'minItems' at # is greater than 'maxItems'"),
        ({"type": "integer", "minimum": 5, "maximum": 3.5}, "'minimum' at # is greater than 'maximum'"),
        ({"type": "string", "pattern": 5}, "'pattern' at # must be a string, got 5"),
        ({"type": "string", "format": ["date"]}, "'format' at # must be a string"),
        (
            {"type": "object", "properties": {"a": {}}, "required": [5]},
            "'required' at # must be a list of strings",
        ),
    ],
)
def test_malformed_lengths_and_counts_are_refused_with_their_location(schema: Any, message: str) -> None:
    """xgrammar read maxLength -1 as "no limit" (a 200 with an unbounded string), took minItems -1,
    and failed on minLength -3 with a C++ assertion in the engine; a pattern of another type was
    picojson's "type mismatch!": each is refused, naming the keyword and where it is."""
    with pytest.raises(ValueError, match=message) as e:
        check_structured_outputs(StructuredOutputsParams(json=json.dumps(schema)))
    assert "Check failed" not in str(e.value) and "mismatch" not in str(e.value)


def test_xgrammar_errors_are_cleaned_of_cpp_details() -> None:
    from surge.structured.validate import clean_error

    raw = {
        "[23:04:02] /project/cpp/grammar_functor.cc:2469: Check failed: (lower >= 0 && (upper == -1 || "
        "upper >= lower)) is false: Invalid repetition range {-3, -1}\n": "Invalid repetition range {-3, -1}",
        '"type mismatch! call is<type>() before get<type>()" && is<std::string>()': (
            "a keyword's value has the wrong type (expected a string)"
        ),
        "[23:04:12] /project/cpp/json_schema_converter.cc:5077: Check failed: (error.empty()) is false: "
        'Failed to parse JSON: syntax error near: Infinity}. The JSON string is:{"minimum": Infinity}\n': (
            "Failed to parse JSON: syntax error near: Infinity}."
        ),
        "[23:04:12] /project/cpp/json_schema_converter.cc:5088: Cannot find field 'x' in #/x\n": (
            "Cannot find field 'x' in #/x"
        ),
    }
    for text, clean in raw.items():
        assert clean_error(RuntimeError(text)) == clean
    assert len(clean_error(RuntimeError("x" * 5000))) == 300
    with pytest.raises(ValueError) as e:  # a compile failure the checks do not catch: still clean
        check_structured_outputs(StructuredOutputsParams(json='{"type": "number", "minimum": Infinity}'))
    assert ".cc" not in str(e.value) and "JSON string is" not in str(e.value)


def test_flat_schemas_are_refused_past_max_subschemas() -> None:
    """A flat schema's conversion still grows with its subschemas (100,000 anyOf branches with
    patterns, 4 MiB: 3.6 s of the check): MAX_SUBSCHEMAS of them pass (the root counts), one
    more is refused, naming where; $ref targets are counted where they stand, once."""
    from surge.structured.schema_support import MAX_SUBSCHEMAS

    def flat(n: int) -> dict[str, Any]:
        return {"anyOf": [{"type": "string", "pattern": f"^a{i}$"} for i in range(n)]}

    check_json_schema(flat(MAX_SUBSCHEMAS - 1))
    with pytest.raises(ValueError, match=rf"more than {MAX_SUBSCHEMAS:,} subschemas .* at #/anyOf/"):
        check_json_schema(flat(MAX_SUBSCHEMAS))
    names = [f"p{i}" for i in range(MAX_SUBSCHEMAS - 3)]
    props = {
        "type": "object",
        "properties": {name: {"$ref": "#/$defs/s"} for name in names},
        "required": names,
    }
    check_json_schema(
        {**props, "$defs": {"s": {"type": "string"}}}
    )  # the root, the $defs entry, the properties


def test_optional_properties_are_refused_past_their_cost() -> None:
    """xgrammar chains an object's optional properties, and the engine's compilation with the
    tokenizer grows about with the cube of the chain (2,000 optional properties, a 60 KB schema:
    20 s of the one compile worker every structured request waits for; 500: 0.1 s). The squares
    of the objects' optional counts may sum to MAX_OPTIONAL_PROPERTY_COST: one object of 500 or
    four of 250 pass, one more property is refused, naming the object; required properties,
    and a malformed 'required' (refused for itself), do not count as optional."""
    from surge.structured.schema_support import MAX_OPTIONAL_PROPERTY_COST

    assert MAX_OPTIONAL_PROPERTY_COST == 500 * 500

    def obj(n: int, required: int = 0) -> dict[str, Any]:
        names = [f"p{i}" for i in range(n)]
        return {
            "type": "object",
            "properties": {k: {"type": "boolean"} for k in names},
            "required": names[:required],
        }

    def nested(k: int, n: int) -> dict[str, Any]:
        names = [f"o{j}" for j in range(k)]
        return {"type": "object", "properties": {name: obj(n) for name in names}, "required": names}

    check_json_schema(obj(500))
    with pytest.raises(ValueError, match=r"too many optional properties .*; 501 at #\)"):
        check_json_schema(obj(501))
    check_json_schema(obj(1500, required=1000))
    check_json_schema(nested(4, 250))
    with pytest.raises(ValueError, match=r"too many optional properties .*; 251 at #/properties/o\d\)"):
        check_json_schema(nested(4, 251))
    with pytest.raises(ValueError, match="keyword 'required' at # must be a list of strings"):
        check_json_schema({**obj(10), "required": [{"a": 1}]})
    with pytest.raises(ValueError, match="too many optional properties"):  # as a forced tool call's grammar
        check_structured_outputs(StructuredOutputsParams(json=json.dumps({"anyOf": [obj(400), obj(400)]})))


def test_grammar_rule_limit() -> None:
    """An EBNF grammar holds at most MAX_GRAMMAR_RULES rules as xgrammar normalizes it: a chain
    of 4,000 rules (86 KB) held the one engine compile worker 30 s. The limit counts the rules
    xgrammar adds (a repetition's); a long sequence inside one rule is fine."""
    from surge.structured.validate import MAX_GRAMMAR_RULES

    def chain(n: int) -> str:  # n + 2 rules
        return "root ::= r0\n" + "\n".join(f'r{i} ::= r{i + 1} | "a"' for i in range(n)) + f'\nr{n} ::= "b"'

    check_structured_outputs(StructuredOutputsParams(grammar=chain(MAX_GRAMMAR_RULES - 2)))
    with pytest.raises(ValueError, match=r"the grammar has 1,025 rules .* at most 1,024"):
        check_structured_outputs(StructuredOutputsParams(grammar=chain(MAX_GRAMMAR_RULES - 1)))
    with pytest.raises(ValueError, match=r"the grammar has 4,002 rules"):
        build_grammar(StructuredOutputsParams(grammar=chain(4000)))
    repeated = chain(MAX_GRAMMAR_RULES - 3) + '\nr_x ::= "c"{2,5}'  # the repetition adds a rule
    with pytest.raises(ValueError, match=r"the grammar has 1,025 rules"):
        build_grammar(StructuredOutputsParams(grammar=repeated))
    build_grammar(StructuredOutputsParams(grammar="root ::= " + " ".join("[ab]" for _ in range(20_000))))


def test_choice_limits() -> None:
    """A choice of over 2,048 options or 65,536 characters is refused before xgrammar sees it
    (40,000 options stalled every stream for seconds per step at n: 128, and a 2.8 MB list held the
    one compile worker for 70 s); a list at both limits compiles."""
    from surge.structured.validate import MAX_CHOICE_CHARS, MAX_CHOICE_OPTIONS

    at_limit = tuple(
        f"{i:05d}" + "x" * (MAX_CHOICE_CHARS // MAX_CHOICE_OPTIONS - 5) for i in range(MAX_CHOICE_OPTIONS)
    )
    assert sum(map(len, at_limit)) == MAX_CHOICE_CHARS
    check_structured_outputs(StructuredOutputsParams(choice=at_limit))
    with pytest.raises(ValueError, match="invalid choice: at most 2,048 options, got 2,049"):
        check_structured_outputs(StructuredOutputsParams(choice=tuple(str(i) for i in range(2049))))
    with pytest.raises(ValueError, match="at most 65,536 characters together, got 65,537"):
        check_structured_outputs(StructuredOutputsParams(choice=(*at_limit[:-1], at_limit[-1] + "y")))


def test_enum_limits() -> None:
    """A schema's enum lists hold at most 2,048 values and 65,536 characters together (a
    10,000-string enum cost 7 ms per row and step); split over subschemas they still add up."""
    from surge.structured.schema_support import MAX_ENUM_VALUES

    check_json_schema({"enum": list(range(MAX_ENUM_VALUES))})
    with pytest.raises(
        ValueError, match="enum lists and const values hold more than 2,048 values or 65,536 characters"
    ):
        check_json_schema({"enum": list(range(MAX_ENUM_VALUES + 1))})
    halves = {"type": "object", "properties": {k: {"enum": list(range(1025))} for k in "ab"}}
    with pytest.raises(ValueError, match=r"at #/properties/\w"):
        check_json_schema(halves)
    with pytest.raises(ValueError, match="65,536 characters"):
        check_json_schema({"enum": ["x" * 40_000, "y" * 40_000]})


def test_const_values_count_toward_the_enum_limits() -> None:
    """A ``const`` had no limit: a 1,000,000-character one compiled for 16 s into 280 MB (Qwen3's
    vocabulary). It counts as one enum value of its JSON text's length."""
    check_json_schema({"const": "x" * 65_000})
    with pytest.raises(
        ValueError, match=r"enum lists and const values hold more than .* \(at #/properties/b\)"
    ):
        check_json_schema(
            {"type": "object", "properties": {"a": {"const": "x" * 40_000}, "b": {"const": "y" * 40_000}}}
        )
    with pytest.raises(ValueError, match="2,048 values"):
        check_json_schema({"anyOf": [{"enum": list(range(2048))}, {"const": "z"}]})


IPV4_PATTERN = (
    r"^(0|[1-9][0-9]?|1[0-9]{2}|2[0-4][0-9]|25[0-5])(\.(0|[1-9][0-9]?|1[0-9]{2}|2[0-4][0-9]|25[0-5])){3}$"
)


@pytest.mark.parametrize(
    ("fmt", "value"),
    [
        ("date", "2024-02-30"),
        ("date", "2024-04-31"),
        ("date-time", "2024-11-31T20:52:35Z"),
        ("time", "09:44:60+02:00"),
        ("ipv4", "094.55.64.000"),
    ],
)
def test_formats_are_enforced_as_shapes_not_values(fmt: str, value: str) -> None:
    """xgrammar's regex for a format accepts values a format-checking validator refuses (an
    xgrammar that checks them fails this: the rewrites may go); build_grammar rewrites the
    dates and times (test_dates_and_times_are_real_ones) and the ipv4 octets
    (test_ipv4_octets_and_hostname_labels_are_real_ones)."""
    schema = {**STR, "format": fmt}
    assert _grammar_accepts(schema, json.dumps(value))
    assert not _schema_valid(schema, json.dumps(value))


def test_ipv4_octets_and_hostname_labels_are_real_ones() -> None:
    """xgrammar 0.2.9's ``ipv4`` lets an octet have leading zeros (``01.2.3.4``), which RFC 2673's
    dotted quad and Python's ``ipaddress`` refuse, and its ``hostname`` takes a label of any
    length, where RFC 1123 stops at 63 characters (jsonschema checks hostnames only with the
    fqdn package, absent here): build_grammar's grammar takes exactly the addresses ``ipaddress``
    reads and labels of at most 63 characters, in a property as at the top; a ``pattern`` of
    its own is kept as written."""
    import ipaddress

    ipv4 = {**STR, "format": "ipv4"}
    hostname = {**STR, "format": "hostname"}
    assert _grammar_accepts(ipv4, '"01.2.3.4"') and _grammar_accepts(hostname, json.dumps("a" * 64 + ".com"))
    for schema in (ipv4, {"type": "object", "properties": {"ip": ipv4}, "required": ["ip"]}):
        grammar = build_grammar(StructuredOutputsParams(json=json.dumps(schema)))
        octets = [*map(str, range(256)), "00", "01", "000", "007", "099", "0255", "256", "300", ""]
        for octet in octets:
            for text in (f"{octet}.2.3.4", f"1.{octet}.3.4", f"1.2.3.{octet}"):
                try:
                    real = bool(ipaddress.IPv4Address(text))
                except ValueError:
                    real = False
                value = (
                    json.dumps(text) if schema is ipv4 else json.dumps({"ip": text}, separators=(", ", ": "))
                )
                assert xgr_testing._is_grammar_accept_string(grammar, value) == real, text
    grammar = build_grammar(StructuredOutputsParams(json=json.dumps(hostname)))
    for text, real in (
        ("a" * 63, True),
        ("a" * 64, False),
        ("a" * 63 + ".com", True),
        ("a" * 64 + ".com", False),
        ("x." + "b" * 63, True),
        ("x.y." + "b" * 64 + ".z", False),
        ("a-b.c-d", True),
        ("a-.b", False),
    ):
        assert xgr_testing._is_grammar_accept_string(grammar, json.dumps(text)) == real, text
    own = build_grammar(
        StructuredOutputsParams(json=json.dumps({**STR, "pattern": "^([01]?[0-9]?[0-9][.]){3}x$"}))
    )
    assert xgr_testing._is_grammar_accept_string(own, '"001.02.3.x"')
    octet = "(25[0-5]|2[0-4][0-9]|[0-1]?[0-9]?[0-9])"  # xgrammar's own ipv4, as a pattern: kept too
    same = build_grammar(
        StructuredOutputsParams(json=json.dumps({**STR, "pattern": f"^({octet}\\.){{3}}{octet}$"}))
    )
    assert xgr_testing._is_grammar_accept_string(same, '"01.2.3.4"')


def test_an_ipv4_pattern_is_accepted_and_enforced() -> None:
    """A pattern for an IPv4 address without leading zeros: Surge takes it and xgrammar enforces it."""
    schema = {**STR, "pattern": IPV4_PATTERN}
    check_json_schema(schema)
    assert _grammar_accepts(schema, '"192.168.0.1"') and _grammar_accepts(schema, '"0.0.0.0"')
    for bad in ('"094.55.64.000"', '"256.1.1.1"', '"1.2.3"'):
        assert not _grammar_accepts(schema, bad)


BOUNDED = {"type": "string", "minLength": 1, "maxLength": 4}


@pytest.mark.parametrize(
    ("params", "good", "raw"),
    [
        (
            StructuredOutputsParams(json={"type": "object", "properties": {"s": BOUNDED}}),
            '{"s": "a"}',
            '{"s": "a\tb"}',
        ),
        (
            StructuredOutputsParams(
                json={"$defs": {"s": BOUNDED}, "type": "array", "items": {"$ref": "#/$defs/s"}}
            ),
            '["ab"]',
            '["\x01"]',
        ),
        (StructuredOutputsParams(json={"type": "string", "minLength": 2}), '"abc"', '"a\x1fb"'),
        (
            StructuredOutputsParams(
                structural_tag={
                    "type": "structural_tag",
                    "format": {
                        "type": "triggered_tags",
                        "triggers": ["<f>"],
                        "tags": [
                            {
                                "begin": "<f>",
                                "content": {"type": "json_schema", "json_schema": BOUNDED},
                                "end": "</f>",
                            }
                        ],
                    },
                }
            ),
            'x <f>"ab"</f>',
            'x <f>"a\tb"</f>',
        ),
        (
            StructuredOutputsParams(
                structural_tag={
                    "structures": [{"begin": "<f>", "schema": BOUNDED, "end": "</f>"}],
                    "triggers": ["<f>"],
                }
            ),
            'x <f>"ab"</f>',
            'x <f>"a\x0cb"</f>',
        ),
    ],
    ids=["json", "json $ref", "json minLength", "structural tag", "older structural tag"],
)
def test_length_bounded_strings_take_no_raw_control_character(
    params: StructuredOutputsParams, good: str, raw: str
) -> None:
    """JSON allows a control character (U+0000 to U+001F) in a string only escaped; xgrammar
    0.2.9's grammar for a string with ``minLength``/``maxLength`` lets them through raw (checked
    below, as this file checks xgrammar), so build_grammar closes that rule."""
    grammar = build_grammar(params)
    assert xgr_testing._is_grammar_accept_string(grammar, good)
    assert not xgr_testing._is_grammar_accept_string(grammar, raw)
    if params.json is not None:
        assert _grammar_accepts(json.loads(params.json), raw)


@pytest.mark.parametrize(
    ("element", "accepted"),
    [
        ({"type": "regex", "pattern": "([0-5][0-9]|60)"}, "60"),
        ({"type": "grammar", "grammar": 'root ::= [0-5] [0-9] | "6" "0"'}, "60"),
        (
            {
                "type": "grammar",
                "grammar": 'root ::= d{4, 4} "-" m "-" e\nd ::= [0-9]\nm ::= "0" [1-9] | "1" [0-2]\n'
                'e ::= "0" [1-9] | [1-2] [0-9] | "3" [01]',
            },
            "2024-02-30",
        ),
        (
            {"type": "grammar", "grammar": 'root ::= s_characters{1, 3}\ns_characters ::= [^"\\\\\\r\\n]'},
            "a\tb",
        ),
    ],
    ids=["regex seconds", "grammar seconds", "grammar date", "grammar characters"],
)
def test_a_structural_tags_own_regex_and_grammar_are_kept_as_written(
    element: dict[str, Any], accepted: str
) -> None:
    """A structural tag's ``regex`` or ``grammar`` element prints as rules that may read as
    xgrammar's JSON rules (``[0-5][0-9]|60`` as a time's seconds), which build_grammar rewrote
    with a JSON schema's dates, seconds and bounded strings: the user's own regex refused 60."""
    tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [element]}}
    grammar = build_grammar(StructuredOutputsParams(structural_tag=json.dumps(tag)))
    assert xgr_testing._is_grammar_accept_string(grammar, accepted)


def test_dates_and_times_are_real_ones() -> None:
    """xgrammar 0.2.9's ``date`` takes any day 01-31 in any month and the year 0000, and its
    ``time`` a second 60 in any minute (the formats' shapes: see
    test_formats_are_enforced_as_shapes_not_values); build_grammar's grammar takes exactly the
    dates Python's calendar has (February 29 in leap years only) and no leap second, so pydantic
    and jsonschema's format checker read every value."""
    import datetime

    date = build_grammar(StructuredOutputsParams(json={**STR, "format": "date"}))
    for year in (1, 400, 1900, 2000, 2023, 2024, 9999):
        for month in range(1, 13):
            for day in (1, 28, 29, 30, 31):
                text = f"{year:04d}-{month:02d}-{day:02d}"
                try:
                    datetime.date.fromisoformat(text)
                    real = True
                except ValueError:
                    real = False
                assert xgr_testing._is_grammar_accept_string(date, json.dumps(text)) == real, text
    for text in ("0000-01-01", "0000-02-29", "2024-13-01", "2024-00-10", "2024-01-00"):
        assert not xgr_testing._is_grammar_accept_string(date, json.dumps(text)), text
    date_time = build_grammar(StructuredOutputsParams(json={**STR, "format": "date-time"}))
    time = build_grammar(StructuredOutputsParams(json={**STR, "format": "time"}))
    for grammar, good, bad in (
        (date_time, "2024-02-29T23:59:59.5+02:00", "2024-11-31T20:52:35Z"),
        (date_time, "2000-02-29T00:00:00Z", "2024-06-30T23:59:60Z"),
        (time, "09:44:59+02:00", "09:44:60+02:00"),
    ):
        schema = {**STR, "format": "date-time" if grammar is date_time else "time"}
        assert _grammar_accepts(schema, json.dumps(bad))  # xgrammar's own grammar
        assert xgr_testing._is_grammar_accept_string(grammar, json.dumps(good))
        assert not xgr_testing._is_grammar_accept_string(grammar, json.dumps(bad))
