from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.request_limits import (
    PayloadRejected,
    check_request_payload,
    json_issue,
    strict_json_loads,
)

STRICT_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(blacklist_categories=("Cs",))),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(alphabet=st.characters(blacklist_categories=("Cs",))),
                      children, max_size=4),
    max_leaves=25,
)


@given(STRICT_JSON)
def test_strict_json_passes_and_round_trips(value: object) -> None:
    assert json_issue(value) is None
    assert strict_json_loads(json.dumps(value)) == value


@pytest.mark.parametrize(("value", "reason", "path"), [
    ({"a": float("nan")}, "non_finite_number", "$.a"),
    ({"a": [1, float("inf")]}, "non_finite_number", "$.a[1]"),
    ({"a": "x\ud800y"}, "lone_surrogate", "$.a"),
    ({"k\udc00": 1}, "lone_surrogate", "$"),
    ({"a": b"bytes"}, "not_json", "$.a"),
    ({1: "x"}, "non_string_key", "$"),
])
def test_what_is_not_strict_json_is_named_with_its_path(value: object, reason: str,
                                                        path: str) -> None:
    issue = json_issue(value)
    assert issue is not None and issue.code == "E3004"
    assert issue.details == {"reason": reason, "path": path}


def test_nesting_is_bounded() -> None:
    value: object = 1
    for _ in range(100):
        value = [value]
    assert json_issue(value).details["reason"] == "too_deep"  # type: ignore[union-attr]


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": -Infinity}', '{"a": "\\udfff"}',
                                  "[" * 100_000 + "]" * 100_000, "{not json"])
def test_strict_json_loads_refuses(text: str) -> None:
    with pytest.raises(PayloadRejected):
        strict_json_loads(text)


def test_paired_surrogate_escapes_are_text() -> None:
    assert strict_json_loads('"\\ud83d\\ude00"') == "\N{GRINNING FACE}"


def test_size_counts_compact_utf8_of_parameters_and_lockfile() -> None:
    check_request_payload({"a": "é" * 10}, max_bytes=28)  # {"a":"éé..."} = 28 bytes
    with pytest.raises(PayloadRejected) as caught:
        check_request_payload({"a": "é" * 10}, lockfile={"x": 1}, max_bytes=28)
    assert caught.value.too_large and caught.value.details["actual"] == 28 + 7
