"""FastStream wiring of the pipeline steps: one consumer group per step.

Each subscriber reads raw records (no FastStream body decoding), skips event types
it does not handle by looking at the `ce_type` header alone, decodes the CloudEvent
through the contracts, and calls its step. Bad input never crashes a consumer:
undecodable records are dead-lettered (once, by the entry step's group), a handler
that keeps failing on a record is retried a bounded number of times, then the
record is dead-lettered with the traceback and the invocation gets its terminal
failure event.
"""

from __future__ import annotations

import traceback
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog
from aiokafka import TopicPartition
from faststream import AckPolicy
from faststream.kafka import KafkaBroker

from consumers import authorize, circuits, execute, finalize, resolve
from consumers.deadletter import DeadLetters
from consumers.events import failed
from consumers.inflight import CommitCoalescer, InFlight
from consumers.ports import LogPosition
from contracts import topics
from contracts.envelope import Envelope
from contracts.kafka_binding import UndecodableRecord, decode
from domain.errors import ToolexecError

log = structlog.get_logger(__name__)

Handler = Callable[[Envelope], Awaitable[None]]
POISON_ATTEMPTS = 3

_position: ContextVar[LogPosition | None] = ContextVar("record_position", default=None)


def current_position() -> LogPosition | None:
    """Where the record being handled sits in the log (for handlers that read back)."""
    return _position.get()


async def passthrough_decoder(message: Any) -> Any:
    """FastStream decoder that hands the handler the raw StreamMessage."""
    return message


def header_type(headers: Any) -> str | None:
    for name, value in headers or ():
        if name == "ce_type":
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return None


@dataclass
class Step:
    """One pipeline step: its consumer group and the event types it reacts to."""

    group: str
    handlers: Mapping[str, Handler]
    dead_letter_undecodable: bool = False
    max_workers: int = 1
    fails_invocation: bool = True
    """Whether a poison record ends the invocation with tool.invoke.failed (False for
    side steps, such as circuits, that are not on the invocation's path)."""
    consumer_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineDeps:
    resolve: resolve.ResolveDeps
    authorize: authorize.AuthorizeDeps
    execute: execute.ExecuteDeps
    finalize: finalize.FinalizeDeps
    dead_letters: DeadLetters
    clock: Callable[[], datetime]
    circuits: circuits.CircuitDeps | None = None


def pipeline_steps(deps: PipelineDeps, *, group_prefix: str, execute_workers: int) -> list[Step]:
    """The four steps of DESIGN.md's pipeline, bound to their ports."""
    # Authorize comes first: it must see each request (to keep its token) before the
    # chain.resolved that follows; on Kafka the partition order guarantees that, and
    # listing it first keeps in-process brokers (tests) faithful to it.
    steps = [
        Step(f"{group_prefix}.authorize",
             {"tool.invoke.requested": lambda e: authorize.on_invoke_requested(e, deps.authorize),
              "tool.chain.resolved":
              lambda e: authorize.on_chain_resolved(e, deps.authorize, current_position())}),
        Step(f"{group_prefix}.resolve",
             {"tool.invoke.requested": lambda e: resolve.on_invoke_requested(e, deps.resolve)},
             dead_letter_undecodable=True),
        Step(f"{group_prefix}.execute",
             {"tool.permission.decided":
              lambda e: execute.on_permission_decided(e, deps.execute)},
             max_workers=execute_workers),
        Step(f"{group_prefix}.finalize",
             {"tool.execution.finished":
              lambda e: finalize.on_execution_finished(e, deps.finalize)}),
    ]
    if deps.circuits is not None:
        circuit_deps = deps.circuits
        steps.append(Step(f"{group_prefix}.circuits",
                          {"tool.execution.finished":
                           lambda e: circuits.on_execution_finished(e, circuit_deps)},
                          fails_invocation=False))
    return steps


@dataclass
class Attached:
    """What a running step needs at shutdown: finish work in flight, then commit."""

    committer: CommitCoalescer
    inflight: InFlight | None = None

    async def drain(self) -> None:
        if self.inflight is not None:
            await self.inflight.drain()
        await self.committer.flush()


