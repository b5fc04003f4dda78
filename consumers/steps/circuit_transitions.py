"""Step — circuits: tool.execution.finished -> circuit.state.changed.

Folds the outcomes of attempts of tools naming an `external_service` into a breaker
per service (domain.circuit_breaker) and publishes every transition on `toolexec.circuits`,
keyed by service id. Which outcomes count is decided by domain.circuit_breaker.health_signal.

The working states live in memory (`CircuitBook`); a service seen for the first
time starts from its recorded state (the circuits projection, rebuilt from
`toolexec.circuits`). Time is the finished event's own time, so replaying the same
outcomes yields the same transitions. Transition ids are uuid5(finished event id,
step name): a redelivered outcome publishes nothing new, and is not counted twice.

This step must see every outcome of a service: run it as ONE consumer (one replica
of its group); several replicas would each count a share of the outcomes. It is a
side step: a record it cannot count is dead-lettered and the invocation goes on.
"""

from __future__ import annotations

import traceback
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import structlog
from prometheus_client import Counter

from consumers.ports import Clock, Publish, RegistryReader
from consumers.runtime.deadletter import DeadLetters
from contracts.envelope import Envelope, derived_event_id, new_envelope
from contracts.errors import ErrorInfo
from contracts.events import CircuitStateChanged, ExecutionFinished
from contracts.kafka_binding import UndecodableRecord, decode, header_type
from domain.circuit_breaker import CircuitConfig, CircuitState, Transition, health_signal, record

log = structlog.get_logger(__name__)

UNTRUSTED_FACTS = Counter(
    "toolexec_untrusted_facts", "Records on the facts topic whose pipeline signature did "
    "not check out, dead-lettered (E3804)", ["verdict"])

SOURCE = "urn:toolexec:circuits"
POISON_ATTEMPTS = 3
REMEMBERED_OUTCOMES = 10_000
CATCH_UP_SECONDS = 10.0


class CircuitStates(Protocol):
    """Recorded breaker states: a projection of `toolexec.circuits`."""

    def state(self, service_id: str) -> CircuitState: ...

    async def catch_up(self, timeout: float) -> bool:
        """Wait (bounded) until the recorded states include the topic's end."""
        ...


@dataclass
class CircuitBook:
    """The step's working breaker states, and the outcome event ids already counted."""

    recorded: CircuitStates
    states: dict[str, CircuitState] = field(default_factory=dict)
    counted: OrderedDict[str, None] = field(default_factory=OrderedDict)
    ready: bool = False

    async def get(self, service_id: str) -> CircuitState:
        """The working state; a new service starts from its recorded state."""
        if not self.ready:
            await self.recorded.catch_up(CATCH_UP_SECONDS)
            self.ready = True
        if service_id not in self.states:
            self.states[service_id] = replace(self.recorded.state(service_id),
                                              half_open_in_flight=0)
        return self.states[service_id]

    def put(self, service_id: str, state: CircuitState, outcome_id: str) -> None:
        """Keep the new state and remember that outcome `outcome_id` was counted."""
        self.states[service_id] = state
        self.counted[outcome_id] = None
        if len(self.counted) > REMEMBERED_OUTCOMES:
            self.counted.popitem(last=False)


@dataclass(frozen=True)
class CircuitDeps:
    publish: Publish
    registry: RegistryReader
    book: CircuitBook
    clock: Clock


async def on_execution_finished(event: Envelope, deps: CircuitDeps) -> None:
    """Count one attempt's outcome against its service; publish the transitions."""
    finished: ExecutionFinished = event.data
    service = finished.external_service
    if not service or event.id in deps.book.counted:
        return
    error_code = finished.error.code if finished.error is not None else None
    signal = health_signal(finished.outcome, error_code, finished.status_code)
    if signal is None:
        return
    config = _config(deps.registry, finished)
    state, transitions = record(await deps.book.get(service), signal, event.time, config)
    for n, transition in enumerate(transitions):
        await deps.publish(_changed(event, service, transition, n, deps))
    deps.book.put(service, state, event.id)


def _config(registry: RegistryReader, finished: ExecutionFinished) -> CircuitConfig:
    """The breaker config of the tool whose attempt this was (defaults if unknown)."""
    tool = registry.get(finished.tool_id, finished.version)
    return CircuitConfig() if tool is None else CircuitConfig.from_manifest(tool.manifest)


def _changed(cause: Envelope, service: str, transition: Transition, n: int,
             deps: CircuitDeps) -> Envelope:
    data = CircuitStateChanged(
        service_id=service, from_state=transition.from_state, to_state=transition.to_state,
        failure_count=transition.failure_count, success_count=transition.success_count,
        since=transition.at, reason=transition.reason,
    )
    extensions = {k: v for k, v in cause.extensions.items() if k == "traceparent"}
    return new_envelope(data, source=SOURCE, partitionkey=service,
                        correlationid=cause.correlationid, causationid=cause.id,
                        id=derived_event_id(cause.id, f"circuit.{service}.{n}"),
                        time=deps.clock(), extensions=extensions)


async def misplaced_record(record: Any, dead_letters: DeadLetters, *, consumer: str) -> None:
    """Dead-letter a record of the facts topic that is no fact at all (no `ce_type`, a
    command, an unknown type): the circuits group reads every fact, so it is the one
    that notices."""
    await dead_letters.record(record, ErrorInfo(
        code="E3004", message="record on the facts topic is not a pipeline fact",
        details={"type": header_type(record.headers)}), consumer=consumer, attempts=1)


async def untrusted_record(record: Any, verdict: str, dead_letters: DeadLetters, *,
                           consumer: str) -> None:
    """Dead-letter a fact whose signature does not check out (forged, altered, or
    signed by a key no one trusts): it becomes no state and no answer anywhere."""
    UNTRUSTED_FACTS.labels(verdict=verdict).inc()
    await dead_letters.record(record, ErrorInfo(
        code="E3804", message=f"fact not signed by a trusted pipeline key ({verdict})",
        details={"type": header_type(record.headers), "verdict": verdict}),
        consumer=consumer, attempts=1)


async def count_record(record: Any, deps: CircuitDeps, dead_letters: DeadLetters, *,
                       consumer: str) -> None:
    """Count one `tool.execution.finished` record of the log; a record that cannot be
    decoded or keeps failing is dead-lettered (the facts topic's other consumers keep
    their own view of it)."""
    try:
        event = decode(record.key, record.value, record.headers)
    except UndecodableRecord as bad:
        await dead_letters.record(record, bad.error, consumer=consumer, attempts=1)
        return
    last: BaseException | None = None
    for attempt in range(1, POISON_ATTEMPTS + 1):
        try:
            await on_execution_finished(event, deps)
            return
        except Exception as exc:  # boundary: becomes a dead-letter record below
            last = exc
            log.warning("circuits.failed", event_id=event.id, attempt=attempt, error=repr(exc))
    await dead_letters.record(record, ErrorInfo(
        code="E3000", message=f"the circuits step failed {POISON_ATTEMPTS} times: {last!r}",
        details={"traceback": "".join(traceback.format_exception(last))[-4000:]}),
        consumer=consumer, attempts=POISON_ATTEMPTS)
