"""The definitions read model's fold and the pipeline's view of it (pure)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.envelope import Envelope
from projections.bulk_rows import row_tuples
from projections.definitions import TABLE, DefinitionLogView, definitions_model, fold_definitions
from projections.store import Rows
from projections.tables import tool_definitions
from tests.projection_events import definition_log, published

FIRST, SECOND, THIRD = (f"sha256:{c * 64}" for c in "abc")


def _fold(events: list[Envelope]) -> list[dict]:
    rows: Rows = {TABLE: []}
    for event in events:
        rows = fold_definitions(rows, event)
    return rows[TABLE]


def test_the_first_pin_in_the_log_stands() -> None:
    log = definition_log("srv")
    (row,) = _fold(log[:2])
    assert row["definition_hash"] == FIRST and row["state"] == "pinned"
    assert row["pinned_how"] == "first_use" and row["pin_event_id"] == log[0].id
    (swapped,) = _fold([log[1], log[0]])
    assert swapped["definition_hash"] == SECOND


def test_a_drift_waits_once_and_an_approval_makes_it_the_pin() -> None:
    log = definition_log("srv")
    (drifted,) = _fold(log[:4])  # the drift is on the log twice
    assert drifted["state"] == "drifted" and drifted["definition_hash"] == FIRST
    assert [p["definition_hash"] for p in drifted["pending"]] == [SECOND]
    assert drifted["pending"][0]["diff"] == [{"path": "/description", "change": "changed",
                                              "old": "aaaa", "new": "bbbb"}]
    (approved,) = _fold(log[:5])
    assert approved["state"] == "pinned" and approved["definition_hash"] == SECOND
    assert approved["pinned_how"] == "approved" and approved["approved_by"] == "did:example:ops"
    assert approved["pending"] == [] and approved["server_version"] == "1.0.1"
    (again,) = _fold(log)
    assert again["state"] == "drifted"
    assert [p["definition_hash"] for p in again["pending"]] == [THIRD]


def test_an_event_seen_again_later_changes_nothing() -> None:
    log = definition_log("srv")
    assert _fold([*log, log[4], log[2]]) == _fold(log)


def test_other_events_and_other_tools_keep_their_rows() -> None:
    log = definition_log("srv") + definition_log("srv", "other")
    rows = _fold([published("grep", "1.0.0"), *log])
    assert [r["mcp_tool_name"] for r in rows] == ["echo", "other"]


def test_the_view_answers_what_the_table_holds() -> None:
    view = DefinitionLogView()
    for offset, event in enumerate(definition_log("srv")[:5]):
        view.apply(event, partition=0, offset=offset)
    pin = view.pin("srv", "echo")
    assert pin is not None and pin.definition_hash == SECOND and pin.pending == frozenset()
    assert view.pin("srv", "nope") is None and view.pin("other", "echo") is None


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 6))
def test_rows_do_not_depend_on_batches(seed: int, servers: int) -> None:
    chooser = random.Random(seed)
    streams = [definition_log(f"srv{n}", start=n) for n in range(servers)]
    log: list[Envelope] = []
    while any(streams):  # each server's events in order, servers interleaved
        log.append(chooser.choice([s for s in streams if s]).pop(0))
    model = definitions_model()

    def fold(batches: list[list[Envelope]]) -> dict[str, Rows]:
        states: dict[str, Rows] = {}
        for batch in batches:
            keyed = [(key, e) for e in batch if (key := model.aggregate_of(e)) is not None]
            for key, _ in keyed:
                states.setdefault(key, {TABLE: []})
            model.fold_all(states, keyed)
        return states

    cuts = sorted(chooser.sample(range(len(log) + 1), k=min(3, len(log) + 1)))
    batches = [log[a:b] for a, b in zip([0, *cuts], [*cuts, len(log)], strict=True)]
    whole, split = fold([log]), fold(batches)
    assert split == whole
    written = [row_tuples(tool_definitions, states[k][TABLE])
               for states in (whole, split) for k in sorted(states)]
    assert written[:len(whole)] == written[len(whole):]
