"""An invocation's timeline as one reader sees it: the pipeline's phases (requested,
resolved, decided, each attempt started / progressed / checkpointed / finished,
terminal) with its latest progress and its checkpoints, from the invocations read model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from contracts.events import TERMINAL_STATUSES
from domain.capability import Capability
from domain.errors import JobNotFound
from projections.queries import invocation_status
from toolexec.usecases.cancel import shown_status
from toolexec.usecases.readers import check_reader

PHASES: dict[str, str] = {
    "tool.invoke.requested": "requested",
    "tool.chain.resolved": "resolved",
    "tool.permission.decided": "decided",
    "tool.execution.started": "started",
    "tool.execution.progressed": "progress",
    "tool.execution.checkpointed": "checkpoint",
    "tool.execution.finished": "finished",
    "tool.invoke.completed": "completed",
    "tool.invoke.failed": "failed",
    "tool.invoke.cancel.requested": "cancel requested",
}
"""Event type -> the phase it marks in a timeline."""


def latest_progress(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The newest progress report of an invocation (None before any)."""
    if row.get("progress_sequence") is None:
        return None
    return {"sequence": row["progress_sequence"], "fraction": row["progress_fraction"],
            "message": row["progress_message"] or "", "at": row["progress_at"]}


def checkpoint_totals(row: Mapping[str, Any]) -> dict[str, Any]:
    """How many checkpoints an invocation saved, their bytes and stored bytes, the last
    one's state hash."""
    return {"count": row.get("checkpoints") or 0, "bytes": row.get("checkpoint_bytes") or 0,
            "stored_bytes": row.get("checkpoint_stored_bytes") or 0,
            "last_state_hash": row.get("last_checkpoint_hash")}


def timeline_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """An invocations row as a timeline document (JSON-ready)."""
    status = shown_status(row)
    error = None if row["error_code"] is None else {
        "code": row["error_code"], "message": row["error_message"] or "",
        "stage": row["failed_stage"]}
    return {"invocation_id": row["invocation_id"], "tool_id": row["tool_id"],
            "version": row["version"] or row["version_range"], "status": status,
            "ended": row["status"] in TERMINAL_STATUSES, "attempts": row["attempts"],
            "duration_ms": row["duration_ms"], "requested_at": row["requested_at"],
            "finished_at": row["finished_at"], "error": error,
            "result_summary": row["result_summary"], "progress": latest_progress(row),
            "checkpoints": checkpoint_totals(row),
            "timeline": [{**entry, "phase": PHASES.get(entry["type"], entry["type"])}
                         for entry in row["timeline"]]}


async def invocation_timeline(engine: AsyncEngine, invocation_id: str, *,
                              subject: str | None = None,
                              reader: Capability | None = None) -> dict[str, Any]:
    """The timeline of `invocation_id`; JobNotFound (E3702) when the read model has no
    such invocation, or (with `subject`) none of that subject's; AuthorizationError
    (E3206) when `reader` (a verified token; None with authorization off) may not read
    it, as over HTTP (toolexec.usecases.readers)."""
    async with engine.connect() as conn:
        row = await invocation_status(conn, invocation_id)
    if row is None or (subject is not None and row["subject"] != subject):
        raise JobNotFound(f"invocation {invocation_id!r} not found",
                          details={"invocation_id": invocation_id})
    check_reader(reader, row)
    return timeline_of(row)
