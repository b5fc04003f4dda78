"""Prometheus metrics of a running toolexec, on the default registry (served at /metrics).

Invocation outcomes and per-step latencies are observed by the pipeline of this
process as it runs invocations (`Stack.observers`): every request it starts and every
fact it appends, whichever producer sent the request. With several replicas each
reports the invocations it ran; Prometheus sums them. Consumer lag and breaker states
are read when scraped (`refresh_gauges`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

from prometheus_client import Counter, Gauge, Histogram

from contracts.envelope import Envelope
from contracts.events import TERMINAL_TYPES as TERMINAL

STARTED: Final = Counter(
    "toolexec_invocations_started", "Invocation requests the pipeline started, by tool",
    ["tool_id"])
INVOCATIONS: Final = Counter(
    "toolexec_invocations", "Invocations that reached their terminal event, by tool and "
    "outcome (completed | failed) and error code", ["tool_id", "outcome", "code"])
STEP_SECONDS: Final = Histogram(
    "toolexec_pipeline_step_seconds", "Latency of each pipeline step, from the event that "
    "triggers it to the event it emits (event times); `total` is request to terminal event",
    ["step"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                       5.0, 10.0, 30.0, 60.0, 120.0, 300.0))
CONSUMER_LAG: Final = Gauge(
    "toolexec_consumer_lag", "Records on the log not yet consumed, per consumer group "
    "(pipeline steps) or read model", ["consumer"])
CIRCUIT_STATE: Final = Gauge(
    "toolexec_circuit_state", "Circuit-breaker state per external service: 0 closed, "
    "1 half_open, 2 open", ["service_id"])
CIRCUIT_STATE_CODES: Final = {"closed": 0, "half_open": 1, "open": 2}

# step name -> (event that ends it, event that starts it)
STEPS: Final = (
    ("resolve", "tool.chain.resolved", "tool.invoke.requested"),
    ("authorize", "tool.permission.decided", "tool.chain.resolved"),
    ("execute", "tool.execution.finished", "tool.permission.decided"),
    ("finalize", "terminal", "tool.execution.finished"),
    ("total", "terminal", "tool.invoke.requested"),
)
TRACKED: Final = frozenset({"tool.invoke.requested", "tool.chain.resolved",
                            "tool.permission.decided", "tool.execution.finished"})

class PipelineMetrics:
    """Folds invocation events into `STARTED`, `INVOCATIONS` and `STEP_SECONDS`.

    Keeps the event times of at most `capacity` unfinished invocations (oldest dropped),
    so a flood of invocations that never end cannot grow it without bound."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._capacity = capacity
        self._times: OrderedDict[str, dict[str, float]] = OrderedDict()

    def observe(self, event: Envelope) -> None:
        """One request started or fact appended by the pipeline."""
        kind = event.type
        key = event.correlationid
        if kind == "tool.invoke.requested" and key not in self._times:
            STARTED.labels(tool_id=str(getattr(event.data, "tool_id", None) or "unknown")).inc()
        if kind in TRACKED:
            # Retries emit several execution.finished: the last one counts.
            self._times.setdefault(key, {})[kind] = event.time.timestamp()
            self._times.move_to_end(key)
            while len(self._times) > self._capacity:
                self._times.popitem(last=False)
        elif kind in TERMINAL:
            self._finish(key, event)

    def _finish(self, key: str, event: Envelope) -> None:
        data = event.data
        error = getattr(data, "error", None)
        INVOCATIONS.labels(tool_id=str(getattr(data, "tool_id", None) or "unknown"),
                           outcome="completed" if event.type == "tool.invoke.completed"
                           else "failed",
                           code=error.code if error is not None else "").inc()
        times = self._times.pop(key, {})
        times["terminal"] = event.time.timestamp()
        for step, stop, start in STEPS:
            if stop in times and start in times:
                STEP_SECONDS.labels(step=step).observe(max(times[stop] - times[start], 0.0))


async def refresh_gauges(circuits: Iterable[Mapping[str, Any]],
                         lag: Callable[[], Awaitable[Mapping[str, int]]]) -> None:
    """Set the breaker-state and consumer-lag gauges from their current sources."""
    for row in circuits:
        CIRCUIT_STATE.labels(service_id=row["service_id"]).set(
            CIRCUIT_STATE_CODES.get(row["state"], -1))
    for consumer, records in (await lag()).items():
        CONSUMER_LAG.labels(consumer=consumer).set(records)
