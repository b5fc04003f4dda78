"""The invocations fold keeps the latest progress and the checkpoints of a running
invocation (tool.execution.progressed / checkpointed), whatever else the log holds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.events import ExecutionProgressed
from tests.projection_events import at, envelope, invocation
from tests.unit.test_fold_properties import fold


def test_latest_progress_and_checkpoint_totals() -> None:
    row = fold(invocation("inv", reports=4))
    assert row["status"] == "completed"
    assert (row["progress_sequence"], row["progress_fraction"], row["progress_message"]) \
        == (3, 1.0, "step 4 of 4")
    assert row["checkpoints"] == 4
    assert row["checkpoint_bytes"] == 100 + 101 + 102 + 103
    assert row["checkpoint_stored_bytes"] == 40 + 41 + 42 + 43
    assert row["last_checkpoint_hash"] == f"sha256:{3:064x}"


def test_progress_shows_while_running() -> None:
    events = invocation("inv", reports=3)
    running = fold(events[:6])  # request .. started, first report and its checkpoint
    assert running["status"] == "running"
    assert running["progress_fraction"] == 1 / 3 and running["checkpoints"] == 1
    kinds = [entry["type"] for entry in running["timeline"]]
    assert kinds[-2:] == ["tool.execution.progressed", "tool.execution.checkpointed"]
    assert running["timeline"][-2]["message"] == "step 1 of 3"
    assert running["timeline"][-1]["stored_size"] == 40


def test_no_report_leaves_the_progress_empty() -> None:
    row = fold(invocation("inv"))
    assert row["progress_sequence"] is None and row["progress_fraction"] is None
    assert row["checkpoints"] == 0 and row["checkpoint_bytes"] == 0


def test_a_report_message_is_redacted_like_an_error() -> None:
    events = invocation("inv")
    leaky = envelope(ExecutionProgressed(invocation_id="inv", attempt=1, sequence=0,
                                         message="mailing bob@example.com"), "inv",
                     when=at(0.04), id="p0")
    row = fold([*events[:4], leaky])
    assert "bob@example.com" not in row["progress_message"]
    assert "bob@example.com" not in str(row["timeline"])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.none() | st.floats(0, 1)), max_size=12))
def test_the_highest_sequence_wins_whatever_the_order(reports) -> None:
    """Reports of a resumed attempt may follow older ones of a dead attempt in the log:
    the newest (highest sequence) is the one shown."""
    events = invocation("inv")[:4]
    for n, (sequence, fraction) in enumerate(reports):
        events.append(envelope(ExecutionProgressed(
            invocation_id="inv", attempt=1, sequence=sequence, fraction=fraction,
            message=f"m{sequence}"), "inv", when=at(0.04), id=f"p{n}"))
    row = fold(events)
    if not reports:
        assert row["progress_sequence"] is None
        return
    top = max(s for s, _ in reports)
    first_top = next(f for s, f in reports if s == top)
    assert (row["progress_sequence"], row["progress_fraction"], row["progress_message"]) \
        == (top, first_top, f"m{top}")
    assert sum(e["type"] == "tool.execution.progressed" for e in row["timeline"]) \
        == len(reports)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 12), st.integers(1, 40))
def test_checkpoint_totals_are_those_of_the_prefix(reports: int, cut: int) -> None:
    events = invocation("inv", reports=reports)[:cut]
    row = fold(events)
    checkpoints = [e for e in events if e.type == "tool.execution.checkpointed"]
    assert row["checkpoints"] == len(checkpoints)
    assert row["checkpoint_bytes"] == sum(e.data.size for e in checkpoints)