def attach_step(broker: KafkaBroker, step: Step, deps: PipelineDeps, *,
                consumer_options: Mapping[str, Any]) -> Attached:
    """Subscribe `step` to the invocations topic on `broker`.

    Offsets are committed only past finished records, in coalesced batches. A step
    with max_workers > 1 processes records concurrently through one consumer (see
    consumers.inflight); the others handle one record after another.
    """
    committer = CommitCoalescer()
    subscribe = broker.subscriber(topics.INVOCATIONS, group_id=step.group,
                                  auto_offset_reset="earliest", ack_policy=AckPolicy.MANUAL,
                                  **consumer_options)
    if step.max_workers <= 1:
        @subscribe
        async def handle(message: Any) -> None:
            record = message.raw_message
            tp = TopicPartition(record.topic, record.partition)
            try:
                await process_record(record, step, deps)
            except Exception:
                committer.hold(tp, record.offset)  # output not delivered: not skipped
                raise
            committer.done(message.consumer.commit, tp, record.offset + 1)
        return Attached(committer)

    inflight = InFlight(step.max_workers)

    @subscribe
    async def handle_concurrently(message: Any) -> None:
        record = message.raw_message
        consumer = message.consumer

        async def commit(positions: dict[TopicPartition, int]) -> None:
            for tp, position in positions.items():
                committer.done(consumer.commit, tp, position)

        ce_type = header_type(record.headers)
        if ce_type is not None and ce_type not in step.handlers:
            await inflight.skip(record, commit)  # no task for records of other steps
            return
        await inflight.submit(record, lambda: process_record(record, step, deps), commit)

    return Attached(committer, inflight)


async def process_record(record: Any, step: Step, deps: PipelineDeps) -> None:
    """Decode one record and run the step's handler for it; never raises."""
    ce_type = header_type(record.headers)
    if ce_type is not None and ce_type not in step.handlers:
        return
    try:
        envelope = decode(record.key, record.value, record.headers)
    except UndecodableRecord as bad:
        if step.dead_letter_undecodable:
            await deps.dead_letters.record(record, bad.error, consumer=step.group, attempts=1)
        return
    handler = step.handlers.get(envelope.type)
    if handler is None:
        return
    position = _position.set(LogPosition(record.topic, record.partition, record.offset))
    try:
        with structlog.contextvars.bound_contextvars(
                invocation_id=envelope.correlationid, event_id=envelope.id,
                event_type=envelope.type, step=step.group):
            await _run_guarded(handler, envelope, record, step, deps)
    finally:
        _position.reset(position)


async def _run_guarded(handler: Handler, envelope: Envelope, record: Any, step: Step,
                       deps: PipelineDeps) -> None:
    last: BaseException | None = None
    for attempt in range(1, POISON_ATTEMPTS + 1):
        try:
            await handler(envelope)
            return
        except Exception as exc:  # boundary: becomes a dead-letter record below
            last = exc
            log.warning("handler.failed", group=step.group, event_id=envelope.id,
                        event_type=envelope.type, attempt=attempt, error=repr(exc))
    error = ToolexecError(
        f"handler {step.group} failed {POISON_ATTEMPTS} times on {envelope.type}: {last!r}",
        code="E3000",
        details={"traceback": "".join(traceback.format_exception(last))[-4000:]},
    )
    await deps.dead_letters.record(record, error.to_dict(), consumer=step.group,
                                   attempts=POISON_ATTEMPTS)
    data = envelope.data
    invocation_id = getattr(data, "invocation_id", None)
    if invocation_id and step.fails_invocation:
        await deps.resolve.publish(failed(
            envelope, error, stage=_stage_of(step.group), invocation_id=invocation_id,
            tool_id=getattr(data, "tool_id", None), version=getattr(data, "version", None),
            now=deps.clock()))


def _stage_of(group: str) -> str:
    stage = group.rsplit(".", 1)[-1]
    return stage if stage in ("resolve", "authorize", "execute", "finalize") else "request"
