"""Step — circuits: tool.execution.finished -> circuit.state.changed.

Folds the outcomes of attempts of tools naming an `external_service` into a breaker
per service (domain.circuit) and publishes every transition on `toolexec.circuits`,
keyed by service id. Which outcomes count is decided by domain.circuit.health_signal.

The working states live in memory (`CircuitBook`); a service seen for the first
time starts from its recorded state (the circuits projection, rebuilt from
`toolexec.circuits`). Time is the finished event's own time, so replaying the same
outcomes yields the same transitions. Transition ids are uuid5(finished event id,
step name): a redelivered outcome publishes nothing new, and is not counted twice.

This step must see every outcome of a service: run it as ONE consumer (one replica
of its group); several replicas would each count a share of the outcomes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Protocol

from consumers.ports import Clock, Publish, RegistryReader
from contracts.envelope import Envelope, derived_event_id, new_envelope
from contracts.events import CircuitStateChanged, ExecutionFinished
from domain.circuit import CircuitConfig, CircuitState, Transition, health_signal, record

SOURCE = "urn:toolexec:circuits"
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
