"""An invocation's timeline: the shortcut for a fact arriving after every command
already in gives the timeline the full merge gives, whatever the order of arrival."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.topics import COMMAND_TYPES
from projections.invocations import _with_entry, merged_timeline

entries = st.builds(
    lambda kind, second, n: {"type": kind, "time": f"2026-11-22T12:00:{second:02d}.000000Z",
                             "id": f"e{n}"},
    st.sampled_from([*sorted(COMMAND_TYPES), "tool.chain.resolved", "tool.execution.started",
                     "tool.invoke.completed"]),
    st.integers(0, 5), st.integers(0, 10**6))


@settings(max_examples=400, deadline=None)
@given(st.lists(entries, max_size=12))
def test_every_entry_lands_where_the_full_merge_puts_it(arrivals: list[dict[str, Any]]) -> None:
    fast: list[dict[str, Any]] = []
    full: list[dict[str, Any]] = []
    for entry in arrivals:
        fast, full = _with_entry(fast, entry), merged_timeline(full, entry)
        assert fast == full
