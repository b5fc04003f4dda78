"""Lifecycle changes (deprecate, remove, restore) as every front end makes them: check
the requested change against the registry read model and the caller's rights, build
the `tool.lifecycle.changed` events, send them, and wait (bounded) until the read
model shows them, so that a `show` right after sees the change."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from contracts.envelope import Envelope, new_envelope
from contracts.events import Lifecycle, ToolLifecycleChanged
from domain.capability import Capability
from domain.errors import RegistryError
from domain.lifecycle import LifecycleChange, decide_lifecycle_change
from domain.scopes import lifecycle_need
from projections.queries import show_tool
from toolexec import rights

SOURCE = "urn:toolexec:lifecycle"


async def checked_change(conn: AsyncConnection,
                         change: LifecycleChange) -> tuple[LifecycleChange, ...]:
    """`change` checked against the registry read model (E3101, E3102, E3104, E3004):
    the changes to record."""
    tool = await show_tool(conn, change.tool_id)
    versions = None if tool is None else {v["version"]: v["lifecycle"] for v in tool["versions"]}
    known: list[str] = []
    if change.replacement_tool_id:
        replacement_id = change.replacement_tool_id.partition("@")[0].strip()
        if await show_tool(conn, replacement_id) is not None:
            known.append(replacement_id)
    return decide_lifecycle_change(change, versions, known)


async def checked_reading_your_writes(
        engine: AsyncEngine, change: LifecycleChange,
        catch_up: Callable[[], Awaitable[object]],
        capability: Capability | None = None) -> tuple[LifecycleChange, ...]:
    """`checked_change`; before answering "not found" (E3101, E3102), wait (`catch_up`,
    bounded) until the read model holds every registry record in the log now, and
    check again: a tool published just before may not be folded yet.

    With `capability` (authorization on), it must hold the lifecycle scope on the tool,
    or admin when any version of it is a runtime, primitive or MCP server (E3206)."""
    try:
        async with engine.connect() as conn:
            return await _checked_with_rights(conn, change, capability)
    except RegistryError as miss:
        if miss.code not in ("E3101", "E3102"):
            raise
    await catch_up()
    async with engine.connect() as conn:
        return await _checked_with_rights(conn, change, capability)


async def _checked_with_rights(conn: AsyncConnection, change: LifecycleChange,
                               capability: Capability | None) -> tuple[LifecycleChange, ...]:
    if capability is not None:  # rights first: a refused caller learns nothing more
        tool = await show_tool(conn, change.tool_id)
        types = [v["tool_type"] for v in (tool or {}).get("versions", [])]
        rights.demand(capability, [lifecycle_need(change.tool_id, types)])
    return await checked_change(conn, change)


def lifecycle_event(change: LifecycleChange, *, now: datetime) -> Envelope:
    """The `tool.lifecycle.changed` event recording `change` (a new fact: its own id)."""
    data = ToolLifecycleChanged(tool_id=change.tool_id, version=change.version,
                                lifecycle=cast(Lifecycle, change.state),
                                reason=change.reason,
                                replacement_tool_id=change.replacement_tool_id)
    event_id = str(uuid.uuid4())
    return new_envelope(data, source=SOURCE, partitionkey=change.tool_id,
                        correlationid=event_id, id=event_id, time=now)


def shows_changes(tool: dict[str, Any] | None, changes: Sequence[LifecycleChange]) -> bool:
    """Whether a `show_tool` row already reflects `changes` (read-your-writes check)."""
    if tool is None:
        return False
    return all(v["lifecycle"] == change.state for change in changes for v in tool["versions"]
               if change.version is None or v["version"] == change.version)


READ_MODEL_WAIT_SECONDS = 5.0  # a tool published just before may not be folded yet
POLL_SECONDS = 0.1


async def change_lifecycle(bootstrap: str, database_url: str, change: LifecycleChange,
                           capability: Capability | None,
                           client_options: Mapping[str, Any]
                           ) -> tuple[list[str], dict[str, Any] | None]:
    """Check `change` (rights first), send its events to the running system at
    `bootstrap`; (the event ids, the tool's read-model row once it shows the change,
    or None when it does not within READ_MODEL_WAIT_SECONDS). Raises ToolexecError
    (E3101, E3102, E3104, E3004, E32xx)."""
    from projections.database import make_engine
    from toolexec.client import InvocationClient
    from toolexec.registry_reads import registry_caught_up

    engine = make_engine(database_url)
    try:
        changes = await checked_reading_your_writes(
            engine, change,
            lambda: registry_caught_up(engine, bootstrap, client_options=client_options),
            capability)
        now = datetime.now(UTC)
        events = [lifecycle_event(checked, now=now) for checked in changes]
        async with InvocationClient(bootstrap, client_options=client_options) as client:
            for event in events:
                await client.send(event)
        return [e.id for e in events], await _wait_shown(engine, changes)
    finally:
        await engine.dispose()


async def _wait_shown(engine: AsyncEngine,
                      changes: tuple[LifecycleChange, ...]) -> dict[str, Any] | None:
    deadline = time.monotonic() + READ_MODEL_WAIT_SECONDS
    while time.monotonic() < deadline:
        async with engine.connect() as conn:
            tool = await show_tool(conn, changes[0].tool_id)
        if shows_changes(tool, changes):
            return tool
        await asyncio.sleep(POLL_SECONDS)
    return None
