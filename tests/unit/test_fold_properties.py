"""Invariants of the invocations fold, over generated event sequences (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from projections.invocations import TERMINAL, evolve_invocation
from tests.projection_events import invocation

RANK = {"requested": 0, "resolved": 1, "authorized": 2, "running": 3, "completed": 4,
        "failed": 4}
OUTCOMES = ("completed", "failed", "denied")
FINAL_FIELDS = ("status", "error_code", "failed_stage", "result_summary", "finished_at")


def fold(events):
    row = None
    for event in events:
        row = evolve_invocation(row, event)
    return row


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(OUTCOMES))
def test_status_only_moves_forward_along_the_log(outcome: str) -> None:
    events = invocation("inv", outcome=outcome)
    ranks = [RANK[fold(events[:n])["status"]] for n in range(1, len(events) + 1)]
    assert ranks == sorted(ranks)
    assert fold(events)["status"] == ("completed" if outcome == "completed" else "failed")


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(OUTCOMES), st.sampled_from(OUTCOMES),
       st.lists(st.integers(min_value=0, max_value=6), max_size=8))
def test_nothing_after_the_terminal_event_changes_the_outcome(
        first: str, other: str, picks: list[int]) -> None:
    events = invocation("inv", outcome=first)
    late = invocation("inv", outcome=other)
    row = fold(events)
    assert row["status"] in TERMINAL
    after = fold([*events, *(late[i % len(late)] for i in picks)])
    assert {f: after[f] for f in FINAL_FIELDS} == {f: row[f] for f in FINAL_FIELDS}
    assert len(after["timeline"]) == len(events) + len(picks)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(OUTCOMES), st.integers(min_value=1, max_value=7))
def test_the_fold_is_pure(outcome: str, cut: int) -> None:
    events = invocation("inv", outcome=outcome)
    prefix = fold(events[:cut])
    snapshot = repr(prefix)
    fold(events)  # folding further from scratch leaves an earlier row untouched
    assert evolve_invocation(prefix, events[0]) is not prefix
    assert repr(prefix) == snapshot
