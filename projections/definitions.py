"""Pinned MCP tool definitions, folded from `toolexec.registry` (key: server tool id).

One row per (server tool id, MCP tool name). The first `tool.definition.pinned` of a
tool in the log is its pin (a later one, from an executor that lost a race, changes
nothing); a `tool.definition.drifted` adds its hash to the tool's `pending` drifts
(state `drifted`); a `tool.definition.approved` makes its hash the pin and drops it
from `pending`. The same fold feeds the SQL read model (`definitions_model`, listed by
`toolexec definitions list`) and the pipeline's in-memory view
(`DefinitionLogView`, the DefinitionPins port), so both agree on every pin.
"""

from __future__ import annotations

from collections.abc import Collection

from contracts import topics
from contracts.envelope import Envelope
from contracts.events import ToolDefinitionApproved, ToolDefinitionDrifted, ToolDefinitionPinned
from domain.definitions import DefinitionPin
from projections.log_position import EndOffsets, LogPosition
from projections.store import AggregateModel, Row, Rows
from projections.tables import iso, tool_definitions

NAME = "definitions"
TABLE = tool_definitions.name
DefinitionEvent = ToolDefinitionPinned | ToolDefinitionDrifted | ToolDefinitionApproved


def fold_definitions(rows: Rows, envelope: Envelope) -> Rows:
    """Fold one definition event into one server's rows (pure)."""
    data = envelope.data
    if not isinstance(data, DefinitionEvent):
        return rows
    by_name = {row["mcp_tool_name"]: row for row in rows[TABLE]}
    row = by_name.get(data.mcp_tool_name)
    if row is not None and envelope.id in row["event_ids"]:
        return rows  # the same event again
    new = _evolve(row, data, envelope)
    if new is None:
        return rows
    by_name[data.mcp_tool_name] = {**new, "event_ids": [*(row or {}).get("event_ids", []),
                                                        envelope.id]}
    return {TABLE: [by_name[name] for name in sorted(by_name)]}


def _evolve(row: Row | None, data: DefinitionEvent, envelope: Envelope) -> Row | None:
    """The tool's new row, or None when the event changes nothing."""
    at = iso(envelope.time)
    if isinstance(data, ToolDefinitionPinned):
        if row is not None:
            return None  # the first pin in the log stands
        return {"server_tool_id": data.server_tool_id, "mcp_tool_name": data.mcp_tool_name,
                "state": "pinned", "definition_hash": data.definition_hash,
                "definition": data.definition, "pinned_how": "first_use",
                "approved_by": None, "server_version": data.server_version,
                "server_integrity": data.server_integrity, "pinned_at": at, "pending": [],
                "pin_event_id": envelope.id, "updated_at": at}
    if isinstance(data, ToolDefinitionDrifted):
        if row is None or data.definition_hash == row["definition_hash"] \
                or data.definition_hash in _pending_hashes(row):
            return None
        drift = {"definition_hash": data.definition_hash, "previous_hash": data.previous_hash,
                 "definition": data.definition,
                 "diff": [change.model_dump(mode="json") for change in data.diff],
                 "server_version": data.server_version,
                 "server_integrity": data.server_integrity, "seen_at": at}
        return {**row, "state": "drifted", "pending": [*row["pending"], drift],
                "updated_at": at}
    pending = [p for p in (row or {}).get("pending", [])
               if p["definition_hash"] != data.definition_hash]
    approved = next((p for p in (row or {}).get("pending", [])
                     if p["definition_hash"] == data.definition_hash), None)
    return {"server_tool_id": data.server_tool_id, "mcp_tool_name": data.mcp_tool_name,
            "state": "drifted" if pending else "pinned",
            "definition_hash": data.definition_hash, "definition": data.definition,
            "pinned_how": "approved", "approved_by": data.approved_by,
            "server_version": (approved or row or {}).get("server_version"),
            "server_integrity": (approved or row or {}).get("server_integrity"),
            "pinned_at": at, "pending": pending, "pin_event_id": envelope.id,
            "updated_at": at}


def _pending_hashes(row: Row) -> set[str]:
    return {p["definition_hash"] for p in row["pending"]}


def pin_of(row: Row) -> DefinitionPin:
    """The domain's view of a definitions row."""
    return DefinitionPin(definition_hash=row["definition_hash"], definition=row["definition"],
                         pin_event_id=row["pin_event_id"],
                         pending=frozenset(_pending_hashes(row)))


def _server_of(envelope: Envelope) -> str | None:
    data = envelope.data
    return data.server_tool_id if isinstance(data, DefinitionEvent) else None


def _event_ids(rows: Rows) -> Collection[str]:
    return {event_id for row in rows[TABLE] for event_id in row["event_ids"]}


def definitions_model() -> AggregateModel:
    """The definitions read model, ready for a runner."""
    return AggregateModel(name=NAME, topics=(topics.REGISTRY,), tables=(tool_definitions,),
                          key_column="server_tool_id", aggregate_of=_server_of,
                          fold=fold_definitions, event_ids=_event_ids)


class DefinitionLogView:
    """The pins as folded from the registry topic in this process, for the pipeline
    (the DefinitionPins port): fold + position + bounded catch-up."""

    TYPES = (ToolDefinitionPinned.EVENT_TYPE, ToolDefinitionDrifted.EVENT_TYPE,
             ToolDefinitionApproved.EVENT_TYPE)

    def __init__(self, end_offsets: EndOffsets | None = None) -> None:
        self._servers: dict[str, Rows] = {}
        self.position = LogPosition(end_offsets)

    def apply(self, envelope: Envelope, *, partition: int | None = None,
              offset: int | None = None) -> None:
        """Apply one registry event; record the position it was read at."""
        server = _server_of(envelope)
        if server is not None:
            rows = self._servers.get(server, {TABLE: []})
            self._servers[server] = fold_definitions(rows, envelope)
        if partition is not None and offset is not None:
            self.advance(partition, offset)

    def advance(self, partition: int, offset: int) -> None:
        self.position.advance(partition, offset)

    def pin(self, server_tool_id: str, mcp_tool_name: str) -> DefinitionPin | None:
        """The tool's pin, None before its definition was first seen."""
        rows = self._servers.get(server_tool_id, {TABLE: []})[TABLE]
        row = next((r for r in rows if r["mcp_tool_name"] == mcp_tool_name), None)
        return None if row is None else pin_of(row)

    async def catch_up(self, timeout: float) -> bool:
        """Wait (bounded) until the view has read the topic up to its end offsets now."""
        return await self.position.catch_up(timeout)
