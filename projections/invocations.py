"""The invocations read model: one row per invocation, folded from the requests
(`toolexec.requests`) and the facts (`toolexec.invocations`).

Status moves requested -> resolved -> authorized -> running -> completed | failed and
never leaves a terminal state; every event also lands in the row's timeline.

Commands and facts of one invocation sit on two topics, and no order holds across
topics: a batch may bring the facts before their request. The fold does not depend on
it: the timeline is the facts in log order merged with the commands in time order, the
same whatever the batches were, so a rebuild gives the same rows.
"""

from __future__ import annotations

import json
from typing import Any

from contracts import topics
from contracts.envelope import Envelope
from contracts.events import TERMINAL_STATUSES as TERMINAL
from contracts.events import (
    ChainResolved,
    ExecutionCheckpointed,
    ExecutionFinished,
    ExecutionProgressed,
    ExecutionStarted,
    InvokeCancelRequested,
    InvokeCompleted,
    InvokeFailed,
    InvokeRequested,
    PermissionDecided,
)
from domain.redaction import redact, redact_secrets
from projections.audit_document import captoken_identity
from projections.store import AggregateModel, Row, Rows, field_of, single_row
from projections.tables import invocations, iso

NAME = "invocations"
RESULT_SUMMARY_CHARS = 500


def new_invocation(invocation_id: str, at: str) -> Row:
    """The row of an invocation known only by id (its first event may not be the request)."""
    return {"invocation_id": invocation_id, "status": "requested", "tool_id": None,
            "version_range": None, "version": None, "subject": None, "requested_by": None,
            "attempts": 0, "duration_ms": None, "error_code": None, "error_message": None,
            "failed_stage": None, "result_summary": None, "cancel_requested": False,
            "timeline": [], "requested_at": None, "updated_at": at, "finished_at": None,
            "callback_url": None, **NO_PROGRESS}


NO_PROGRESS: Row = {"progress_sequence": None, "progress_fraction": None,
                    "progress_message": None, "progress_at": None, "checkpoints": 0,
                    "checkpoint_bytes": 0, "checkpoint_stored_bytes": 0,
                    "last_checkpoint_hash": None}
"""The progress columns of an invocation no attempt has reported on (yet)."""


def evolve_invocation(row: Row | None, envelope: Envelope) -> Row | None:
    """Fold one invocation event into the invocation's row (pure)."""
    data: Any = envelope.data
    invocation_id = field_of(data, "invocation_id")
    if invocation_id is None:
        return row
    at = iso(envelope.time)
    new = dict(row) if row is not None else new_invocation(invocation_id, at)
    new["timeline"] = _with_entry(new["timeline"], _timeline_entry(envelope, at))
    new["updated_at"] = max(new["updated_at"], at)
    if field_of(data, "tool_id") and new["tool_id"] is None:
        new["tool_id"] = data.tool_id
    if field_of(data, "version") and not isinstance(data, InvokeRequested):
        new["version"] = data.version
    _apply(new, envelope, at)
    return new


PENDING_STATUSES: tuple[str, ...] = ("requested", "resolved", "authorized", "running")
"""The statuses `_apply` gives an invocation before its terminal event (then one of
`contracts.events.TERMINAL_STATUSES`)."""


def _apply(row: Row, envelope: Envelope, at: str) -> None:
    data: Any = envelope.data
    terminal = row["status"] in TERMINAL
    if isinstance(data, InvokeRequested):
        row.update(version_range=data.version_range, requested_by=data.requested_by,
                   requested_at=at, tool_id=data.tool_id)
        row["subject"] = row["subject"] or captoken_identity(envelope)[0]
        row["callback_url"] = data.callback_url
    elif isinstance(data, ChainResolved) and not terminal:
        row["status"] = "resolved"
    elif isinstance(data, PermissionDecided):
        row["subject"] = data.subject or row["subject"]
        if data.decision == "allow" and not terminal:
            row["status"] = "authorized"
    elif isinstance(data, ExecutionStarted):
        row["attempts"] = max(row["attempts"], data.attempt)
        if not terminal:
            row["status"] = "running"
    elif isinstance(data, ExecutionFinished):
        row["attempts"] = max(row["attempts"], data.attempt)
        row["duration_ms"] = data.duration_ms
    elif isinstance(data, InvokeCompleted) and not terminal:
        row.update(status="completed", attempts=data.attempts, duration_ms=data.duration_ms,
                   result_summary=_summary(data.result), finished_at=at)
    elif isinstance(data, InvokeFailed) and not terminal:
        row.update(status="failed", error_code=data.error.code,
                   error_message=redact(data.error.message).value, failed_stage=data.stage,
                   finished_at=at)
    elif isinstance(data, InvokeCancelRequested):
        row["cancel_requested"] = True
    elif isinstance(data, ExecutionProgressed):
        _progressed(row, data, at)
    elif isinstance(data, ExecutionCheckpointed):
        _checkpointed(row, data)


