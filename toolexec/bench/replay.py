"""Scenario 5 of `toolexec bench`: rebuilding read models from a log vs consuming it raw.

Writes a log of N CloudEvents (a few hundred tool publications on a registry topic,
the rest complete invocation lifecycles: each request on a 4-partition requests topic,
its five facts on a 4-partition invocations topic, keyed by invocation id and signed
as the pipeline writes them) to bench-only topics on the bench's broker, then reads it from
the start: raw with one aiokafka consumer (the baseline), and folded into the
registry, invocations and audit read models (`projections.rebuild_together`, as
`toolexec projections rebuild` does, the facts' signatures checked) — into SQLite and into PostgreSQL (pgserver),
each sequentially (one process) and in parallel (one worker process per core). Then
`audit verify` and the replay's bulk path read the rebuilt trail back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from consumers.runtime.recovery import RESUME_HEADER
from consumers.steps.derived_events import derive
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
from contracts.fact_signature import FactSigner, FactVerifier, batch_link, forget_checked
from contracts.kafka_binding import KafkaRecord, encode
from domain.model import ResolvedChain, ToolSource
from projections.audit import AuditModel, AuditQuery, audit_documents, verify_audit
from projections.database import make_engine, migrate
from projections.invocations import invocations_model
from projections.rebuild import RebuildReport, default_workers, rebuild_together
from projections.registry_table import registry_model
from projections.store import ReadModel
from toolexec.bench.env import SCRIPT_PARAMS, bench_sources, script_chain, write_bench_tools
from toolexec.bench.report import Figure, ScenarioResult
from toolexec.embedded_broker import ensure_topics
from toolexec.local_postgres import pgserver_installed, start_pgserver
from toolexec.publishing import publish_event

REGISTRY_TOPIC = "bench.replay.registry"
REQUESTS_TOPIC = "bench.replay.requests"
INVOCATIONS_TOPIC = "bench.replay.invocations"
REPLAY_TOPICS = {REGISTRY_TOPIC: 1, REQUESTS_TOPIC: 4, INVOCATIONS_TOPIC: 4}
REPLAY_TARGET = 25_000.0
PUBLICATIONS_PER_10K = 30
LIFECYCLE_EVENTS = 6
SEND_WINDOW = 2000
FACT_BATCHES = (3, 2)
"""How the pipeline appends (and signs) an invocation's five facts: resolution,
decision and execution start together, then execution end and completion."""


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


def log_records(root: Path, total: int,
                signer: FactSigner | None = None) -> Iterator[tuple[str, KafkaRecord]]:
    """(topic, record) pairs of a log of about `total` events; the facts signed by
    `signer` (a fresh key when None) in the pipeline's batches, each with a resume
    header, as the pipeline appends them."""
    signer = signer or FactSigner(Ed25519PrivateKey.generate())
    tools_dir = write_bench_tools(root, "127.0.0.1:9")
    now = datetime.now(UTC)
    published = publications(bench_sources(tools_dir), max(1, total * PUBLICATIONS_PER_10K
                                                            // 10_000), now)
    for event in published:
        yield REGISTRY_TOPIC, encode(event)
    chain = script_chain(tools_dir)
    last_batch: dict[int, str] = {}  # per partition, as the pipeline links its batches
    for number in range(max(0, total - len(published)) // LIFECYCLE_EVENTS):
        request, *facts = lifecycle(chain, now)
        yield REQUESTS_TOPIC, encode(request)
        resume = (RESUME_HEADER, f"{number // 4} {number // 4}".encode("ascii"))
        for size in FACT_BATCHES:
            batch, facts = facts[:size], facts[size:]
            records = [replace(record, headers=[*record.headers, resume])
                       for record in map(encode, batch)]
            partition = _partition_of(records[0].key)
            signed = signer.sign(records, after=last_batch.get(partition))
            last_batch[partition] = batch_link(signed[-1].headers[-3:])
            for record in signed:
                yield INVOCATIONS_TOPIC, record


def _partition_of(key: bytes) -> int:
    """The invocations partition the producer's default partitioner gives `key`."""
    return DefaultPartitioner()(key, list(range(REPLAY_TOPICS[INVOCATIONS_TOPIC])), [])


