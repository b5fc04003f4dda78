"""Why a rebuild in any number of workers equals the incremental read model (pure).

The invocations model's rows depend only on each invocation's facts in log order and
its commands in their topic's order, never on how the two topics interleave, on batch
boundaries or on repeated events; the approvals model's only on the facts (a forged
decision command changes nothing); the audit row of a record depends only on the records before it
in its partition. So any split of the log into batches and workers gives one result.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import topics
from contracts.envelope import Envelope
from contracts.events import ApprovalDecided, ApprovalReceived, InvokeCancelRequested
from projections.approvals import approvals_model
from projections.audit import ROW_COLUMNS
from projections.audit_document import GENESIS, audit_entry
from projections.bulk_rows import columns_of, row_tuples
from projections.invocations import invocations_model
from projections.store import AggregateModel, Rows
from projections.tables import approvals, audit_log, invocations, iso
from tests.projection_events import at, captoken, envelope, invocation

OUTCOMES = ("completed", "failed", "denied")


def _log(seed: int, count: int) -> list[Envelope]:
    """Invocations interleaved as a busy pipeline writes them, with cancels (also after
    the end) and redelivered events."""
    chooser = random.Random(seed)
    streams = []
    for n in range(count):
        approval = chooser.choice((None, None, "approve", "deny"))
        events = invocation(f"inv-{n}", outcome=chooser.choice(OUTCOMES), start=n * 0.5,
                            token=captoken("ann", f"j{n}") if n % 3 == 0 else None,
                            reports=chooser.choice((0, 0, 1, 3)), approval=approval)
        if approval is not None and chooser.random() < 0.5:  # a forged decision, anywhere
            forged = envelope(ApprovalDecided(invocation_id=f"inv-{n}", decision="deny",
                                              approved_hash="sha256:" + "00" * 32,
                                              decided_by="did:example:forger"),
                              f"inv-{n}", when=at(n * 0.5 + 9.5), id=f"forged-{n}")
            events.insert(chooser.randrange(1, len(events) + 1), forged)
        if chooser.random() < 0.4:
            cancel = envelope(InvokeCancelRequested(invocation_id=f"inv-{n}", reason="stop"),
                              f"inv-{n}", when=at(n * 0.5 + chooser.choice((0.015, 9.0))),
                              id=f"cancel-{n}")
            events.insert(chooser.randrange(1, len(events) + 1), cancel)
        if chooser.random() < 0.3:
            events.insert(chooser.randrange(1, len(events) + 1),
                          events[chooser.randrange(len(events))])
        streams.append(events)
    merged: list[Envelope] = []
    while any(streams):
        stream = chooser.choice([s for s in streams if s])
        merged.append(stream.pop(0))
    return merged


def _fold(model: AggregateModel, batches: list[list[Envelope]]) -> tuple[dict[str, Rows], int]:
    states: dict[str, Rows] = {}
    duplicates = 0
    for batch in batches:
        keyed = [(key, e) for e in batch if (key := model.aggregate_of(e)) is not None]
        for key, _ in keyed:
            states.setdefault(key, {table.name: [] for table in model.tables})
        duplicates += model.fold_all(states, keyed)
    return states, duplicates


def _as_read_by(log: list[Envelope], chooser: random.Random) -> list[list[Envelope]]:
    """The log as one runner may read it: requests and facts are two topics, fetched in
    batches of any size, the two topics' records in any relative order."""
    commands = [e for e in log if e.type in topics.COMMAND_TYPES]
    facts = [e for e in log if e.type not in topics.COMMAND_TYPES]
    batches: list[list[Envelope]] = []
    while commands or facts:
        take_c, take_f = chooser.randint(0, 7), chooser.randint(0, 7)
        some_commands, some_facts = commands[:take_c], facts[:take_f]
        commands, facts = commands[take_c:], facts[take_f:]
        batches.append(some_commands + some_facts if chooser.random() < 0.5
                       else some_facts + some_commands)
    return batches


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 12), st.integers(0, 10_000))
def test_invocation_rows_do_not_depend_on_batches_or_topic_interleaving(
        seed: int, count: int, reading: int) -> None:
    model = invocations_model()
    log = _log(seed, count)
    reference, duplicates = _fold(model, [log])
    again, again_duplicates = _fold(model, _as_read_by(log, random.Random(reading)))
    assert again == reference and again_duplicates == duplicates
    assert duplicates == len(log) - len({e.id for e in log})
    def written(states: dict[str, Rows]) -> list[tuple[Any, ...]]:
        return row_tuples(invocations, (states[key][invocations.name][0] for key in sorted(states)))

    assert written(again) == written(reference)  # the very values stored


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 12), st.integers(0, 10_000))
def test_approval_rows_do_not_depend_on_batches_or_topic_interleaving(
        seed: int, count: int, reading: int) -> None:
    model = approvals_model()
    log = _log(seed, count)
    reference, _ = _fold(model, [log])
    again, _ = _fold(model, _as_read_by(log, random.Random(reading)))
    assert again == reference
    twice, _ = _fold(model, [log, log])  # every event repeated: folded again, no change
    assert twice == reference
    received: dict[str, tuple[str, str]] = {}  # what the pipeline received, never a command
    for event in log:
        if isinstance(event.data, ApprovalReceived):
            received.setdefault(event.data.invocation_id,
                                (event.data.decided_by, iso(event.time)))
    rows = {key: states[approvals.name][0] for key, states in reference.items()
            if states[approvals.name]}
    assert {key: (row["decided_by"], row["decided_at"])
            for key, row in rows.items()} == received
    assert all(row["outcome"] is not None for row in rows.values())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 12), st.integers(0, 10_000))