def _progressed(row: Row, data: ExecutionProgressed, at: str) -> None:
    """The latest report (highest sequence) is the invocation's progress."""
    if row["progress_sequence"] is not None and data.sequence <= row["progress_sequence"]:
        return
    row.update(progress_sequence=data.sequence, progress_fraction=data.fraction,
               progress_message=redact(data.message).value, progress_at=at)


def _checkpointed(row: Row, data: ExecutionCheckpointed) -> None:
    # Repeated events never reach the fold (event ids), so each checkpoint counts once.
    row["checkpoints"] += 1
    row["checkpoint_bytes"] += data.size
    row["checkpoint_stored_bytes"] += data.stored_size
    row["last_checkpoint_hash"] = data.state_hash


def _with_entry(timeline: list[dict[str, Any]], entry: dict[str, Any]) -> list[dict[str, Any]]:
    """`timeline` with `entry`: facts keep their log order, commands (requests,
    cancels) sorted by (time, id) are merged in by time, before facts of a later time."""
    if entry["type"] not in topics.COMMAND_TYPES and (
            not timeline or timeline[-1]["time"] <= entry["time"]
            or timeline[-1]["type"] not in topics.COMMAND_TYPES):
        # The usual case: a fact after every command already in, which `merged_timeline`
        # would put last.
        return [*timeline, entry]
    return merged_timeline(timeline, entry)


def merged_timeline(timeline: list[dict[str, Any]],
                    entry: dict[str, Any]) -> list[dict[str, Any]]:
    """`_with_entry` the long way: facts and commands split, commands sorted, merged."""
    facts = [e for e in timeline if e["type"] not in topics.COMMAND_TYPES]
    commands = [e for e in timeline if e["type"] in topics.COMMAND_TYPES]
    if entry["type"] in topics.COMMAND_TYPES:
        commands = sorted([*commands, entry], key=lambda e: (e["time"], e["id"]))
    else:
        facts.append(entry)
    merged: list[dict[str, Any]] = []
    remaining = iter(commands)
    command = next(remaining, None)
    for fact in facts:
        while command is not None and command["time"] <= fact["time"]:
            merged.append(command)
            command = next(remaining, None)
        merged.append(fact)
    if command is not None:
        merged.append(command)
    merged.extend(remaining)
    return merged


TIMELINE_FIELDS = ("attempt", "decision", "outcome", "stage", "sequence", "fraction", "size",
                   "stored_size", "compression", "state_hash")
"""The fields of an event its timeline entry carries, when the event has them."""


def _timeline_entry(envelope: Envelope, at: str) -> dict[str, Any]:
    data: Any = envelope.data
    entry: dict[str, Any] = {"type": envelope.type, "time": at, "id": envelope.id}
    fields = data.__dict__  # `field_of` of each name, looked up in one dict
    for name in TIMELINE_FIELDS:
        value = fields.get(name)
        if value is not None:
            entry[name] = value
    if isinstance(data, ExecutionProgressed):
        entry["message"] = redact(data.message).value
    error = field_of(data, "error")
    if error is not None:
        entry["error_code"] = error.code
    return entry


def _summary(result: Any) -> str:
    # The caller's own result (GET /v1/invocations/{id} answers it to async callers):
    # secrets removed as in the terminal event, PII left as the tool returned it.
    text = json.dumps(redact_secrets(result).value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= RESULT_SUMMARY_CHARS else text[:RESULT_SUMMARY_CHARS - 1] + "…"


def _invocation_of(envelope: Envelope) -> str | None:
    return field_of(envelope.data, "invocation_id")


def folded_event_ids(rows: Rows) -> list[str]:
    """Ids of the events already in an invocation's row (its timeline): a repeated
    event (same id at another log position) is skipped, with no applied-ids table."""
    found = rows[invocations.name]
    # A list: `in` over a timeline's few ids is cheaper than hashing them into a set.
    return [entry["id"] for entry in found[0]["timeline"]] if found else []


def invocations_model() -> AggregateModel:
    """The invocations read model, ready for a runner."""
    return AggregateModel(name=NAME, topics=(topics.REQUESTS, topics.INVOCATIONS),
                          tables=(invocations,),
                          key_column="invocation_id", aggregate_of=_invocation_of,
                          fold=single_row(invocations, evolve_invocation),
                          event_ids=folded_event_ids, guesses_new=True)
