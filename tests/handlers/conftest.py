"""In-memory wiring of the pipeline steps on FastStream's TestKafkaBroker.

Ports are fakes: a registry built from sealed tool sources, a scripted primitive
runner, in-memory claims. Every event any step publishes is recorded in order.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest_asyncio
from aiokafka.errors import KafkaConnectionError
from faststream.kafka import KafkaBroker, TestKafkaBroker

from consumers import authorize, execute, finalize, resolve
from consumers.claim_store import InMemoryClaims
from consumers.deadletter import DeadLetters
from consumers.delivery import DeliveringPublisher
from consumers.pipeline import PipelineDeps, passthrough_decoder, pipeline_groups, process_record
from contracts import topics
from contracts.envelope import Envelope, new_envelope
from contracts.events import InvokeCancelRequested, InvokeRequested
from contracts.kafka_binding import encode
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
                  secrets: Callable[[str], str | None]) -> PrimitiveOutcome:
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
    broker: KafkaBroker
    registry: FakeRegistry
    runner: ScriptedRunner
    claims: InMemoryClaims
    settings: dict[str, Any]
    events: list[Envelope] = field(default_factory=list)
    deadletters: list[dict[str, Any]] = field(default_factory=list)
    fail_once: set[str] = field(default_factory=set)
    """Event types whose next publish raises, as if the process died right there."""
    sleeps_fail: int = 0
    """How many of the next backoff sleeps raise (a crash while waiting to retry)."""
    sleeps_block: bool = False
    """When True, backoff sleeps last until cancelled; `backing_off` is set meanwhile."""
    backing_off: asyncio.Event = field(default_factory=asyncio.Event)
    broker_away_for: int = 0
    """How many of the next publishes fail as they do while the broker restarts."""

    async def request(self, tool_id: str, params: Mapping[str, Any] | None = None, *,
                      version_range: str = "*", token: str | None = None,
                      event_id: str | None = None, invocation_id: str | None = None) -> str:
        invocation_id = invocation_id or str(uuid.uuid4())
        envelope = new_envelope(
            InvokeRequested(invocation_id=invocation_id, tool_id=tool_id,
                            version_range=version_range, parameters=dict(params or {})),
            source="urn:test", partitionkey=invocation_id, correlationid=invocation_id,
            id=event_id or str(uuid.uuid4()), time=FIXED_NOW,
            extensions={"captoken": token} if token else {},
        )
        self.events.append(envelope)
        await publish_on(self.broker, envelope)
        return invocation_id

    async def cancel(self, invocation_id: str, reason: str | None = None) -> None:
        """Emit `tool.invoke.cancel.requested` for the invocation."""
        envelope = new_envelope(
            InvokeCancelRequested(invocation_id=invocation_id, reason=reason),
            source="urn:test", partitionkey=invocation_id, correlationid=invocation_id,
            id=str(uuid.uuid4()), time=FIXED_NOW)
        self.events.append(envelope)
        await publish_on(self.broker, envelope)

    def of(self, invocation_id: str, event_type: str | None = None) -> list[Envelope]:
        return [e for e in self.events if e.correlationid == invocation_id
                and (event_type is None or e.type == event_type)]

    def terminal(self, invocation_id: str) -> Envelope:
        found = [e for e in self.of(invocation_id)
                 if e.type in ("tool.invoke.completed", "tool.invoke.failed")]
        assert len(found) == 1, [e.type for e in self.of(invocation_id)]
        return found[0]


async def publish_on(broker: KafkaBroker, envelope: Envelope) -> None:
    record = encode(envelope)
    await broker.publish(record.value, topics.TOPIC_OF_TYPE[envelope.type], key=record.key,
                         headers={k: v.decode() for k, v in record.headers})


def sealed_tools() -> list[ToolVersion]:
    sources = load_builtin_sources() + [load_source(p) for p in sorted(TOOLS.iterdir())
                                        if p.is_dir()]
    return [seal(s) for s in sources]


def build_harness(*, require_auth: bool = False, public_keys: list[Any] | None = None,
                  ) -> tuple[Harness, KafkaBroker]:
    broker = KafkaBroker("localhost:9092", apply_types=False, decoder=passthrough_decoder)
    registry = FakeRegistry()
    for tool in sealed_tools():
        registry.add(tool)
    runner = ScriptedRunner()
    claims = InMemoryClaims("test-executor")
    harness = Harness(broker, registry, runner, claims, {"require_auth": require_auth})

    async def publish_once(envelope: Envelope) -> None:
        if harness.broker_away_for:
            harness.broker_away_for -= 1
            raise KafkaConnectionError("injected: the broker is restarting")
        if envelope.type in harness.fail_once:
            harness.fail_once.discard(envelope.type)
            raise ConnectionError(f"injected: publishing {envelope.type} failed")
        # Recorded before it is delivered: the in-memory broker runs subscribers
        # nested inside publish, so this keeps the causal order of the log.
        if envelope.type == "deadletter.recorded":
            harness.deadletters.append(envelope.data.model_dump(mode="json"))
        else:
            harness.events.append(envelope)
        await publish_on(broker, envelope)

    async def no_backoff(seconds: float) -> None:
        return None

    publish = DeliveringPublisher(publish_once, sleep=no_backoff)  # as toolexec wires it

    def clock() -> datetime:
        return FIXED_NOW

    async def sleep(seconds: float) -> None:
        if harness.sleeps_fail:
            harness.sleeps_fail -= 1
            raise ConnectionError("injected: the executor died while backing off")
        if harness.sleeps_block:
            harness.backing_off.set()
            await asyncio.Event().wait()

    deps = PipelineDeps(
        resolve=resolve.ResolveDeps(registry=registry, publish=publish, clock=clock),
        authorize=authorize.AuthorizeDeps(publish=publish, clock=clock, require_auth=require_auth,
                                          public_keys=lambda: public_keys or [],
                                          pending=authorize.PendingTokens()),
        execute=execute.ExecuteDeps(registry=registry, publish=publish, clock=clock,
                                    runner=runner, claims=claims, secrets=lambda name: None,
                                    random=lambda: 0.0, sleep=sleep),
        finalize=finalize.FinalizeDeps(publish=publish, clock=clock),
        dead_letters=DeadLetters(publish, clock),
        clock=clock,
    )
    groups = pipeline_groups(deps, group_prefix="test", execute_workers=1)

    # One subscriber hands each record to every group in a fixed order. On Kafka each
    # group reads the partition in log order; the in-memory broker delivers nested
    # and in no guaranteed subscriber order, so this keeps it faithful.
    @broker.subscriber(topics.INVOCATIONS, group_id="groups")
    async def all_steps(message: Any) -> None:
        for group in groups:
            await process_record(message.raw_message, group, deps)

    return harness, broker


@pytest_asyncio.fixture
async def harness() -> AsyncIterator[Harness]:
    h, broker = build_harness()
    async with TestKafkaBroker(broker):
        yield h
