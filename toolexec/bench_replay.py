"""Scenario 5 of `toolexec bench`: replaying a log vs consuming it raw.

Writes a log of N CloudEvents (a few hundred tool publications on a registry topic,
the rest complete invocation lifecycles on a 4-partition invocations topic) to
bench-only topics on the bench's broker, then reads it twice from the start: raw with
aiokafka (the baseline), and decoded and folded into the read models.

The fold is the real one: `projections.rebuild` of the registry, invocations and
audit read models (the models `toolexec up` runs) into a fresh SQLite file.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumers.events import derive
from contracts.envelope import Envelope, new_envelope
from contracts.events import (
    ChainLink,
    ChainResolved,
    ExecutionFinished,
    ExecutionStarted,
    InvokeCompleted,
    InvokeRequested,
    PermissionDecided,
)
from contracts.kafka_binding import KafkaRecord, encode
from domain.model import ResolvedChain, ToolSource
from projections.audit import AuditModel
from projections.database import make_engine, migrate
from projections.invocations import invocations_model
from projections.rebuild import RebuildReport, rebuild_together
from projections.registry_table import registry_model
from projections.store import ReadModel
from toolexec.bench_env import SCRIPT_PARAMS, bench_sources, script_chain, write_bench_tools
from toolexec.bench_report import Figure, ScenarioResult
from toolexec.embedded_broker import ensure_topics
from toolexec.publishing import publish_event

REGISTRY_TOPIC = "bench.replay.registry"
INVOCATIONS_TOPIC = "bench.replay.invocations"
REPLAY_TOPICS = {REGISTRY_TOPIC: 1, INVOCATIONS_TOPIC: 4}
REPLAY_TARGET = 25_000.0
PUBLICATIONS_PER_10K = 30
LIFECYCLE_EVENTS = 6
SEND_WINDOW = 2000


# --------------------------------------------------------------------- building the log


def publications(sources: list[ToolSource], count: int, now: datetime) -> list[Envelope]:
    """`count` tool.published events: the bench sources, then more versions of them."""
    events: list[Envelope] = []
    for index in range(count):
        source = sources[index % len(sources)]
        version = f"{index // len(sources) + 2}.0.0"
        events.append(publish_event(replace(source, manifest={**source.manifest,
                                                               "version": version}), now=now))
    return [e for e in events if e.type == "tool.published"]


def lifecycle(chain: ResolvedChain, now: datetime) -> list[Envelope]:
    """The six events of one successful invocation, derived as the pipeline derives them."""
    invocation_id = str(uuid.uuid4())
    leaf = chain.leaf
    links = [ChainLink(tool_id=t.tool_id, version=t.version, integrity=t.integrity,
                       tool_type=t.tool_type, executor=t.executor) for t in chain.links]
    common: dict[str, Any] = {"invocation_id": invocation_id, "tool_id": leaf.tool_id,
                              "version": leaf.version}
    requested = new_envelope(
        InvokeRequested(invocation_id=invocation_id, tool_id=leaf.tool_id,
                        parameters=dict(SCRIPT_PARAMS)),
        source="urn:bench", partitionkey=invocation_id, correlationid=invocation_id,
        id=str(uuid.uuid4()), time=now)
    steps: list[tuple[str, Any]] = [
        ("resolve", ChainResolved(chain=links, parameters=dict(SCRIPT_PARAMS), **common)),
        ("authorize", PermissionDecided(decision="allow", reason="bench", enforced=False,
                                        chain=links, parameters=dict(SCRIPT_PARAMS), **common)),
        ("execute.started.1", ExecutionStarted(attempt=1, primitive="subprocess",
                                               sandbox="rlimits", plan_summary={}, **common)),
        ("execute.finished.1", ExecutionFinished(attempt=1, outcome="success", exit_code=0,
                                                 duration_ms=12.5,
                                                 stdout='{"ok": true, "keys": 1}', **common)),
        ("finalize", InvokeCompleted(result={"ok": True, "keys": 1}, duration_ms=12.5,
                                     attempts=1, **common)),
    ]
    events = [requested]
    for step, data in steps:
        events.append(derive(events[-1], data, step=step, now=now))
    return events


def log_records(root: Path, total: int) -> Iterator[tuple[str, KafkaRecord]]:
    """(topic, record) pairs of a log of about `total` events."""
    tools_dir = write_bench_tools(root, "127.0.0.1:9")
    now = datetime.now(UTC)
    published = publications(bench_sources(tools_dir), max(1, total * PUBLICATIONS_PER_10K
                                                            // 10_000), now)
    for event in published:
        yield REGISTRY_TOPIC, encode(event)
    chain = script_chain(tools_dir)
    for _ in range(max(0, total - len(published)) // LIFECYCLE_EVENTS):
        for event in lifecycle(chain, now):
            yield INVOCATIONS_TOPIC, encode(event)


async def write_log(bootstrap: str, root: Path, total: int) -> int:
    """Produce the log; returns how many records were written."""
    await ensure_topics(bootstrap, REPLAY_TOPICS)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5,
                                max_batch_size=512 * 1024, max_request_size=2 * 1024 * 1024)
    await producer.start()
    written = 0
    try:
        pending: list[asyncio.Future[Any]] = []
        for topic, record in log_records(root, total):
            pending.append(await producer.send(topic, record.value, key=record.key,
                                               headers=list(record.headers)))
            written += 1
            if len(pending) >= SEND_WINDOW:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return written


# ------------------------------------------------------------------------- reading it


async def read_log(bootstrap: str, on_record: Callable[[Any], None]) -> tuple[int, float]:
    """Read every bench topic from the start to its current end; (records, seconds)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, fetch_max_bytes=16 * 1024 * 1024,
                                max_partition_fetch_bytes=4 * 1024 * 1024)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for topic, count in REPLAY_TOPICS.items()
               for p in range(count)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.seek_to_beginning(*tps)
        count = 0
        began = time.perf_counter()
        remaining = {tp for tp, end in ends.items() if end > 0}
        while remaining:
            batches = await consumer.getmany(*remaining, timeout_ms=500, max_records=5000)
            for tp, records in batches.items():
                for record in records:
                    on_record(record)
                count += len(records)
                if records and records[-1].offset >= ends[tp] - 1:
                    remaining.discard(tp)
        return count, time.perf_counter() - began
    finally:
        await consumer.stop()


