"""The fast canonical JSON writes exactly the bytes of the RFC 8785 reference."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.canonical_json import canonical_json

_scalars = (st.none() | st.booleans() | st.integers(-(2**60), 2**60)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text())
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20)

def _reference(value: Any) -> bytes | type[Exception]:
    try:
        return rfc8785.dumps(value)
    except rfc8785.CanonicalizationError as error:
        return type(error)

def _fast(value: Any) -> bytes | type[Exception]:
    try:
        return canonical_json(value)
    except rfc8785.CanonicalizationError as error:
        return type(error)

@settings(max_examples=400, deadline=None)
@given(_values)
def test_canonical_json_equals_the_reference_for_any_json_value(value: Any) -> None:
    assert _fast(value) == _reference(value)

@pytest.mark.parametrize("value", [
    {"b": 1, "a": [1.5, 100.0, -0.0, 1e-7, 1e21, 1e16, 123456.789, 0.0001]},
    {"\U0001f600": 1, "\ufb01": 2, "a\u2028b": "\x00\x1f\"\\\u007f"},
    {"big": 2**53, "edge": 2**53 - 1, "neg": -(2**53) + 1},
    ("a", "tuple"), {"nan": float("nan")}, {"lone": "\ud800"}, {1: "int key"},
])
def test_canonical_json_equals_the_reference_on_its_edge_cases(value: Any) -> None:
    assert _fast(value) == _reference(value)


@settings(max_examples=2000, deadline=None)
@given(st.floats() | st.integers(-(2**54), 2**54))
def test_canonical_json_writes_every_number_as_the_reference(value: float | int) -> None:
    assert _fast([value, {"n": value}]) == _reference([value, {"n": value}])
