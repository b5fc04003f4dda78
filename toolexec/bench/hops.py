"""Where a sequential invocation's time goes, hop by hop (scenario 1's breakdown).

After scenario 1, the invocations log is read back and each measured invocation's
facts are put on one time line with the producer's own clock: when the request was
produced, the times the pipeline stamped on `tool.chain.resolved`,
`tool.execution.started` and `tool.invoke.completed`, the primitive run (its
`duration_ms`, ending just before `tool.execution.finished` was stamped), and when the
producer had the terminal event. All clocks are this host's, so the differences hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer

from contracts import topics
from contracts.envelope import Envelope
from toolexec.bench.env import HANG_SECONDS
from toolexec.bench.report import Figure, percentile
from toolexec.log_reading import events_to

READ_BACK_SECONDS = HANG_SECONDS


@dataclass(frozen=True)
class Sent:
    """One measured invocation as its producer saw it (wall-clock seconds)."""

    produced: float
    received: float


HOPS = (
    ("request produced -> chain resolved", "produced", "resolved"),
    ("chain resolved -> execution started stamped", "resolved", "started"),
    ("execution started stamped -> run begins (write-ahead)", "started", "run_begins"),
    ("primitive run", "run_begins", "run_ends"),
    ("run ends -> terminal stamped", "run_ends", "terminal"),
    ("terminal stamped -> producer has it", "terminal", "received"),
)


def hop_figures(sent: Mapping[str, Sent], events: list[Envelope]) -> dict[str, Figure]:
    """p50 of each hop (ms) over the invocations whose whole time line is known."""
    marks: dict[str, dict[str, float]] = {
        invocation_id: {"produced": one.produced, "received": one.received}
        for invocation_id, one in sent.items()}
    for event in events:
        line = marks.get(event.correlationid)
        if line is not None:
            _mark(line, event)
    complete = [line for line in marks.values()
                if all(name in line for _, first, last in HOPS for name in (first, last))]
    if not complete:
        return {}
    figures: dict[str, Figure] = {
        f"hop p50 ms: {label}": round(percentile(
            [(line[last] - line[first]) * 1000 for line in complete], 50), 3)
        for label, first, last in HOPS}
    figures["hop breakdown invocations"] = len(complete)
    return figures


def _mark(line: dict[str, float], event: Envelope) -> None:
    at = event.time.timestamp()
    kind = event.type
    if kind == "tool.chain.resolved":
        line.setdefault("resolved", at)
    elif kind == "tool.execution.started":
        line.setdefault("started", at)
    elif kind == "tool.execution.finished":
        duration = getattr(event.data, "duration_ms", None)
        if duration is not None and "run_ends" not in line:
            line["run_ends"] = at
            line["run_begins"] = at - duration / 1000
    elif kind in ("tool.invoke.completed", "tool.invoke.failed"):
        line.setdefault("terminal", at)


async def invocation_facts(bootstrap: str, ids: set[str]) -> list[Envelope]:
    """The facts of `ids` on the invocations log as it is now (log order per partition)."""
    consumer = AIOKafkaConsumer(topics.INVOCATIONS, bootstrap_servers=bootstrap,
                                group_id=None, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    found: list[Envelope] = []
    try:
        async with asyncio.timeout(READ_BACK_SECONDS):
            while not consumer.assignment():
                await asyncio.sleep(0.01)
            ends = await consumer.end_offsets(list(consumer.assignment()))
            found = [event async for event in events_to(consumer, ends)
                     if event.correlationid in ids]
    finally:
        await consumer.stop()
    return found
