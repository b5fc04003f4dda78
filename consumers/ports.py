"""Ports: the small interfaces through which handlers reach the outside world.

Handlers receive implementations as parameters; `toolexec/` wires real adapters
(Kafka publisher, registry projection, primitives) and tests wire fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from contracts.envelope import Envelope
from domain.checkpoints import StoredCheckpoint
from domain.claims import ClaimDecision, ClaimRecord
from domain.definitions import DefinitionPin
from domain.model import HttpPlan, McpPlan, PrimitiveOutcome, SubprocessPlan, ToolVersion
from domain.policy import CacheKey, PolicyDecision
from domain.tool_reports import Report


class Publish(Protocol):
    """Publishes one event to the topic of its type, keyed by its partitionkey."""

    async def __call__(self, envelope: Envelope) -> None: ...


class Clock(Protocol):
    def __call__(self) -> datetime: ...


class RegistryReader(Protocol):
    """The registry view a resolver reads (a projection of `toolexec.registry`).
    `revision` grows with every change, so caches keyed on it stay correct."""

    revision: int

    def get(self, tool_id: str, version: str) -> ToolVersion | None: ...

    def versions(self, tool_id: str) -> Sequence[ToolVersion]: ...

    def tool_ids(self) -> Sequence[str]: ...

    async def catch_up(self, timeout: float) -> bool:
        """Wait (bounded) until the view has applied the registry topic up to the end
        offsets that exist now. True when caught up, False on timeout."""
        ...

    async def reach(self, end_offset: int, timeout: float) -> bool:
        """Wait (bounded) until the view has applied the registry topic (one partition)
        up to `end_offset`, e.g. a producer's own publication. False on timeout."""
        ...


class ToolSession(Protocol):
    """What one attempt of a subprocess tool exchanges with its executor while it runs
    (the tool-side report protocol, consumers.primitives.report_file)."""

    @property
    def resume_state(self) -> bytes | None:
        """The last checkpoint's state (canonical JSON) when the attempt resumes one."""
        ...

    async def receive(self, reports: Sequence[Report]) -> None:
        """Take the reports read since the last call (called a few times a second,
        with none too); raising a ToolexecError stops the tool, failing the attempt
        with that error."""
        ...


class PrimitiveRunner(Protocol):
    """Runs a primitive plan: the only place where processes start or requests leave."""

    async def run(
        self,
        plan: SubprocessPlan | HttpPlan | McpPlan,
        params: Mapping[str, Any],
        *,
        secrets: Callable[[str], str | None],
        session: ToolSession | None = None,
    ) -> PrimitiveOutcome: ...

    @property
    def sandbox(self) -> str: ...


class ClaimStore(Protocol):
    """Idempotency claims on `invocation_id/attempt` (see domain.claims)."""

    async def claim(self, key: str, *, now: float, lease_seconds: float) -> ClaimDecision: ...

    async def take_over(self, found: ClaimRecord, *, now: float, lease_seconds: float) -> bool:
        """Replace the abandoned claim `found`; False when it changed meanwhile (another
        executor took it over first)."""
        ...

    async def start(self, key: str) -> bool:
        """Mark the attempt this executor owns as about to start; False when it does
        not own it any more."""
        ...

    async def finish(self, key: str, conclusion: bytes | None = None) -> bool:
        """Conclude the attempt this executor owns, storing `conclusion`; False when it
        does not own it any more (another executor took an abandoned claim over)."""
        ...


class Secrets(Protocol):
    """Resolves `${NAME}` references at execution time."""

    def __call__(self, name: str) -> str | None: ...


class DefinitionPins(Protocol):
    """Pinned MCP tool definitions (a projection of `toolexec.registry`)."""

    def pin(self, server_tool_id: str, mcp_tool_name: str) -> DefinitionPin | None:
        """The tool's pin, None before its definition was first seen."""
        ...

    async def catch_up(self, timeout: float) -> bool:
        """Wait (bounded) until the pins hold every registry record in the log now."""
        ...


class AnnouncedDefinitions(Protocol):
    """What MCP servers announce (`tools/list`), on the connection calls use."""

    async def definition(self, plan: McpPlan, *,
                         secrets: Callable[[str], str | None]) -> Mapping[str, Any] | None:
        """The plan's tool as its server announces it (JSON form), None when the server
        announces no tool of that name. Raises ToolexecError when the server cannot
        be started or reached."""
        ...


class CheckpointStore(Protocol):
    """Tools' checkpoint states, content-addressed by state hash
    (consumers.adapters.checkpoint_store: files under the state directory)."""

    async def put(self, checkpoint: StoredCheckpoint) -> None:
        """Keep `checkpoint`; returns once it is durable."""
        ...

    async def get(self, state_hash: str) -> StoredCheckpoint | None:
        """The checkpoint stored under `state_hash`, if any."""
        ...


class DecisionStore(Protocol):
    """The authorize step's decision cache (consumers.adapters.decision_cache: in
    process, or Redis shared by the replicas)."""

    async def get(self, key: CacheKey, *, now: float) -> PolicyDecision | None:
        """The live decision for `key` (marked `cached`), or None."""
        ...

    async def put(self, key: CacheKey, decision: PolicyDecision, *, now: float) -> None: ...

    def invalidate(self) -> None:
        """A `policy.updated` was folded: forget every decision."""
        ...


class CanarySlots(Protocol):
    """Half-open canary slots shared by every executor replica
    (consumers.adapters.canaries: Redis in production)."""

    async def acquire(self, service_id: str, limit: int) -> bool: ...

    async def release(self, service_id: str) -> None: ...
