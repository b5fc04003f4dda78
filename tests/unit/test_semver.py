from __future__ import annotations

import pytest
import semantic_version
from hypothesis import given
from hypothesis import strategies as st

from domain.errors import RequestError
from domain.semver import is_valid_version, parse_range, select_highest, sort_versions

VERSIONS = ["1.0.0", "1.1.0", "1.1.5", "1.2.0", "1.9.9", "2.0.0", "2.0.0-beta.1", "2.1.0-rc.1"]


@pytest.mark.parametrize(("range_text", "expected"), [
    ("^1.1.0", "1.9.9"),
    ("~1.1", "1.1.5"),
    (">=1 <2", "1.9.9"),
    ("1.x", "1.9.9"),
    ("*", "2.0.0"),
    ("1.1.0", "1.1.0"),
    ("^3.0.0 || ~1.1.0", "1.1.5"),
    ("", "2.0.0"),
])
def test_npm_style_ranges_select_the_highest_match(range_text: str, expected: str):
    assert select_highest(VERSIONS, range_text) == expected


def test_no_version_satisfying_the_range_gives_none():
    assert select_highest(VERSIONS, "^5.0.0") is None


def test_prereleases_are_skipped_unless_the_range_names_one():
    assert select_highest(["1.0.0", "2.0.0-beta.1"], ">=1.0.0") == "1.0.0"
    assert select_highest(["1.0.0", "2.0.0-beta.1"], ">=2.0.0-beta.0") == "2.0.0-beta.1"


def test_invalid_versions_in_the_registry_are_ignored():
    assert select_highest(["latest", "1.2", "1.0.0"], "*") == "1.0.0"


def test_a_bad_range_is_a_request_error_naming_it():
    with pytest.raises(RequestError) as raised:
        parse_range(">=banana")
    assert raised.value.code == "E3004"
    assert raised.value.details["range"] == ">=banana"


def test_parsed_ranges_are_cached():
    assert parse_range("^1.2.0") is parse_range("^1.2.0")


def test_latest_means_any_version():
    assert select_highest(VERSIONS, "latest") == "2.0.0"


@pytest.mark.parametrize(("text", "valid"), [
    ("1.2.3", True), ("1.2.3-rc.1+build.5", True), ("1.2", False), ("v1.2.3", False),
    ("01.2.3", False), ("", False),
])
def test_is_valid_version_accepts_only_strict_semver(text: str, valid: bool):
    assert is_valid_version(text) is valid


def test_sort_versions_orders_by_semver_not_text():
    assert sort_versions(["1.10.0", "1.9.0", "1.9.0-rc.1"]) == ["1.9.0-rc.1", "1.9.0", "1.10.0"]


_versions = st.builds(lambda a, b, c: f"{a}.{b}.{c}", *(st.integers(0, 4) for _ in range(3)))
_ranges = st.sampled_from(["*", "^1.0.0", "~1.2", ">=1 <3", "2.x", "^0.1.0", "1.2.3",
                           "<2.0.0 || >=4", ">0.0.0 <=3.3.3"])


@given(st.lists(_versions, max_size=20), _ranges)
def test_selection_is_the_max_of_the_satisfying_versions(versions: list[str], range_text: str):
    spec = semantic_version.NpmSpec(range_text)
    satisfying = [semantic_version.Version(v) for v in versions if semantic_version.Version(v) in spec]
    expected = str(max(satisfying)) if satisfying else None
    assert select_highest(versions, range_text) == expected