def test_approval_rows_are_the_same_when_the_live_model_skips_closed_invocations(
        seed: int, count: int, reading: int) -> None:
    """Live, the approvals model keeps the set of pending approvals and folds no event
    of an invocation neither pending nor opened in the batch (its rows are not even
    read): the rows are those of the whole fold, and the set is exactly the pending
    rows'."""
    model = approvals_model()
    assert model.open_rows is not None
    log = _log(seed, count)
    reference, _ = _fold(model, [log])
    states: dict[str, Rows] = {}
    open_keys: set[str] = set()
    skipped = 0
    for batch in _as_read_by(log, random.Random(reading)):
        keyed = [(key, e) for e in batch if (key := model.aggregate_of(e)) is not None]
        relevant = model.relevant(keyed, open_keys)
        skipped += len(keyed) - len(relevant)
        after = {key: states.get(key, {approvals.name: []}) for key, _ in relevant}
        model.fold_all(after, relevant)
        states.update(after)
        open_keys = model.still_open(open_keys, after)
        assert open_keys == {key for key, rows in states.items() if model.open_rows.is_open(rows)}

    def stored(found: dict[str, Rows]) -> dict[str, Rows]:
        return {key: rows for key, rows in found.items() if rows[approvals.name]}

    assert stored(states) == stored(reference)
    never_waited = sum(1 for e in log if (key := model.aggregate_of(e)) is not None
                       and key not in stored(reference))
    assert skipped >= never_waited  # an invocation no approver saw is never read


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 300))
def test_an_audit_chain_does_not_depend_on_batch_boundaries(seed: int, cut: int) -> None:
    log = _log(seed, 6)

    def chain(records: list[Envelope], prev: str, start: int) -> list[Any]:
        entries = []
        for offset, event in enumerate(records, start):
            entry = audit_entry(event, topic="t", partition=0, offset=offset, prev_hash=prev)
            entries.append(entry)
            prev = entry.hash
        return entries

    whole = chain(log, GENESIS, 0)
    cut = cut % (len(log) + 1)
    first = chain(log[:cut], GENESIS, 0)
    second = chain(log[cut:], first[-1].hash if first else GENESIS, cut)
    assert first + second == whole


def test_audit_rows_are_written_in_the_table_s_column_order() -> None:
    assert columns_of(audit_log) == ROW_COLUMNS


def test_json_columns_are_written_as_compact_text_and_other_values_as_they_are() -> None:
    row = {c.name: None for c in invocations.columns}
    row.update(invocation_id="i", status="failed", attempts=2, cancel_requested=True,
               timeline=[{"type": "x", "id": "é"}], updated_at="t")
    (written,) = row_tuples(invocations, [row])
    values = dict(zip(columns_of(invocations), written, strict=True))
    assert values["timeline"] == '[{"type":"x","id":"é"}]'
    assert values["attempts"] == 2 and values["cancel_requested"] is True
