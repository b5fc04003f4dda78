"""Read-side queries over the SQL read models, used by the CLI and the gateway."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from contracts.events import TERMINAL_TYPES
from projections.invocations import PENDING_STATUSES
from projections.search import Filters, SearchResult, search
from projections.tables import (
    approvals,
    audit_log,
    circuits,
    invocations,
    iso,
    registry_tools,
    registry_versions,
    tool_definitions,
)


async def search_tools(conn: AsyncConnection, query: str, *, limit: int = 50,
                       include_removed: bool = False, offset: int = 0,
                       tool_type: str | None = None, tag: str | None = None,
                       lifecycle: str | None = None,
                       embedder: Any = None) -> list[dict[str, Any]]:
    """Tools matching `query`, best first (each row with `score` and `matched`
    fields); an empty query lists them by id. See `search_tools_page`."""
    return (await search_tools_page(
        conn, query, limit=limit, include_removed=include_removed, offset=offset,
        tool_type=tool_type, tag=tag, lifecycle=lifecycle, embedder=embedder)).rows


async def search_tools_page(conn: AsyncConnection, query: str, *, limit: int = 50,
                            include_removed: bool = False, offset: int = 0,
                            tool_type: str | None = None, tag: str | None = None,
                            lifecycle: str | None = None,
                            embedder: Any = None) -> SearchResult:
    """One page of ranked search (`projections.search.search`): rows, the ranking
    `mode` (list, lexical, hybrid), the total number of matches and the query words.
    Removed tools are left out unless `include_removed` or `lifecycle="removed"`."""
    filters = Filters(tool_type=tool_type, tag=tag, lifecycle=lifecycle,
                      include_removed=include_removed)
    return await search(conn, query, limit=limit, offset=offset, filters=filters,
                        embedder=embedder)


async def list_definitions(conn: AsyncConnection,
                           server_tool_id: str | None = None) -> list[dict[str, Any]]:
    """Pinned MCP tool definitions (all, or one server's), by server and tool name."""
    query = select(tool_definitions).order_by(tool_definitions.c.server_tool_id,
                                              tool_definitions.c.mcp_tool_name)
    if server_tool_id is not None:
        query = query.where(tool_definitions.c.server_tool_id == server_tool_id)
    return [dict(row) for row in (await conn.execute(query)).mappings()]


async def show_tool(conn: AsyncConnection, tool_id: str) -> dict[str, Any] | None:
    """A tool's row with its versions (ascending), or None when unknown."""
    tool = (await conn.execute(select(registry_tools).where(
        registry_tools.c.tool_id == tool_id))).mappings().first()
    if tool is None:
        return None
    versions = (await conn.execute(select(registry_versions).where(
        registry_versions.c.tool_id == tool_id))).mappings().all()
    order = {v: i for i, v in enumerate(_semver_order([r["version"] for r in versions]))}
    return {**dict(tool), "versions": sorted((dict(r) for r in versions),
                                             key=lambda r: order[r["version"]])}


def _semver_order(versions: list[str]) -> list[str]:
    from domain.semver import sort_versions

    return sort_versions(sorted(versions))


async def invocation_status(conn: AsyncConnection, invocation_id: str) -> dict[str, Any] | None:
    """One invocation's row (status, timeline, result summary...), or None."""
    row = (await conn.execute(select(invocations).where(
        invocations.c.invocation_id == invocation_id))).mappings().first()
    return dict(row) if row is not None else None


async def list_invocations(conn: AsyncConnection, *, tool_id: str | None = None,
                           status: str | None = None, limit: int = 100,
                           subject: str | None = None) -> list[dict[str, Any]]:
    """Most recently updated invocations first, optionally by tool, status and subject."""
    conditions = []
    if subject is not None:
        conditions.append(invocations.c.subject == subject)
    if tool_id is not None:
        conditions.append(invocations.c.tool_id == tool_id)
    if status is not None:
        conditions.append(invocations.c.status == status)
    statement = (select(invocations).where(and_(True, *conditions))
                 .order_by(invocations.c.updated_at.desc()).limit(limit))
    return [dict(row) for row in (await conn.execute(statement)).mappings()]


async def list_circuits(conn: AsyncConnection, *, open_only: bool = False) -> list[dict[str, Any]]:
    """Circuit-breaker state per external service."""
    statement = select(circuits).order_by(circuits.c.service_id)
    if open_only:
        statement = statement.where(or_(circuits.c.state == "open",
                                        circuits.c.state == "half_open"))
    return [dict(row) for row in (await conn.execute(statement)).mappings()]


async def pending_approvals(conn: AsyncConnection, *, limit: int = 100,
                            subject: str | None = None) -> list[dict[str, Any]]:
    """Calls waiting for an approver (requested, not ended), the oldest first; with
    `subject`, only that agent's."""
    statement = (select(approvals)
                 .where(approvals.c.requested_at.is_not(None), approvals.c.outcome.is_(None))
                 .order_by(approvals.c.requested_at, approvals.c.invocation_id).limit(limit))
    if subject is not None:
        statement = statement.where(approvals.c.subject == subject)
    return [dict(row) for row in (await conn.execute(statement)).mappings()]


async def approval_of(conn: AsyncConnection, invocation_id: str) -> dict[str, Any] | None:
    """The approval row of `invocation_id`, if its call needed approval."""
    row = (await conn.execute(select(approvals).where(
        approvals.c.invocation_id == invocation_id))).mappings().first()
    return None if row is None or row["requested_at"] is None else dict(row)


async def recent_endings(conn: AsyncConnection, since: datetime, *, limit: int,
                         subject: str | None = None) -> list[dict[str, Any]]:
    """The newest (at most `limit`) terminal events since `since`, each with its
    invocation's tool, duration and error code: the audit trail's time index bounds
    the scan, the invocations row is read by its key."""
    # `type || ''`: the planner must walk the time index, not every terminal event ever.
    conditions = [audit_log.c.time >= iso(since),
                  audit_log.c.type.concat("").in_(sorted(TERMINAL_TYPES))]
    if subject is not None:
        conditions.append(invocations.c.subject == subject)
    statement = (select(audit_log.c.time, audit_log.c.type, audit_log.c.invocation_id,
                        invocations.c.tool_id, invocations.c.duration_ms,
                        invocations.c.error_code)
                 .join(invocations, invocations.c.invocation_id == audit_log.c.invocation_id)
                 .where(and_(*conditions)).order_by(audit_log.c.time.desc()).limit(limit))
    return [dict(row) for row in (await conn.execute(statement)).mappings()]


def _pending(subject: str | None) -> Any:
    # By (tool_id, status), the index the invocations table has: every published tool.
    conditions = [invocations.c.tool_id.in_(select(registry_tools.c.tool_id)),
                  invocations.c.status.in_(PENDING_STATUSES)]
    if subject is not None:
        conditions.append(invocations.c.subject == subject)
    return and_(*conditions)


async def pending_invocations(conn: AsyncConnection, *, limit: int,
                              subject: str | None = None) -> tuple[int, list[dict[str, Any]]]:
    """How many invocations of published tools have not ended, and the oldest `limit`."""
    count = (await conn.execute(select(func.count()).select_from(invocations)
                                .where(_pending(subject)))).scalar_one()
    statement = (select(invocations).where(_pending(subject))
                 .order_by(invocations.c.updated_at).limit(limit))
    return count, [dict(row) for row in (await conn.execute(statement)).mappings()]
