"""Read-side queries over the SQL read models, used by the CLI and the gateway."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from projections.search import Filters, SearchResult, search
from projections.tables import circuits, invocations, registry_tools, registry_versions


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
