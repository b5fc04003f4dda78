"""Pinned MCP tool definitions as every front end shows and approves them.

`list_pins` reads the definitions read model (pinned or drifted, what drifted and
how). `approve` records a person's approval of a drifted definition: the target is a
server's tool id (the hash says which of its tools) or an `mcp_tool`'s id; with
authorization on the caller needs the `approve` scope on the server's tool id (or
admin); the `tool.definition.approved` event goes to the registry topic, and the
answer waits (bounded) until the read model shows the new pin.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from contracts.envelope import Envelope, new_envelope
from contracts.events import ToolDefinitionApproved
from domain.capability import Capability
from domain.errors import InvalidRequest, ToolNotFound
from domain.scopes import approve_need
from projections.definitions import NAME
from projections.queries import list_definitions, show_tool
from toolexec import rights

SOURCE = "urn:toolexec:definitions"
READ_MODEL_WAIT_SECONDS = 5.0
POLL_SECONDS = 0.1
_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


def shown(row: Mapping[str, Any]) -> dict[str, Any]:
    """A definitions row as the front ends show it."""
    return {key: row[key] for key in (
        "server_tool_id", "mcp_tool_name", "state", "definition_hash", "pinned_how",
        "approved_by", "server_version", "pinned_at", "updated_at", "definition", "pending")}


async def list_pins(engine: AsyncEngine, server_tool_id: str | None = None
                    ) -> list[dict[str, Any]]:
    """Every pinned MCP tool definition (or one server's), with its drifts."""
    async with engine.connect() as conn:
        return [shown(row) for row in await list_definitions(conn, server_tool_id)]


async def approve(bootstrap: str, database_url: str, target: str, digest: str,
                  capability: Capability | None, client_options: Mapping[str, Any],
                  reason: str | None = None) -> dict[str, Any]:
    """`approve_with` on the read models at `database_url`, sending to the running
    system at `bootstrap` (the CLI's way)."""
    from projections.database import make_engine
    from toolexec.client import InvocationClient
    from toolexec.registry_reads import registry_caught_up

    engine = make_engine(database_url)
    try:
        async with InvocationClient(bootstrap, client_options=client_options) as client:
            return await approve_with(
                engine, client.send,
                lambda: registry_caught_up(engine, bootstrap, client_options=client_options,
                                           model=NAME),
                target, digest, capability, reason)
    finally:
        await engine.dispose()


async def approve_with(engine: AsyncEngine, send: Callable[[Envelope], Awaitable[Any]],
                       catch_up: Callable[[], Awaitable[object]], target: str, digest: str,
                       capability: Capability | None,
                       reason: str | None = None) -> dict[str, Any]:
    """Approve the drifted definition `digest` of `target` (a server's or an
    mcp_tool's tool id): `{"status": "approved"|"already_approved", "event_id",
    "applied", "definition"}`. `catch_up` waits (bounded) for the definitions read
    model to fold the registry topic (a drift written just before). Raises
    ToolNotFound (E3101: no pinned definitions for `target`), InvalidRequest (E3004:
    no such drifted hash), AuthorizationError (E3206 without the approve scope on the
    server's tool id)."""
    if not _HASH.match(digest):
        raise InvalidRequest(f"expected a definition hash sha256:<64 hex digits>, got "
                             f"{digest[:80]!r}", details={"definition_hash": digest[:80]})
    server, rows = await _pins_of(engine, target)
    if not any(_approvable(row, digest) for row in rows):
        await catch_up()
        server, rows = await _pins_of(engine, target)
    rights.demand(capability, [approve_need(server)])
    row = next((r for r in rows if _approvable(r, digest)), None)
    if row is None:
        raise InvalidRequest(
            f"no drifted definition {digest[:19]}... of {target} waits for approval",
            details={"target": target, "definition_hash": digest,
                     "pending": [p["definition_hash"] for r in rows for p in r["pending"]]})
    if row["definition_hash"] == digest:
        return {"status": "already_approved", "event_id": None, "applied": True,
                "definition": shown(row)}
    event = approval_event(row, digest, capability, reason, now=datetime.now(UTC))
    await send(event)
    pinned = await _wait_pinned(engine, server, row["mcp_tool_name"], digest)
    return {"status": "approved", "event_id": event.id, "applied": pinned is not None,
            "definition": shown(pinned or row)}


def _approvable(row: Mapping[str, Any], digest: str) -> bool:
    return row["definition_hash"] == digest or any(
        p["definition_hash"] == digest for p in row["pending"])


def approval_event(row: Mapping[str, Any], digest: str, capability: Capability | None,
                   reason: str | None, *, now: datetime) -> Envelope:
    """The `tool.definition.approved` of the drift `digest` of `row` (a new fact)."""
    drift = next(p for p in row["pending"] if p["definition_hash"] == digest)
    data = ToolDefinitionApproved(
        server_tool_id=row["server_tool_id"], mcp_tool_name=row["mcp_tool_name"],
        previous_hash=row["definition_hash"], definition_hash=digest,
        definition=drift["definition"],
        approved_by=None if capability is None else capability.subject, reason=reason)
    event_id = str(uuid.uuid4())
    return new_envelope(data, source=SOURCE, partitionkey=row["server_tool_id"],
                        correlationid=event_id, id=event_id, time=now)


async def _pins_of(engine: AsyncEngine, target: str) -> tuple[str, list[dict[str, Any]]]:
    async with engine.connect() as conn:
        rows = await list_definitions(conn, target)
        if rows:
            return target, rows
        server, tool_name = await _served_by(conn, target)
        return server, [row for row in await list_definitions(conn, server)
                        if row["mcp_tool_name"] == tool_name]


async def _served_by(conn: AsyncConnection, tool_id: str) -> tuple[str, str]:
    """(server tool id, MCP tool name) of the mcp_tool `tool_id` (its current version)."""
    tool = await show_tool(conn, tool_id)
    current = None if tool is None else next(
        (v for v in tool["versions"]
         if v["version"] == (tool["current_version"] or tool["latest_version"])), None)
    if current is None or current["tool_type"] != "mcp_tool":
        raise ToolNotFound(f"no pinned MCP tool definitions for {tool_id!r}: name an "
                           "mcp_server or an mcp_tool whose definition was seen",
                           details={"target": tool_id})
    pin = current["executor_pin"] or {}
    config = current["manifest"].get("config") or {}
    return str(pin.get("tool_id") or current["executor"]), str(config.get("mcp_tool_name"))


async def _wait_pinned(engine: AsyncEngine, server: str, tool_name: str,
                       digest: str) -> dict[str, Any] | None:
    deadline = time.monotonic() + READ_MODEL_WAIT_SECONDS
    while time.monotonic() < deadline:
        async with engine.connect() as conn:
            rows = await list_definitions(conn, server)
        row = next((r for r in rows if r["mcp_tool_name"] == tool_name), None)
        if row is not None and row["definition_hash"] == digest:
            return row
        await asyncio.sleep(POLL_SECONDS)
    return None
