from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from domain.safe_yaml import YamlTooLarge, load_yaml

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)


@given(JSONISH)
def test_documents_within_bounds_load_as_safe_load_does(value: object) -> None:
    text = yaml.safe_dump(value)
    assert load_yaml(text) == yaml.safe_load(text)


def test_small_aliases_are_allowed() -> None:
    assert load_yaml("a: &x {b: 1}\nc: *x\n") == {"a": {"b": 1}, "c": {"b": 1}}


def test_an_alias_bomb_is_refused_before_it_is_built() -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abcdef", "bcdefg", strict=True):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    with pytest.raises(YamlTooLarge, match="expand") as caught:
        load_yaml("\n".join(lines))
    assert caught.value.code == "E3105"


def test_a_recursive_alias_is_refused() -> None:
    with pytest.raises(YamlTooLarge, match="recursive"):
        load_yaml("a: &x [1, *x]\n")


def test_depth_and_size_are_bounded() -> None:
    with pytest.raises(YamlTooLarge, match="deeper"):
        load_yaml("a: " + "[" * 50 + "]" * 50, max_depth=10)
    with pytest.raises(YamlTooLarge, match="longer"):
        load_yaml("a: b\n" * 10, max_chars=20)


def test_empty_text_is_none() -> None:
    assert load_yaml("") is None
