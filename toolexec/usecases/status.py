"""The live status of the system as one reader may see it: recent invocations, pending
work, the calls waiting for an approver, circuit breakers and the last hour's traffic per tool (from the read models).

Every read is bounded: the newest invocations, the oldest pending ones, the newest
`MAX_ENDINGS` terminal events of the window (`truncated` says when the window held more).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from contracts.events import InvokeFailed
from domain.traffic import Ending, traffic
from projections.queries import (
    list_circuits,
    list_invocations,
    pending_approvals,
    pending_invocations,
    recent_endings,
)
from projections.tables import ISO_FORMAT
from toolexec.usecases.cancel import shown_status
from toolexec.usecases.timeline import latest_progress

WINDOW = timedelta(hours=1)
BUCKET_SECONDS = 60
RECENT = 50
PENDING_SHOWN = 50
MAX_ENDINGS = 20_000


def invocation_summary(row: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of an invocations row a status table shows."""
    return {"invocation_id": row["invocation_id"], "tool_id": row["tool_id"],
            "version": row["version"] or row["version_range"], "status": shown_status(row),
            "duration_ms": row["duration_ms"], "error_code": row["error_code"],
            "requested_at": row["requested_at"], "updated_at": row["updated_at"],
            "progress": latest_progress(row)}


def approval_summary(row: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a pending approval a status table shows."""
    return {name: row[name] for name in ("invocation_id", "tool_id", "version", "subject",
                                         "call_hash", "requested_at", "expires_at")}


def _moment(stored: str) -> datetime:
    return datetime.strptime(stored, ISO_FORMAT).replace(tzinfo=UTC)


async def status_snapshot(engine: AsyncEngine, *, subject: str | None,
                          now: datetime | None = None) -> dict[str, Any]:
    """Everything the status page shows and refreshes, JSON-ready; `subject` limits
    invocations and traffic to that subject's (None: every caller's)."""
    end = (now or datetime.now(UTC)).replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - WINDOW
    async with engine.connect() as conn:
        recent = await list_invocations(conn, limit=RECENT, subject=subject)
        pending_count, pending = await pending_invocations(conn, limit=PENDING_SHOWN,
                                                           subject=subject)
        circuits = await list_circuits(conn)
        approvals = await pending_approvals(conn, limit=PENDING_SHOWN, subject=subject)
        endings = await recent_endings(conn, start, limit=MAX_ENDINGS, subject=subject)
    series = traffic((Ending(_moment(e["time"]), e["tool_id"] or "?",
                             e["type"] == InvokeFailed.EVENT_TYPE, e["duration_ms"],
                             e["error_code"]) for e in endings),
                     start=start, end=end, bucket_seconds=BUCKET_SECONDS)
    return {
        "generated_at": datetime.now(UTC).isoformat(),
        "invocations": [invocation_summary(row) for row in recent],
        "pending": {"count": pending_count,
                    "invocations": [invocation_summary(row) for row in pending]},
        "approvals": [approval_summary(row) for row in approvals],
        "circuits": circuits,
        "traffic": {"start": start.isoformat(), "end": end.isoformat(),
                    "bucket_seconds": BUCKET_SECONDS, "endings": len(endings),
                    "truncated": len(endings) >= MAX_ENDINGS,
                    "tools": {tool: [b.as_dict() for b in buckets]
                              for tool, buckets in series.items()}},
    }
