"""Audit queries: pages of the audit trail (redacted CloudEvents, hash-chained), filtered
by time, type, invocation, tool and the caller's subject."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from domain.errors import InvalidRequest
from projections.audit import AuditQuery, audit_records


def utc(moment: datetime | None, name: str) -> datetime | None:
    """`moment` in UTC; InvalidRequest (E3004) when it has no offset or is out of range."""
    if moment is None:
        return None
    if moment.utcoffset() is None:
        raise InvalidRequest(f"{name} needs a UTC offset (e.g. Z)", details={name: str(moment)})
    try:
        return moment.astimezone(UTC)
    except (OverflowError, ValueError):
        raise InvalidRequest(f"{name} is out of range", details={name: str(moment)}) from None


async def audit_page(engine: AsyncEngine, query: AuditQuery, limit: int) -> list[dict[str, Any]]:
    """At most `limit` matching audit records, each with its parsed CloudEvent."""
    records: list[dict[str, Any]] = []
    async with engine.connect() as conn, contextlib.aclosing(audit_records(conn, query)) as rows:
        async for row in rows:
            records.append({k: v for k, v in row.items() if k != "document"})
            if len(records) >= limit:
                break
    return records