async def write_log(bootstrap: str, root: Path, total: int, signer: FactSigner) -> int:
    """Produce the log (facts signed by `signer`); returns how many records were
    written."""
    await ensure_topics(bootstrap, REPLAY_TOPICS)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5,
                                max_batch_size=512 * 1024, max_request_size=2 * 1024 * 1024)
    await producer.start()
    written = 0
    try:
        pending: list[asyncio.Future[Any]] = []
        for topic, record in log_records(root, total, signer):
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
    """Read every bench topic from the start to its end; (records, seconds).

    The end is each partition's high watermark as its fetches report it, not
    `end_offsets`: Tansu 0.6 answers ListOffsets with less than the high watermark of
    a partition written in batches of several records."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, fetch_max_bytes=16 * 1024 * 1024,
                                max_partition_fetch_bytes=4 * 1024 * 1024)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for topic, count in REPLAY_TOPICS.items()
               for p in range(count)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        count = 0
        began = time.perf_counter()
        remaining = set(tps)
        while remaining:
            batches = await consumer.getmany(timeout_ms=500, max_records=5000)
            for records in batches.values():
                for record in records:
                    on_record(record)
                count += len(records)
            remaining = {tp for tp in remaining if not await _at_end(consumer, tp)}
        return count, time.perf_counter() - began
    finally:
        await consumer.stop()


async def _at_end(consumer: AIOKafkaConsumer, tp: TopicPartition) -> bool:
    """Whether `consumer` has read `tp` up to the high watermark of its last fetch."""
    high = consumer.highwater(tp)
    return high is not None and await consumer.position(tp) >= high


def replay_models() -> list[ReadModel]:
    """The registry, invocations and audit read models, reading the bench topics."""
    return [replace(registry_model(), topics=(REGISTRY_TOPIC,)),
            replace(invocations_model(), topics=(REQUESTS_TOPIC, INVOCATIONS_TOPIC)),
            AuditModel(tuple(REPLAY_TOPICS))]


@dataclass(frozen=True)
class StoreRun:
    """One rebuild of the replay models into one store, and the trail read back."""

    reports: list[RebuildReport]
    seconds: float
    cpu_seconds: float
    digest: str


async def rebuild_into(engine: AsyncEngine, bootstrap: str, workers: int,
                       verifier: FactVerifier) -> StoreRun:
    """Rebuild every replay model into `engine` with `workers` processes, the facts
    checked by `verifier`; the CPU is this process's and the workers' (the database
    server's is not counted)."""
    cpu = time.process_time()
    began = time.perf_counter()
    reports = await rebuild_together(engine, replay_models(), bootstrap, workers=workers,
                                     verifier=verifier, signed_topics=(INVOCATIONS_TOPIC,))
    seconds = time.perf_counter() - began
    own = time.process_time() - cpu
    in_workers = reports[0].cpu_seconds if reports[0].workers > 1 else 0.0
    return StoreRun(reports, seconds, own + in_workers, await tables_digest(engine))


async def tables_digest(engine: AsyncEngine) -> str:
    """sha256 over every row of the replay models' tables in key order: equal digests,
    identical rebuilds."""
    digest = hashlib.sha256()
    async with engine.connect() as conn:
        for model in replay_models():
            for table in model.tables:
                result = await conn.stream(select(table).order_by(*table.primary_key.columns)
                                           .execution_options(yield_per=5000))
                async for rows in result.partitions():
                    for row in rows:
                        digest.update(repr(tuple(row)).encode())
    return digest.hexdigest()


async def read_back(engine: AsyncEngine) -> tuple[float, float, bool]:
    """(audit verify records/s, audit replay records/s, verified) of the rebuilt trail."""
    async with engine.connect() as conn:
        began = time.perf_counter()
        verified = await verify_audit(conn)
        verify_rate = verified.records / (time.perf_counter() - began)
        began, count = time.perf_counter(), 0
        sink = io.StringIO()
        async for documents in audit_documents(conn, AuditQuery()):
            sink.write("\n".join(documents) + "\n")
            count += len(documents)
            sink.seek(0)
            sink.truncate()
        replay_rate = count / (time.perf_counter() - began)
    return verify_rate, replay_rate, verified.ok


@contextlib.asynccontextmanager
async def store(kind: str, root: Path) -> AsyncIterator[AsyncEngine | None]:
    """A fresh, migrated store: a SQLite file, or a PostgreSQL server started by
    pgserver (None when pgserver is not installed)."""
    server = None
    if kind == "sqlite":
        url = f"sqlite:///{root / 'replay.sqlite3'}"
    else:
        if not pgserver_installed():
            yield None
            return
        server = await asyncio.to_thread(start_pgserver, root / "replay-pg")
        url = server.get_uri()
    engine = make_engine(url)
    try:
        await migrate(engine)
        yield engine
    finally:
        await engine.dispose()
        if server is not None:
            await asyncio.to_thread(server.cleanup)


async def measure_store(kind: str, root: Path, bootstrap: str, events: int, raw_rate: float,
                        workers: int, verifier: FactVerifier
                        ) -> tuple[dict[str, Figure], float | None, list[str]]:
    """The figures of one store: sequential and parallel rebuilds, verify and replay;
    also the parallel rate (None when the store is not available)."""
    async with store(kind, root) as engine:
        if engine is None:
            return {}, None, [f"{kind}: skipped, pgserver is not installed "
                              "(pip install -e '.[test]')"]
        sequential = await rebuild_into(engine, bootstrap, 1, verifier)
        parallel = await rebuild_into(engine, bootstrap, workers, verifier)
        verify_rate, replay_rate, verified = await read_back(engine)
    figures: dict[str, Figure] = {}
    for label, run in (("sequential", sequential), (f"parallel ({workers} workers)", parallel)):
        rate = events / run.seconds
        figures[f"{kind} {label} events/s"] = round(rate, 1)
        figures[f"{kind} {label} ratio"] = round(rate / raw_rate, 4) if raw_rate else 0.0
        figures[f"{kind} {label} CPU us/event"] = round(run.cpu_seconds / events * 1e6, 1)
    figures[f"{kind} parallel rows identical to sequential"] = (
        "yes" if parallel.digest == sequential.digest else "NO")
    figures[f"{kind} audit verify records/s"] = round(verify_rate, 1)
    figures[f"{kind} audit replay records/s"] = round(replay_rate, 1)
    figures[f"{kind} audit verified"] = "yes" if verified else "NO"
    figures[f"{kind} undecodable"] = sum(r.undecodable for r in parallel.reports)
    figures[f"{kind} facts untrusted"] = parallel.reports[0].untrusted
    return figures, events / parallel.seconds, []


async def replay(bootstrap: str, root: Path, *, events: int,
                 workers: int | None = None) -> ScenarioResult:
    """Scenario 5."""
    workers = workers or default_workers()
    signer = FactSigner(Ed25519PrivateKey.generate())
    written = await write_log(bootstrap, root, events, signer)
    forget_checked()  # the rebuilds check the signatures as a reader that signed none
    raw_count, raw_seconds = await read_log(bootstrap, lambda record: None)
    raw_rate = raw_count / raw_seconds
    figures: dict[str, Figure] = {"events": written, "raw aiokafka events/s": round(raw_rate, 1),
                                  "workers": workers}
    rates: dict[str, float | None] = {}
    notes: list[str] = []
    for kind in ("sqlite", "postgresql"):
        found, rates[kind], skipped = await measure_store(kind, root, bootstrap, written,
                                                          raw_rate, workers,
                                                          FactVerifier([signer.public_key]))
        figures.update(found)
        notes.extend(skipped)
    headline = rates["sqlite"] or 0.0
    figures["rebuild events/s"] = round(headline, 1)
    figures["ratio"] = round(headline / raw_rate, 4) if raw_rate else 0.0
    notes += ["rebuild = projections.rebuild_together of registry, invocations and audit "
              "(as `toolexec projections rebuild`, the facts' signatures checked); events/s = log events / wall time of "
              "the rebuild, worker start included; 'rebuild events/s' is SQLite, parallel",
              "CPU us/event = CPU of the rebuild's processes (this one and its workers; not "
              "the broker's nor PostgreSQL's) per event",
              "raw = one aiokafka consumer reading every partition, records dropped"]
    judged = [rate for rate in rates.values() if rate is not None]
    holds = (all(rate >= REPLAY_TARGET for rate in judged)
             if len(judged) == len(rates) else None)
    return ScenarioResult("replay", "5. replay (rebuild into SQLite and PostgreSQL vs raw "
                          "consume)", figures,
                          f">= {REPLAY_TARGET:,.0f} events/s into SQLite and PostgreSQL",
                          holds, notes)
