"""The top-level field a JSON body's parse failure is blamed on (:func:`field_at_fault`)."""

from __future__ import annotations

import pytest

from surge.server.fast_json import field_at_fault

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
    ],
)
def test_field_at_fault(body: bytes, too_deep: bool, field: str | None) -> None:
    assert field_at_fault(body, too_deep) == field
