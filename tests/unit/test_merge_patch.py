"""JSON Merge Patch (RFC 7386): the RFC's examples, and diff/apply as inverses."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.merge_patch import apply_patch, diff, same

# RFC 7386, Appendix A
RFC_EXAMPLES = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("target", "patch", "result"), RFC_EXAMPLES)
def test_the_rfc_examples(target: Any, patch: Any, result: Any) -> None:
    assert apply_patch(target, patch) == result


scalars = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=5) | \
    st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=3), inner, max_size=4), max_leaves=20)
objects = st.dictionaries(st.text(max_size=3), json_values, max_size=5)


def holds_null_member(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    return any(v is None or holds_null_member(v) for v in value.values())


@given(objects, objects)
def test_applying_the_diff_gives_the_target_or_no_diff_exists(a: Any, b: Any) -> None:
    patch = diff(a, b)
    if patch is None:
        assert holds_null_member(b)
    else:
        assert same(apply_patch(a, patch), b)


@given(objects)
def test_the_diff_of_a_value_with_itself_is_empty(a: Any) -> None:
    assert diff(a, a) == {} or holds_null_member(a)


def test_same_tells_json_types_apart() -> None:
    assert not same(1, True) and not same(1, 1.0) and not same({"a": 1}, {"a": True})
    assert same({"a": [1, {"b": None}]}, {"a": [1, {"b": None}]})
    assert diff({"n": 1}, {"n": True}) == {"n": True}
