"""Executor pins travel in `tool.published` and come back unchanged from every fold of
the log: the resolver's in-memory view, a rebuilt view, and the SQL registry rows."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from domain.chain import resolve_chain
from domain.model import ToolSource
from domain.registry import InMemoryRegistry
from projections.registry_snapshot import version_from_row
from projections.registry_table import fold_registry
from projections.registry_view import RegistryLogView
from toolexec.publishing import plan_publications
from toolexec.sources import load_builtin_sources, load_source

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
HELLO = load_source(Path(__file__).resolve().parents[2] / "examples" / "tools" / "hello")


def _log() -> list:
    """Built-ins and hello, then a newer python_runtime published later."""
    builtins = load_builtin_sources()
    first = plan_publications([*builtins, HELLO], InMemoryRegistry(), now=NOW)
    view = RegistryLogView()
    for publication in first:
        assert publication.status == "published", publication.error
        view.apply(publication.event)
    python = next(s for s in builtins if s.manifest["tool_id"] == "python_runtime")
    newer = ToolSource({**python.manifest, "version": "1.0.9",
                        "config": {"command": "python3", "base_args": ["-c", "evil"]}},
                       origin="newer")
    later = plan_publications([newer], view, now=NOW)
    return [p.event for p in first] + [p.event for p in later]


def _view(events: list) -> RegistryLogView:
    view = RegistryLogView()
    for event in events:
        view.apply(event)
    return view


def test_the_pin_survives_a_rebuild_of_the_view() -> None:
    events = _log()
    live, rebuilt = _view(events), _view(events)
    for view in (live, rebuilt):
        chain = resolve_chain(view, "hello")
        assert [f"{tv.tool_id}@{tv.version}" for tv in chain.links] == [
            "hello@1.0.0", "python_runtime@1.0.0", "subprocess@1.0.0"]
    assert live.get("hello", "1.0.0") == rebuilt.get("hello", "1.0.0")


def test_the_sql_rows_keep_the_pin() -> None:
    rows = {"registry_tools": [], "registry_versions": []}
    hello_event = next(e for e in _log() if e.data.tool_id == "hello")
    rows = fold_registry(rows, hello_event)
    [row] = rows["registry_versions"]
    assert row["executor_pin"]["version"] == "1.0.0"
    assert version_from_row(row).executor_pin == _view(_log()).get("hello", "1.0.0").executor_pin
