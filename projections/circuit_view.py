"""The circuit-breaker view the executor asks before calling an external service.

An in-memory fold of `circuit.state.changed` from `toolexec.circuits`, read from
offset 0 outside any consumer group by every executor process (like the registry
view), so all replicas see the same recorded states. `admit` applies the time-driven
open -> half-open step itself, so no event is needed for a breaker to half-open.

Canaries in flight (half-open) are counted here, in process: with one executor
process that is exact. With several replicas each admits up to half_open_max_calls;
production needs a shared counter (Redis INCR/DECR with a TTL on
`cb:{service_id}:half_open_in_flight`), which is not implemented here.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from datetime import datetime

from contracts.envelope import Envelope
from contracts.events import CircuitStateChanged
from domain.circuit_breaker import (
    Admission,
    CircuitConfig,
    CircuitState,
    Transition,
    admit,
    apply_transition,
)
from projections.log_position import EndOffsets, LogPosition

REMEMBERED_EVENT_IDS = 10_000


def transition_from_event(data: CircuitStateChanged) -> Transition:
    """Translate the contract into the domain's Transition."""
    return Transition(from_state=data.from_state, to_state=data.to_state, at=data.since,
                      failure_count=data.failure_count, success_count=data.success_count,
                      reason=data.reason or "")


class CircuitView:
    """Recorded breaker states per service, plus in-process canary accounting.

    Implements the executor's CircuitGate port (`admit`, `begin_canary`,
    `end_canary`) and the circuits step's CircuitStates port (`state`, `catch_up`).
    """

    def __init__(self, end_offsets: EndOffsets | None = None) -> None:
        self._states: dict[str, CircuitState] = {}
        self._canaries: dict[str, int] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.position = LogPosition(end_offsets)
        self.revision = 0

    # -- fold -------------------------------------------------------------------
    def apply(self, envelope: Envelope, *, partition: int | None = None,
              offset: int | None = None) -> None:
        """Apply one `circuit.state.changed` (a redelivered event id is skipped)."""
        data = envelope.data
        if isinstance(data, CircuitStateChanged) and envelope.id not in self._seen:
            self._remember(envelope.id)
            previous = self._states.get(data.service_id, CircuitState())
            self._states[data.service_id] = apply_transition(previous,
                                                             transition_from_event(data))
            self.revision += 1
        if partition is not None and offset is not None:
            self.advance(partition, offset)

    def advance(self, partition: int, offset: int) -> None:
        """Mark `offset` of `partition` as read (also for records not applied)."""
        self.position.advance(partition, offset)

    def _remember(self, event_id: str) -> None:
        self._seen[event_id] = None
        if len(self._seen) > REMEMBERED_EVENT_IDS:
            self._seen.popitem(last=False)

    # -- reads --------------------------------------------------------------------
    def state(self, service_id: str) -> CircuitState:
        """The recorded state of `service_id` (closed when it never changed)."""
        return self._states.get(service_id, CircuitState())

    def services(self) -> dict[str, CircuitState]:
        """Every service with a recorded transition."""
        return dict(self._states)

    def caught_up_with(self, end_offsets: dict[int, int]) -> bool:
        return self.position.caught_up_with(end_offsets)

    async def catch_up(self, timeout: float) -> bool:
        """Wait (bounded) until the view has read the topic up to its end offsets now."""
        return await self.position.catch_up(timeout)

    # -- CircuitGate --------------------------------------------------------------
    def admit(self, service_id: str, at: datetime, config: CircuitConfig) -> Admission:
        """May a call to `service_id` go now? (see domain.circuit_breaker.admit)"""
        state = dataclasses.replace(self.state(service_id),
                                    half_open_in_flight=self._canaries.get(service_id, 0))
        return admit(state, at, config)

    def begin_canary(self, service_id: str) -> None:
        """Count one half-open canary call in flight (call right after `admit`)."""
        self._canaries[service_id] = self._canaries.get(service_id, 0) + 1

    def end_canary(self, service_id: str) -> None:
        """The canary call finished, whatever its outcome."""
        left = self._canaries.get(service_id, 0) - 1
        if left > 0:
            self._canaries[service_id] = left
        else:
            self._canaries.pop(service_id, None)
