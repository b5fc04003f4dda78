"""In-memory wiring of the pipeline's runs: the step functions chained as the pipeline
chains them, with fakes for every port and an in-memory fact log.

Ports are fakes: a registry built from sealed tool sources, a scripted primitive
runner, in-memory claims. Every request, cancel and fact is recorded in log order.
The Kafka side (consumer group, commits, recovery scans) is tested against the real
broker in tests/integration.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest_asyncio
from aiokafka.errors import KafkaConnectionError

from consumers.adapters.claim_store import InMemoryClaims
from consumers.ports import CheckpointStore, ToolSession
from consumers.runtime.deadletter import DeadLetters
from consumers.runtime.delivery import DeliveringFactLog
from consumers.runtime.invocation import InvocationDeps, invocation_deps
from consumers.runtime.invocation_facts import InvocationFacts
from consumers.runtime.runs import InvocationRuns, RecordRef
from consumers.steps import authorize
from contracts import topics
from contracts.envelope import Envelope, new_envelope
from contracts.events import InvokeCancelRequested, InvokeRequested
from contracts.kafka_binding import encode
from domain.credentials import CredentialGrants
from domain.integrity import seal
from domain.model import HttpPlan, PrimitiveOutcome, SubprocessPlan, ToolVersion
from domain.registry import InMemoryRegistry
from toolexec.sources import load_builtin_sources, load_source

TOOLS = Path(__file__).parent.parent / "integration" / "tools"
FIXED_NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


class FakeRegistry(InMemoryRegistry):
    explode: bool = False

    def versions(self, tool_id: str):  # type: ignore[override]
        if self.explode:
            raise RuntimeError("registry view exploded")
        return super().versions(tool_id)

    async def catch_up(self, timeout: float) -> bool:
        return True

    async def reach(self, end_offset: int, timeout: float) -> bool:
        return True


@dataclass
class ScriptedRunner:
    """Returns queued outcomes (or the default); records every plan it was given."""

    default: PrimitiveOutcome = field(
        default_factory=lambda: PrimitiveOutcome(ok=True, stdout=b'{"echo": "hi", "keys": 1}',
                                                 exit_code=0))
    queue: list[PrimitiveOutcome | Exception] = field(default_factory=list)
    plans: list[Any] = field(default_factory=list)
    sandbox: str = "fake"
    blocking: bool = False
    """When True, every run lasts until it is cancelled (a tool that runs until stopped)."""
    running: asyncio.Event = field(default_factory=asyncio.Event)
    interrupted: int = 0

    async def run(self, plan: SubprocessPlan | HttpPlan, params: Mapping[str, Any], *,
                  secrets: Callable[[str], str | None],
                  session: ToolSession | None = None) -> PrimitiveOutcome:
        self.plans.append(plan)
        self.running.set()
        if self.blocking:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.interrupted += 1
                raise
        item = self.queue.pop(0) if self.queue else self.default
        if isinstance(item, Exception):
            raise item
        return item


@dataclass
class Harness:
    registry: FakeRegistry
    runner: ScriptedRunner
    claims: InMemoryClaims
    runs: InvocationRuns = field(init=False)
    events: list[Envelope] = field(default_factory=list)
    deadletters: list[dict[str, Any]] = field(default_factory=list)
    fail_once: set[str] = field(default_factory=set)
    """Fact types whose next append fails for good, as if the process died right there."""
    sleeps_fail: int = 0
    """How many of the next backoff sleeps raise (a crash while waiting to retry)."""
    sleeps_block: bool = False
    """When True, backoff sleeps last until cancelled; `backing_off` is set meanwhile."""
    backing_off: asyncio.Event = field(default_factory=asyncio.Event)
    broker_away_for: int = 0
    """How many of the next appends fail as they do while the broker restarts."""
    acknowledged: list[list[str]] = field(default_factory=list)
    """Each acknowledged append: the types of its facts, in order."""

    async def append(self, events: Sequence[Envelope]) -> None:
        """The in-memory fact log (the FactLog port)."""
        if self.broker_away_for:
            self.broker_away_for -= 1
            raise KafkaConnectionError("injected: the broker is restarting")
        failing = self.fail_once & {e.type for e in events}
        if failing:
            self.fail_once -= failing
            raise ConnectionError(f"injected: appending {sorted(failing)} failed")
        self.events.extend(events)
        self.acknowledged.append([e.type for e in events])

    def request_event(self, tool_id: str, params: Mapping[str, Any] | None = None, *,
                      version_range: str = "*", token: str | None = None,
                      event_id: str | None = None, invocation_id: str | None = None
                      ) -> Envelope:
        invocation_id = invocation_id or str(uuid.uuid4())
        return new_envelope(
            InvokeRequested(invocation_id=invocation_id, tool_id=tool_id,
                            version_range=version_range, parameters=dict(params or {})),
            source="urn:test", partitionkey=invocation_id, correlationid=invocation_id,
            id=event_id or str(uuid.uuid4()), time=FIXED_NOW,
            extensions={"captoken": token} if token else {},
        )

    async def request(self, tool_id: str, params: Mapping[str, Any] | None = None, *,
                      version_range: str = "*", token: str | None = None,
                      event_id: str | None = None, invocation_id: str | None = None) -> str:
        """Send a request and wait until its run ended; returns the invocation id."""
        envelope = self.request_event(tool_id, params, version_range=version_range,
                                      token=token, event_id=event_id,
                                      invocation_id=invocation_id)
        self.events.append(envelope)
        await self.run(envelope)
        return envelope.data.invocation_id

    async def run(self, request: Envelope, facts: InvocationFacts | None = None) -> None:
        """Run `request` as the pipeline does, resuming from `facts`; wait for its end."""
        record = encode(request)
        source = RecordRef(topics.REQUESTS, 0, len(self.events), record.key, record.value,
                           record.headers)
        run = self.runs.start(request, DeliveringFactLog(self, sleep=_no_sleep),
                              facts or InvocationFacts(), source, lambda: None)
        await asyncio.gather(run.done, return_exceptions=True)

    async def redeliver(self, request: Envelope) -> None:
        """The request read again by a new owner: it resumes from its facts on the log."""
        facts = InvocationFacts.of(self.of(request.data.invocation_id))
        await self.run(request, facts)

    async def cancel(self, invocation_id: str, reason: str | None = None) -> None:
        """Emit `tool.invoke.cancel.requested` for the invocation."""
        envelope = new_envelope(
            InvokeCancelRequested(invocation_id=invocation_id, reason=reason),
            source="urn:test", partitionkey=invocation_id, correlationid=invocation_id,
            id=str(uuid.uuid4()), time=FIXED_NOW)
        self.events.append(envelope)
        self.runs.cancel(invocation_id, reason)
        await asyncio.sleep(0)

    def of(self, invocation_id: str, event_type: str | None = None) -> list[Envelope]:
        return [e for e in self.events if e.correlationid == invocation_id
                and (event_type is None or e.type == event_type)]

    def terminal(self, invocation_id: str) -> Envelope:
        found = [e for e in self.of(invocation_id)
                 if e.type in ("tool.invoke.completed", "tool.invoke.failed")]
        assert len(found) == 1, [e.type for e in self.of(invocation_id)]
        return found[0]


async def _no_sleep(seconds: float) -> None:
    return None


def sealed_tools() -> list[ToolVersion]:
    sources = load_builtin_sources() + [load_source(p) for p in sorted(TOOLS.iterdir())
                                        if p.is_dir()]
    return [seal(s) for s in sources]


def clock() -> datetime:
    return FIXED_NOW


def pipeline_deps(harness: Harness, *, authorize_deps: authorize.AuthorizeDeps,
                  secrets: Callable[[str], str | None] = lambda name: None,
                  credential_grants: CredentialGrants | None = None,
                  checkpoints: CheckpointStore | None = None,
                  clock: Callable[[], datetime] = clock) -> InvocationDeps:
    """The steps' ports as toolexec wires them, with the harness's fakes."""

    async def sleep(seconds: float) -> None:
        if harness.sleeps_fail:
            harness.sleeps_fail -= 1
            raise ConnectionError("injected: the executor died while backing off")
        if harness.sleeps_block:
            harness.backing_off.set()
            await asyncio.Event().wait()

    return invocation_deps(
        registry=harness.registry, clock=clock, authorize=authorize_deps,
        runner=harness.runner, claims=harness.claims, secrets=secrets, random=lambda: 0.0,
        sleep=sleep, credential_grants=credential_grants or CredentialGrants(),
        checkpoints=checkpoints)


def dead_letters_of(harness: Harness) -> DeadLetters:
    async def record(envelope: Envelope) -> None:
        harness.deadletters.append(envelope.data.model_dump(mode="json"))
    return DeadLetters(record, clock)


def build_harness(*, require_auth: bool = False, public_keys: list[Any] | None = None,
                  runner: ScriptedRunner | None = None,
                  checkpoints: CheckpointStore | None = None) -> Harness:
    registry = FakeRegistry()
    for tool in sealed_tools():
        registry.add(tool)
    harness = Harness(registry, runner or ScriptedRunner(), InMemoryClaims("test-executor"))
    deps = pipeline_deps(harness, authorize_deps=authorize.AuthorizeDeps(
        clock=clock, require_auth=require_auth, public_keys=lambda: public_keys or []),
        checkpoints=checkpoints)
    harness.runs = InvocationRuns(deps, dead_letters_of(harness), consumer="test.pipeline")
    return harness


@pytest_asyncio.fixture
async def harness() -> AsyncIterator[Harness]:
    yield build_harness()
