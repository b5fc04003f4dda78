"""The circuits step (consumers.steps.circuit_transitions) with a fake publish, and the circuit view
it and the executor share (projections.circuit_view)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from consumers.steps.circuit_transitions import CircuitBook, CircuitDeps, on_execution_finished
from contracts.envelope import Envelope, new_envelope
from contracts.errors import ErrorInfo
from contracts.events import CircuitStateChanged, ExecutionFinished
from domain.circuit_breaker import CircuitConfig
from domain.model import ToolVersion
from projections.circuit_view import CircuitView

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
MANIFEST = {"tool_id": "mailer", "version": "1.0.0", "tool_type": "api",
            "external_service": "mail",
            "circuit_breaker_config": {"failure_threshold": 2, "success_threshold": 2,
                                       "timeout_seconds": 5}}
CONFIG = CircuitConfig.from_manifest(MANIFEST)


class Registry:
    revision = 0

    def get(self, tool_id: str, version: str) -> ToolVersion | None:
        if (tool_id, version) != ("mailer", "1.0.0"):
            return None
        return ToolVersion(tool_id=tool_id, version=version, manifest=MANIFEST, files=(),
                           integrity="sha256:" + "0" * 64)


@dataclass
class Harness:
    view: CircuitView = field(default_factory=CircuitView)
    published: list[Envelope] = field(default_factory=list)
    deps: CircuitDeps = field(init=False)

    def __post_init__(self) -> None:
        self.deps = CircuitDeps(publish=self.publish, registry=Registry(),  # type: ignore[arg-type]
                                book=CircuitBook(self.view), clock=lambda: T0)

    async def publish(self, envelope: Envelope) -> None:
        self.published.append(envelope)

    def handle(self, event: Envelope) -> None:
        asyncio.run(on_execution_finished(event, self.deps))

    def transitions(self) -> list[tuple[str, str]]:
        return [(e.data.from_state, e.data.to_state) for e in self.published]


def finished(seconds: float, *, outcome: str = "failure", code: str | None = "E3502",
             status: int | None = 503, service: str | None = "mail",
             event_id: str | None = None) -> Envelope:
    invocation = str(uuid.uuid4())
    error = None if outcome == "success" else ErrorInfo(code=code or "E3401", message="x")
    data = ExecutionFinished(invocation_id=invocation, attempt=1, tool_id="mailer",
                             version="1.0.0", outcome=outcome,  # type: ignore[arg-type]
                             status_code=status if outcome != "success" else 200,
                             duration_ms=1.0, error=error, external_service=service)
    when = T0 + timedelta(seconds=seconds)
    return new_envelope(data, source="test", partitionkey=invocation, correlationid=invocation,
                        id=event_id or str(uuid.uuid4()), time=when)


def test_threshold_failures_publish_one_transition_keyed_by_service() -> None:
    harness = Harness()
    first, second = finished(0), finished(1)
    harness.handle(first)
    harness.handle(second)
    assert harness.transitions() == [("closed", "open")]
    event = harness.published[0]
    assert event.type == "circuit.state.changed" and event.partitionkey == "mail"
    assert event.causationid == second.id and event.correlationid == second.correlationid
    assert event.data.since == second.time and event.data.failure_count == 2


def test_tools_without_an_external_service_are_ignored() -> None:
    harness = Harness()
    for n in range(5):
        harness.handle(finished(n, service=None))
    assert harness.published == []


def test_tool_side_failures_do_not_trip_the_breaker() -> None:
    harness = Harness()
    for n in range(5):
        harness.handle(finished(n, code="E3401", status=404))
    assert harness.published == []


def test_a_redelivered_outcome_is_counted_once() -> None:
    harness = Harness()
    event = finished(0)
    harness.handle(event)
    harness.handle(event)
    assert harness.published == []
    harness.handle(finished(1))
    assert harness.transitions() == [("closed", "open")]


def test_transition_ids_are_deterministic() -> None:
    one, two = Harness(), Harness()
    events = [finished(0, event_id="a"), finished(1, event_id="b")]
    for harness in (one, two):
        for event in events:
            harness.handle(event)
    assert [e.id for e in one.published] == [e.id for e in two.published]


def test_recovery_goes_through_half_open_to_closed() -> None:
    harness = Harness()
    for n in range(2):
        harness.handle(finished(n))
    harness.handle(finished(10, outcome="success"))
    harness.handle(finished(11, outcome="success"))
    assert harness.transitions() == [("closed", "open"), ("open", "half_open"),
                                     ("half_open", "closed")]
    assert harness.published[1].data.since == T0 + timedelta(seconds=6)


def test_the_step_starts_from_the_recorded_state() -> None:
    harness = Harness()
    for event in (finished(0), finished(1)):
        harness.handle(event)
    restarted = Harness()
    for event in harness.published:
        restarted.view.apply(event)
    restarted.handle(finished(20))
    assert restarted.transitions() == [("open", "half_open"), ("half_open", "open")]


def test_the_view_folds_transitions_and_refuses_while_open() -> None:
    harness = Harness()
    for event in (finished(0), finished(1)):
        harness.handle(event)
    view = CircuitView()
    for event in harness.published:
        view.apply(event, partition=0, offset=0)
    assert view.state("mail").state == "open"
    assert view.caught_up_with({0: 1})
    refused = view.admit("mail", T0 + timedelta(seconds=2), CONFIG)
    assert not refused.allowed and refused.retry_after_seconds == 4
    assert view.admit("mail", T0 + timedelta(seconds=6), CONFIG).canary
    assert view.admit("other", T0, CONFIG).allowed


def test_the_view_counts_canaries_in_flight() -> None:
    view = CircuitView()
    view.apply(_changed("closed", "open", T0))
    config = CircuitConfig(timeout_seconds=1, half_open_max_calls=1)
    later = T0 + timedelta(seconds=2)
    assert view.admit("mail", later, config).allowed
    view.begin_canary("mail")
    assert not view.admit("mail", later, config).allowed
    view.end_canary("mail")
    assert view.admit("mail", later, config).allowed


def test_the_view_skips_a_duplicate_event() -> None:
    view = CircuitView()
    opened = _changed("closed", "open", T0, event_id="x")
    view.apply(opened)
    view.apply(_changed("open", "closed", T0 + timedelta(seconds=9)))
    view.apply(opened)
    assert view.state("mail").state == "closed" and view.revision == 2


def _changed(from_state: str, to_state: str, since: datetime, *,
             event_id: str | None = None) -> Envelope:
    fields: dict[str, Any] = {"service_id": "mail", "from_state": from_state,
                              "to_state": to_state, "failure_count": 0, "success_count": 0,
                              "since": since}
    data = CircuitStateChanged(**fields)
    return new_envelope(data, source="test", partitionkey="mail", correlationid="inv",
                        id=event_id or str(uuid.uuid4()), time=since)
