"""The execute step's check of an MCP tool's definition before it is called.

A server announces its tools (`tools/list`); what it announces for the tool about to
be called is hashed (domain.definitions) and compared with the tool's pin, read
through the DefinitionPins port (the registry topic folded in this process):

- no pin yet: `tool.definition.pinned` is written (trust on first use), and the call
  proceeds only once the view shows that this hash is the pin: when two executors
  pin two definitions at once, the first in the log wins and the other call is a
  drift (read-your-writes, the log order decides);
- the pin: the call proceeds, on the same connection, which re-checks the hash
  (`McpPlan.definition_hash`);
- another hash (also once the view has caught up with the log, so an approval
  written just before counts): `tool.definition.drifted` (with the diff) is written
  once per new hash (at most MAX_PENDING_DRIFTS waiting per tool), and the call is
  refused with E3108 until a person approves it.

A lockfile's definition hash only narrows: a locked call whose server announces
another hash is refused (E3108) whatever was approved, and nothing is pinned from it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from consumers.ports import AnnouncedDefinitions, Clock, DefinitionPins, Publish, Secrets
from contracts.envelope import EVENT_ID_NAMESPACE, Envelope, new_envelope
from contracts.events import DefinitionChange, ToolDefinitionDrifted, ToolDefinitionPinned
from domain.definitions import (
    MAX_PENDING_DRIFTS,
    DefinitionPin,
    announced_definition,
    definition_hash,
    diff_definitions,
    lock_refusal,
    refusal,
)
from domain.errors import DefinitionChanged, ExecutionError
from domain.model import McpPlan, ToolVersion

log = structlog.get_logger(__name__)

SOURCE = "urn:toolexec:pipeline:definitions"
PIN_WAIT_SECONDS = 5.0


@dataclass(frozen=True)
class DefinitionDeps:
    """The ports of the definition check: the pins (a view of the registry topic),
    the servers' announcements, a publisher to the registry topic, a clock."""

    pins: DefinitionPins
    announced: AnnouncedDefinitions
    publish: Publish
    clock: Clock
    wait_seconds: float = PIN_WAIT_SECONDS


async def admit_definition(plan: McpPlan, server: ToolVersion, deps: DefinitionDeps, *,
                           secrets: Secrets, locked: str | None = None) -> str:
    """The hash of the definition `server` announces for `plan.tool_name`, once it may
    be called (pinned now or before, and the lockfile's when `locked`).

    Raises DefinitionChanged (E3108) when it may not, ExecutionError when the server
    cannot be reached or does not announce the tool (E3401...)."""
    tool = await deps.announced.definition(plan, secrets=secrets)
    if tool is None:
        raise ExecutionError(f"MCP server {server.tool_id} does not announce a tool named "
                             f"{plan.tool_name}", details={"server": plan.server_key,
                                                           "mcp_tool": plan.tool_name})
    definition = announced_definition(tool)
    digest = definition_hash(definition)
    pin = deps.pins.pin(server.tool_id, plan.tool_name)
    if locked is not None and digest != locked:
        if pin is not None and digest != pin.definition_hash:
            await _record_drift(pin, server, plan.tool_name, definition, digest, deps)
        raise lock_refusal(locked, digest, server_id=server.tool_id, tool_name=plan.tool_name)
    if pin is None:
        pin = await _pin_first_use(server, plan.tool_name, definition, digest, deps)
    elif digest != pin.definition_hash:  # an approval just written may not be read yet
        await deps.pins.catch_up(deps.wait_seconds)
        pin = deps.pins.pin(server.tool_id, plan.tool_name) or pin
    if digest == pin.definition_hash:
        return digest
    await _record_drift(pin, server, plan.tool_name, definition, digest, deps)
    raise refusal(pin, digest, server_id=server.tool_id, tool_name=plan.tool_name)


async def _pin_first_use(server: ToolVersion, tool_name: str, definition: dict[str, Any],
                         digest: str, deps: DefinitionDeps) -> DefinitionPin:
    """Write the first sighting and wait until the view shows the tool's pin (this
    one, or another executor's written before it)."""
    data = ToolDefinitionPinned(server_tool_id=server.tool_id, server_version=server.version,
                                server_integrity=server.integrity, mcp_tool_name=tool_name,
                                definition_hash=digest, definition=definition)
    await deps.publish(_event(data, server.tool_id, f"pinned:{server.tool_id}:{tool_name}:"
                                                    f"{digest}", deps))
    await deps.pins.catch_up(deps.wait_seconds)
    pin = deps.pins.pin(server.tool_id, tool_name)
    if pin is None:
        raise DefinitionChanged(
            f"the first definition of MCP tool {tool_name} of {server.tool_id} was written "
            f"but is not yet read back; try again",
            details={"server": server.tool_id, "mcp_tool": tool_name, "announced": digest})
    return pin


async def _record_drift(pin: DefinitionPin, server: ToolVersion, tool_name: str,
                        definition: Mapping[str, Any], digest: str,
                        deps: DefinitionDeps) -> None:
    """Write `tool.definition.drifted` unless this hash is already waiting for approval.
    Its id names the pin it drifts from, so a drift seen by several executors is one
    event, and the same hash drifting again from a later pin is a new one."""
    if digest in pin.pending:
        return
    if len(pin.pending) >= MAX_PENDING_DRIFTS:
        log.warning("definition.drift_not_recorded", server=server.tool_id, mcp_tool=tool_name,
                    announced=digest, pending=len(pin.pending))
        return
    diff = [DefinitionChange(**change) for change in diff_definitions(pin.definition, definition)]
    data = ToolDefinitionDrifted(server_tool_id=server.tool_id, server_version=server.version,
                                 server_integrity=server.integrity, mcp_tool_name=tool_name,
                                 previous_hash=pin.definition_hash, definition_hash=digest,
                                 definition=dict(definition), diff=diff)
    await deps.publish(_event(data, server.tool_id, f"drifted:{pin.pin_event_id}:{digest}",
                              deps))


def _event(data: ToolDefinitionPinned | ToolDefinitionDrifted, server_tool_id: str,
           name: str, deps: DefinitionDeps) -> Envelope:
    event_id = str(uuid.uuid5(EVENT_ID_NAMESPACE, name))
    return new_envelope(data, source=SOURCE, partitionkey=server_tool_id,
                        correlationid=event_id, id=event_id, time=deps.clock())