def replay_models() -> list[ReadModel]:
    """The registry, invocations and audit read models, reading the bench topics."""
    return [replace(registry_model(), topics=(REGISTRY_TOPIC,)),
            replace(invocations_model(), topics=(INVOCATIONS_TOPIC,)),
            AuditModel((REGISTRY_TOPIC, INVOCATIONS_TOPIC))]


async def rebuild_all(bootstrap: str, database: Path
                      ) -> tuple[list[RebuildReport], float, float]:
    """Rebuild every replay model into a fresh SQLite store; (reports, wall seconds, CPU
    seconds of this process)."""
    engine = make_engine(f"sqlite:///{database}")
    try:
        await migrate(engine)
        began, cpu = time.perf_counter(), time.process_time()
        reports = await rebuild_together(engine, replay_models(), bootstrap)
        return reports, time.perf_counter() - began, time.process_time() - cpu
    finally:
        await engine.dispose()


async def replay(bootstrap: str, root: Path, *, events: int) -> ScenarioResult:
    """Scenario 5."""
    written = await write_log(bootstrap, root, events)
    raw_count, raw_seconds = await read_log(bootstrap, lambda record: None)
    reports, seconds, cpu = await rebuild_all(bootstrap, root / "replay.sqlite3")
    raw_rate, rate = raw_count / raw_seconds, written / seconds
    figures: dict[str, Figure] = {
        "rebuild events/s": round(rate, 1), "raw aiokafka events/s": round(raw_rate, 1),
        "ratio": round(rate / raw_rate, 4), "events": written,
        "rebuild seconds": round(seconds, 3),
        "rebuild CPU us/event": round(cpu / written * 1e6, 1),
        "CPU-bound ceiling events/s": round(written / cpu, 1) if cpu else 0.0,
    }
    for report in reports:
        figures[f"{report.name} records/s"] = round(report.events_per_second, 1)
    figures["undecodable"] = sum(r.undecodable for r in reports)
    notes = ["rebuild = projections.rebuild_together of registry, invocations and audit "
             "(one pass over the log) into one SQLite file; events/s = log events / rebuild "
             "time"]
    notes.append("CPU-bound ceiling = events / CPU seconds of the rebuild (this process, "
                 "all threads): the rate with a core to itself")
    return ScenarioResult("replay", "5. replay (SQL rebuild vs raw consume)", figures,
                          f">= {REPLAY_TARGET:,.0f} events/s into SQLite",
                          rate >= REPLAY_TARGET, notes)
