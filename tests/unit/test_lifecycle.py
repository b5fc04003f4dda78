"""Deciding a lifecycle change against what the registry knows."""

from __future__ import annotations

import pytest

from domain.errors import RequestError, ToolNotFound, VersionNotFound
from domain.lifecycle import LifecycleChange, decide_lifecycle_change

HELLO = {"1.0.0": "active", "1.1.0": "active"}
TOOLS = ("hello", "hello_v2")


def test_deprecating_a_known_version_is_accepted_as_asked():
    change = LifecycleChange("hello", "1.0.0", "deprecated", reason="slow",
                             replacement_tool_id="hello_v2")
    assert decide_lifecycle_change(change, HELLO, TOOLS) == change


def test_deprecating_every_version_needs_no_version():
    change = LifecycleChange("hello", None, "deprecated")
    assert decide_lifecycle_change(change, HELLO, TOOLS).version is None


def test_an_unknown_tool_is_e3101():
    with pytest.raises(ToolNotFound) as raised:
        decide_lifecycle_change(LifecycleChange("nope", None, "deprecated"), None, TOOLS)
    assert raised.value.code == "E3101"


def test_an_unknown_version_is_e3102_with_the_available_ones():
    with pytest.raises(VersionNotFound) as raised:
        decide_lifecycle_change(LifecycleChange("hello", "9.9.9", "removed"), HELLO, TOOLS)
    assert raised.value.details["available"] == ["1.0.0", "1.1.0"]


def test_removing_needs_an_exact_version():
    with pytest.raises(RequestError):
        decide_lifecycle_change(LifecycleChange("hello", None, "removed"), HELLO, TOOLS)


def test_an_unknown_state_is_a_request_error():
    with pytest.raises(RequestError):
        decide_lifecycle_change(LifecycleChange("hello", "1.0.0", "retired"), HELLO, TOOLS)


def test_an_unknown_replacement_is_e3101():
    change = LifecycleChange("hello", "1.0.0", "deprecated", replacement_tool_id="ghost@^1")
    with pytest.raises(ToolNotFound) as raised:
        decide_lifecycle_change(change, HELLO, TOOLS)
    assert raised.value.details["tool_id"] == "ghost"


def test_a_replacement_may_name_a_version_range():
    change = LifecycleChange("hello", "1.0.0", "deprecated", replacement_tool_id="hello_v2@^2")
    assert decide_lifecycle_change(change, HELLO, TOOLS) == change
