"""FastStream wiring of the pipeline steps: two consumer groups on the invocations topic.

`{prefix}.pipeline` runs the quick, sequential steps (authorize, resolve, finalize,
circuits): its one subscriber reads each record once and calls, in order, every
handler registered for the record's type. `{prefix}.execute` runs tools concurrently
(see consumers.inflight). Every record is thus delivered to two groups, not one per
step, and records of other types are skipped by the `ce_type` header alone, before
any decoding.

Bad input never crashes a consumer: undecodable records are dead-lettered (once, by
the pipeline group); a handler that keeps failing on a record is retried a bounded
number of times, then the record is dead-lettered with the traceback and the step's
name, and the invocation gets its terminal failure event. The record's remaining
handlers on the invocation's path are then skipped, so that the failure stays the
invocation's one terminal event (with a group per step, resolve went on after authorize
gave up on a request, and the invocation could end twice); side steps such as circuits
still run.
"""

from __future__ import annotations

import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
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
from contracts.kafka_binding import UndecodableRecord, decode, header_type
from domain.errors import ToolexecError

log = structlog.get_logger(__name__)

React = Callable[[Envelope], Awaitable[None]]
POISON_ATTEMPTS = 3
STAGES = ("resolve", "authorize", "execute", "finalize")

_position: ContextVar[LogPosition | None] = ContextVar("record_position", default=None)


def current_position() -> LogPosition | None:
    """Where the record being handled sits in the log (for handlers that read back)."""
    return _position.get()


async def passthrough_decoder(message: Any) -> Any:
    """FastStream decoder that hands the handler the raw StreamMessage."""
    return message


@dataclass(frozen=True)
class Handler:
    """One step's reaction to one event type."""

    event_type: str
    step: str
    """The pipeline step (resolve, authorize, ...): named in dead-letter records and
    as the stage of the invocation's failure."""
    react: React
    fails_invocation: bool = True
    """Whether a poison record ends the invocation with tool.invoke.failed (False for
    side steps, such as circuits, that are not on the invocation's path)."""


@dataclass
class Group:
    """One consumer group on the invocations topic and the handlers it runs."""

    name: str
    handlers: Mapping[str, Sequence[Handler]]
    """By event type, in the order they run on a record."""
    dead_letter_undecodable: bool = False
    max_workers: int = 1
    immediate: frozenset[str] = frozenset()
    """Event types handled at once, without waiting for a free worker slot (quick
    signals to work in flight, such as a cancel while every slot runs a tool)."""


def by_type(handlers: Iterable[Handler]) -> dict[str, tuple[Handler, ...]]:
    """`handlers` keyed by event type, each type's in the order given."""
    found: dict[str, tuple[Handler, ...]] = {}
    for handler in handlers:
        found[handler.event_type] = (*found.get(handler.event_type, ()), handler)
    return found


@dataclass(frozen=True)
class PipelineDeps:
    resolve: resolve.ResolveDeps
    authorize: authorize.AuthorizeDeps
    execute: execute.ExecuteDeps
    finalize: finalize.FinalizeDeps
    dead_letters: DeadLetters
    clock: Callable[[], datetime]
    circuits: circuits.CircuitDeps | None = None


def pipeline_groups(deps: PipelineDeps, *, group_prefix: str,
                    execute_workers: int) -> list[Group]:
    """DESIGN.md's pipeline steps, bound to their ports, in their two consumer groups."""
    # Authorize comes before resolve on a request: it must keep the request's token
    # before the chain.resolved that resolve publishes is handled, which in-process
    # brokers (tests) deliver nested, inside resolve's publish.
    quick = [*_authorize(deps.authorize), *_resolve(deps.resolve),
             *_finalize(deps.finalize), *_circuits(deps.circuits)]
    return [
        Group(f"{group_prefix}.pipeline", by_type(quick), dead_letter_undecodable=True),
        Group(f"{group_prefix}.execute", by_type(_execute(deps.execute)),
              max_workers=execute_workers,
              immediate=frozenset({"tool.invoke.cancel.requested"})),
    ]


def _authorize(deps: authorize.AuthorizeDeps) -> list[Handler]:
    return [Handler("tool.invoke.requested", "authorize",
                    lambda e: authorize.on_invoke_requested(e, deps)),
            Handler("tool.chain.resolved", "authorize",
                    lambda e: authorize.on_chain_resolved(e, deps, current_position()))]


def _resolve(deps: resolve.ResolveDeps) -> list[Handler]:
    return [Handler("tool.invoke.requested", "resolve",
                    lambda e: resolve.on_invoke_requested(e, deps))]


def _execute(deps: execute.ExecuteDeps) -> list[Handler]:
    return [Handler("tool.permission.decided", "execute",
                    lambda e: execute.on_permission_decided(e, deps)),
            Handler("tool.invoke.cancel.requested", "execute",
                    lambda e: execute.on_cancel_requested(e, deps))]


def _finalize(deps: finalize.FinalizeDeps) -> list[Handler]:
    return [Handler("tool.execution.finished", "finalize",
                    lambda e: finalize.on_execution_finished(e, deps))]


def _circuits(deps: circuits.CircuitDeps | None) -> list[Handler]:
    if deps is None:
        return []
    return [Handler("tool.execution.finished", "circuits",
                    lambda e: circuits.on_execution_finished(e, deps), fails_invocation=False)]


@dataclass
class Attached:
    """What a running group needs at shutdown: finish work in flight, then commit."""

    committer: CommitCoalescer
    inflight: InFlight | None = None

    async def drain(self) -> None:
        if self.inflight is not None:
            await self.inflight.drain()
        await self.committer.flush()


