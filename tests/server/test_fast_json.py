"""The top-level field a JSON body's parse failure is blamed on (:func:`field_at_fault`)."""

from __future__ import annotations

import msgspec
import pytest

from surge.server.fast_json import field_at_fault, where_json_fails

DEEP = b"[" * 3000 + b"]" * 3000


@pytest.mark.parametrize(
    ("body", "too_deep", "field"),
    [
        (b'{"a": [1, {"b": 2}], "s": "x,}]\\"[", "deep": ' + DEEP + b', "n": 1}', True, "deep"),
        (b'{"a": 1, "b": 1e999, "c": NaN}', False, "b"),
        (b'{"a": "ok", "b": NaN}', False, "b"),
        (b'{"a": 1, "b": [1, 2', False, None),  # cut short: the body is to blame
        (b'{"prompt":', False, None),
        (b'{"\\ud800": ' + DEEP + b"}", True, "\\ud800"),  # a lone surrogate, written out
        (b'{"": 1e999}', False, ""),
        (DEEP, True, None),  # not an object: no field to blame
        (b"[1, NaN]", False, None),
        (b'{"a": 1, "b": 2}', False, None),
        (b"{not json", False, None),
        # the body's structure is at fault, not a value: a missing comma, a second colon, no value
        (b'{"prompt": "x" "max_tokens": 3}', False, None),
        (b'{"prompt":\n "x" 1}', False, None),
        (b'{"a": [1] [2], "b": NaN}', False, None),
        (b'{"a": "x": 1}', False, None),
        (b'{"a": , "b": 1e999}', False, None),
        (b'{"a": {"b": 1} , "c": 1e999}', False, "c"),
        (b'{"a": tru}', False, "a"),  # one value, malformed: the field's
        (b'{"p": "Once upon", "n": 1e+308, "t": 1e999}', False, "t"),  # a string's spaces are its own
        (b'{"p": "a b", "q": "c" , "r": 1 2}', False, None),
    ],
)
def test_field_at_fault(body: bytes, too_deep: bool, field: str | None) -> None:
    assert field_at_fault(body, too_deep) == field


@pytest.mark.parametrize(
    ("body", "what", "pos"),
    [
        (b'{"a": }', "invalid character at byte 6 (line 1, column 7)", 6),
        (b'{"a": 1,\n "b" 2}', "expected ':' at byte 14 (line 2, column 6)", 14),
        # the column counts characters, not bytes
        (b'{"\xc3\xa9": 1,\n"\xc3\xa9" x}', "expected ':' at byte 15 (line 2, column 5)", 15),
        (b'{"a": 1', "the body ends before its JSON does at byte 7 (line 1, column 8)", 7),
        (b"{} x", "trailing characters at byte 3 (line 1, column 4)", 3),
        (b"[1]\n  x", "trailing characters at byte 6 (line 2, column 3)", 6),
    ],
)
def test_where_json_fails(body: bytes, what: str, pos: int) -> None:
    """The 400 for a body that is not JSON said "JSON decode error" alone, msgspec's byte offset dropped."""
    with pytest.raises(msgspec.DecodeError) as e:
        msgspec.json.decode(body)
    assert where_json_fails(body, e.value) == (what, pos)
