"""The circuit-breaker read model: the current state per external service."""

from __future__ import annotations

from contracts import topics
from contracts.envelope import Envelope
from contracts.events import CircuitStateChanged
from projections.store import AggregateModel, Row, single_row
from projections.tables import circuits, iso

NAME = "circuits"


def evolve_circuit(row: Row | None, envelope: Envelope) -> Row | None:
    """Fold one `circuit.state.changed` into the service's row (pure)."""
    data = envelope.data
    if not isinstance(data, CircuitStateChanged):
        return row
    return {"service_id": data.service_id, "state": data.to_state,
            "previous_state": data.from_state, "failure_count": data.failure_count,
            "success_count": data.success_count, "since": iso(data.since),
            "reason": data.reason, "transitions": (row["transitions"] if row else 0) + 1,
            "updated_at": iso(envelope.time)}


def _service_of(envelope: Envelope) -> str | None:
    data = envelope.data
    return data.service_id if isinstance(data, CircuitStateChanged) else None


def circuits_model() -> AggregateModel:
    """The circuit-breaker read model, ready for a runner."""
    return AggregateModel(name=NAME, topics=(topics.CIRCUITS,), tables=(circuits,),
                          key_column="service_id", aggregate_of=_service_of,
                          fold=single_row(circuits, evolve_circuit))