def attach_group(broker: KafkaBroker, group: Group, deps: PipelineDeps, *,
                 consumer_options: Mapping[str, Any]) -> Attached:
    """Subscribe `group` to the invocations topic on `broker`.

    Offsets are committed only past finished records, in coalesced batches. A group
    with max_workers > 1 processes records concurrently through one consumer (see
    consumers.inflight); the others handle one record after another.
    """
    committer = CommitCoalescer()
    subscribe = broker.subscriber(topics.INVOCATIONS, group_id=group.name,
                                  auto_offset_reset="earliest", ack_policy=AckPolicy.MANUAL,
                                  **consumer_options)
    if group.max_workers <= 1 and not group.immediate:  # immediate records need the other path
        @subscribe
        async def handle(message: Any) -> None:
            record = message.raw_message
            tp = TopicPartition(record.topic, record.partition)
            try:
                await process_record(record, group, deps)
            except Exception:
                committer.hold(tp, record.offset)  # output not delivered: not skipped
                raise
            committer.done(message.consumer.commit, tp, record.offset + 1)
        return Attached(committer)

    inflight = InFlight(group.max_workers)

    @subscribe
    async def handle_concurrently(message: Any) -> None:
        record = message.raw_message
        consumer = message.consumer

        async def commit(positions: dict[TopicPartition, int]) -> None:
            for tp, position in positions.items():
                committer.done(consumer.commit, tp, position)

        ce_type = header_type(record.headers)
        if ce_type is not None and ce_type not in group.handlers:
            await inflight.skip(record, commit)  # no task for records of other groups
            return
        if ce_type in group.immediate:
            await inflight.run_now(record, lambda: process_record(record, group, deps), commit)
            return
        await inflight.submit(record, lambda: process_record(record, group, deps), commit)

    return Attached(committer, inflight)


async def process_record(record: Any, group: Group, deps: PipelineDeps) -> None:
    """Decode one record and run each of the group's handlers for its type, in order.

    Never raises for a handler's own failure (see `_run_guarded`); re-raises, after
    the side steps ran, a failure to publish a handler's failure outcome.
    """
    ce_type = header_type(record.headers)
    if ce_type is not None and ce_type not in group.handlers:
        return
    try:
        envelope = decode(record.key, record.value, record.headers)
    except UndecodableRecord as bad:
        if group.dead_letter_undecodable:
            await deps.dead_letters.record(record, bad.error, consumer=group.name, attempts=1)
        return
    handlers = group.handlers.get(envelope.type, ())
    if not handlers:
        return
    position = _position.set(LogPosition(record.topic, record.partition, record.offset))
    try:
        with structlog.contextvars.bound_contextvars(
                invocation_id=envelope.correlationid, event_id=envelope.id,
                event_type=envelope.type, group=group.name):
            await _run_each(handlers, envelope, record, group, deps)
    finally:
        _position.reset(position)


async def _run_each(handlers: Sequence[Handler], envelope: Envelope, record: Any,
                    group: Group, deps: PipelineDeps) -> None:
    undelivered: Exception | None = None
    path_given_up = False
    for handler in handlers:
        if path_given_up and handler.fails_invocation:
            continue  # the invocation has (or, once redelivered, will have) its failure
        try:
            with structlog.contextvars.bound_contextvars(step=handler.step):
                gave_up = await _run_guarded(handler, envelope, record, group, deps)
        except Exception as exc:  # the record is held; side steps still get it
            undelivered = undelivered or exc
            gave_up = True
        path_given_up = path_given_up or (gave_up and handler.fails_invocation)
    if undelivered is not None:
        raise undelivered


async def _run_guarded(handler: Handler, envelope: Envelope, record: Any, group: Group,
                       deps: PipelineDeps) -> bool:
    """Run `handler`, retrying a bounded number of times; False when it succeeded, True
    when it gave up (dead-letter record and, on the invocation's path, its failure)."""
    last: BaseException | None = None
    for attempt in range(1, POISON_ATTEMPTS + 1):
        try:
            await handler.react(envelope)
            return False
        except Exception as exc:  # boundary: becomes a dead-letter record below
            last = exc
            log.warning("handler.failed", group=group.name, step=handler.step,
                        event_id=envelope.id, event_type=envelope.type, attempt=attempt,
                        error=repr(exc))
    error = ToolexecError(
        f"handler {handler.step} ({group.name}) failed {POISON_ATTEMPTS} times on "
        f"{envelope.type}: {last!r}",
        code="E3000",
        details={"step": handler.step,
                 "traceback": "".join(traceback.format_exception(last))[-4000:]},
    )
    await deps.dead_letters.record(record, error.to_dict(), consumer=consumer_of(group, handler),
                                   attempts=POISON_ATTEMPTS)
    data = envelope.data
    invocation_id = getattr(data, "invocation_id", None)
    if invocation_id and handler.fails_invocation:
        await deps.resolve.publish(failed(
            envelope, error, stage=_stage_of(handler.step), invocation_id=invocation_id,
            tool_id=getattr(data, "tool_id", None), version=getattr(data, "version", None),
            now=deps.clock()))
    return True


def consumer_of(group: Group, handler: Handler) -> str:
    """Who gave up on a record, as dead-letter records name it: group and step."""
    return f"{group.name}/{handler.step}"


def _stage_of(step: str) -> str:
    return step if step in STAGES else "request"
