"""Deciding a lifecycle change against what the registry knows, and folding one."""

from __future__ import annotations

import base64
import gzip
import hashlib

import pytest

from contracts.events import PublishedFile, ToolLifecycleChanged, ToolPublished
from domain.errors import RequestError, ToolNotFound, VersionNotFound, VersionRemoved
from domain.lifecycle import LifecycleChange, decide_lifecycle_change
from projections.registry_table import fold_registry
from projections.registry_view import RegistryLogView
from projections.store import Rows
from tests.projection_events import envelope

HELLO = {"1.0.0": "active", "1.1.0": "active"}
TOOLS = ("hello", "hello_v2")


def test_deprecating_a_known_version_is_accepted_as_asked():
    change = LifecycleChange("hello", "1.0.0", "deprecated", reason="slow",
                             replacement_tool_id="hello_v2")
    assert decide_lifecycle_change(change, HELLO, TOOLS) == (change,)


def test_deprecating_every_version_needs_no_version():
    change = LifecycleChange("hello", None, "deprecated")
    assert [c.version for c in decide_lifecycle_change(change, HELLO, TOOLS)] == [None]


def test_deprecating_every_version_leaves_removed_ones_removed():
    known = {"1.0.0": "removed", "1.1.0": "active", "1.2.0": "deprecated"}
    changes = decide_lifecycle_change(LifecycleChange("hello", None, "deprecated"), known)
    assert [(c.version, c.state) for c in changes] == [("1.1.0", "deprecated"),
                                                       ("1.2.0", "deprecated")]


def test_restoring_every_version_restores_removed_ones_too():
    known = {"1.0.0": "removed", "1.1.0": "deprecated"}
    changes = decide_lifecycle_change(LifecycleChange("hello", None, "active"), known)
    assert [c.version for c in changes] == [None]


def test_deprecating_a_tool_whose_versions_were_all_removed_is_e3104():
    with pytest.raises(VersionRemoved):
        decide_lifecycle_change(LifecycleChange("hello", None, "deprecated"),
                                {"1.0.0": "removed"})


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
    assert decide_lifecycle_change(change, HELLO, TOOLS) == (change,)


def _published(tool_id: str, version: str):
    content = b"print('{}')\n"
    files = [PublishedFile(path="main.py", sha256=hashlib.sha256(content).hexdigest(),
                           is_executable=False, size=len(content),
                           content_b64gz=base64.b64encode(gzip.compress(content)).decode())]
    manifest = {"tool_id": tool_id, "version": version, "tool_type": "script",
                "executor": "python_runtime"}
    return envelope(ToolPublished(tool_id=tool_id, version=version, tool_type="script",
                                  executor="python_runtime", manifest=manifest, files=files,
                                  integrity="sha256:" + "ab" * 32),
                    tool_id, id=f"pub-{tool_id}-{version}")


def _changed(version: str | None, state: str, reason: str | None = None,
             replacement: str | None = None):
    data = ToolLifecycleChanged(tool_id="grep", version=version, lifecycle=state, reason=reason,
                                replacement_tool_id=replacement)
    return envelope(data, "grep", id=f"life-{version}-{state}")


def test_the_resolver_view_and_the_sql_table_fold_lifecycles_alike():
    events = [_published("grep", "1.0.0"), _published("grep", "1.1.0"),
              _changed(None, "deprecated", "old"),
              _changed("1.1.0", "removed", "broken", "rg"),
              _changed("9.9.9", "removed")]  # an unknown version changes nothing
    view = RegistryLogView()
    rows: Rows = {"registry_tools": [], "registry_versions": []}
    for event in events:
        view.apply(event)
        rows = fold_registry(rows, event)
    in_memory = [(tv.version, tv.lifecycle, tv.lifecycle_reason, tv.replacement_tool_id)
                 for tv in view.versions("grep")]
    in_sql = [(r["version"], r["lifecycle"], r["lifecycle_reason"], r["replacement_tool_id"])
              for r in rows["registry_versions"]]
    assert in_memory == in_sql == [("1.0.0", "deprecated", "old", None),
                                   ("1.1.0", "removed", "broken", "rg")]
