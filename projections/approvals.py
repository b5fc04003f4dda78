"""The approvals read model: one row per invocation that waited for an approver.

Folded from the pipeline's signed facts only, in log order: `tool.approval.requested`,
`tool.approval.received` and the terminal event. The decision shown is the one the
pipeline received, the first whose approver's token may decide, dated when the pipeline
read it; never a `tool.approval.decided` command, which anyone who can write the requests
topic can forge (the pipeline dead-letters those that cannot count). Each part of the
row is set by its own events only: the request's columns by the request, the decision's
by the first `tool.approval.received`, the outcome by the terminal event, which the
request always precedes. A rebuild gives the same rows, and a repeated event folded
again changes nothing. Pending = requested, no outcome yet.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from contracts import topics
from contracts.envelope import Envelope
from contracts.events import ApprovalReceived, ApprovalRequested, InvokeCompleted, InvokeFailed
from domain.redaction import redact
from projections.store import AggregateModel, OpenRows, Row, Rows, single_row
from projections.tables import approvals, iso

NAME = "approvals"
COLUMNS = tuple(column.name for column in approvals.columns)


def _empty(invocation_id: str) -> Row:
    return {name: None for name in COLUMNS} | {"invocation_id": invocation_id}


def evolve_approval(row: Row | None, envelope: Envelope) -> Row | None:
    """Fold one event into the invocation's approval row (pure)."""
    data: Any = envelope.data
    at = iso(envelope.time)
    if isinstance(data, ApprovalRequested):
        new = dict(row) if row is not None else _empty(data.invocation_id)
        new.update(tool_id=data.tool_id, version=data.version, integrity=data.integrity,
                   subject=data.subject,
                   policy_version=data.policy_version, call_hash=data.call_hash,
                   parameters=redact(data.parameters).value, reasons=list(data.reasons),
                   requested_at=at, expires_at=iso(data.expires_at))
        return new
    if isinstance(data, ApprovalReceived):
        new = dict(row) if row is not None else _empty(data.invocation_id)
        if new["decision"] is None:
            new.update(decision=data.decision, approved_hash=data.approved_hash,
                       decided_by=data.decided_by,
                       decision_reason=None if data.reason is None
                       else redact(data.reason).value,
                       decided_at=at)
        return new
    if isinstance(data, InvokeCompleted | InvokeFailed):
        if row is None or row["requested_at"] is None or row["outcome"] is not None:
            return row
        error = getattr(data, "error", None)
        return {**row, "outcome": envelope.type.rsplit(".", 1)[-1],
                "error_code": None if error is None else error.code, "finished_at": at}
    return row


_FOLDED = (ApprovalRequested, ApprovalReceived, InvokeCompleted, InvokeFailed)


def _invocation_of(envelope: Envelope) -> str | None:
    data = envelope.data
    return data.invocation_id if isinstance(data, _FOLDED) else None


def no_event_ids(_rows: Rows) -> frozenset[str]:
    """A repeated event needs no skipping here: folding it again changes nothing (a
    request writes the same values, the first decision and the first terminal event
    stay), so the runner keeps no applied-id row per event of the busiest topic."""
    return frozenset()


def _opening(envelope: Envelope) -> bool:
    return isinstance(envelope.data, ApprovalRequested | ApprovalReceived)


def _pending(rows: Rows) -> bool:
    """Whether a terminal event would change the row: requested, no outcome yet."""
    found = rows[approvals.name]
    return bool(found) and found[0]["requested_at"] is not None and found[0]["outcome"] is None


PENDING = OpenRows(opening=_opening, is_open=_pending, keys=select(approvals.c.invocation_id)
                   .where(approvals.c.requested_at.is_not(None), approvals.c.outcome.is_(None)))
"""A terminal event changes only a pending approval's row: the runner reads no row for
the terminal event of an invocation that never waited for an approver."""


def approvals_model() -> AggregateModel:
    """The approvals read model, ready for a runner."""
    return AggregateModel(name=NAME, topics=(topics.INVOCATIONS,),
                          tables=(approvals,), key_column="invocation_id",
                          aggregate_of=_invocation_of,
                          fold=single_row(approvals, evolve_approval),
                          event_ids=no_event_ids, open_rows=PENDING)
