"""Rebuild: drop read models' rows and positions, replay their topics from offset 0.

The replay stops at the log end seen when it began; records arriving later are left
to the incremental runner. It writes rows and offsets batch by batch exactly as the
runner does (with the models' rebuild copies, which keep what they own in memory), so
an interrupted rebuild is finished by the runner. Secondary indexes of the rebuilt
tables are dropped first and built once at the end (cheaper than maintaining them row
by row); `restore_indexes` puts back any that an interrupted rebuild left out.

With `workers` > 1 the partitions are shared among worker processes
(`rebuild_plan`): invocations partitions are independent and audit chains are per
partition, so the rows are the same as those of a one-process rebuild. Rebuild while a
runner of the same read model is live is safe (the offsets' optimistic check makes one
of them back off) but wasteful: stop `toolexec up` first for a clean measurement.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from sqlalchemy import Connection, Index, Table, delete
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts.fact_signature import FactVerifier
from projections.catalog import co_partitioned_topics
from projections.kafka_connection import portable_client_options
from projections.log_identity import LogIdentity, record_cluster
from projections.rebuild_plan import Place, assign_units, rebuild_units
from projections.rebuild_workers import (
    RebuildShare,
    ShareResult,
    WorkerFailed,
    Workers,
    run_share,
)
from projections.runner import FETCH_OPTIONS, ArchivedLog
from projections.sqlite_pages import secure_delete, zero_free_pages
from projections.store import ReadModel
from projections.tables import metadata, projection_applied, projection_offsets

log = structlog.get_logger(__name__)

BATCH_SIZE = 5000
"""Records per transaction of a rebuild (larger than the incremental runner's: fewer
statements and commits per record, nobody waits for a rebuild's first rows; 5,000
instead of 2,000 took SQLite's writing from 12.8-14.1 to 11.0-11.9 µs per event)."""

Progress = Callable[[int, int], None]
"""Called after each batch with (records done, records in total)."""


def default_workers() -> int:
    """One worker per core."""
    return max(os.cpu_count() or 1, 1)


@dataclass(frozen=True, slots=True)
class RebuildReport:
    """What one rebuild did for one read model."""

    name: str
    records: int
    applied: int
    undecodable: int
    seconds: float
    workers: int = 1
    duplicates: int = 0
    cpu_seconds: float = 0.0
    """CPU seconds of every process of the rebuild (shared by the models rebuilt)."""
    untrusted: int = 0
    """Facts of the signed topics whose signature did not verify (shared likewise)."""

    @property
    def events_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


async def reset(engine: AsyncEngine, model: ReadModel) -> None:
    """Delete every row of `model`, its applied event ids and its stored offsets (one
    transaction; on SQLite the freed pages are not zeroed: `projections.sqlite_pages`)."""
    async with engine.begin() as conn, secure_delete(conn, "FAST"):
        for table in reversed(model.tables):
            await conn.execute(delete(table))
        await conn.execute(delete(projection_applied)
                           .where(projection_applied.c.consumer == model.name))
        await conn.execute(delete(projection_offsets)
                           .where(projection_offsets.c.consumer == model.name))


async def rebuild(engine: AsyncEngine, model: ReadModel, bootstrap: str, *,
                  consumer_options: Mapping[str, Any] | None = None,
                  client_options: Mapping[str, Any] | None = None,
                  progress: Progress | None = None, batch_size: int = BATCH_SIZE,
                  workers: int = 1, archive: ArchivedLog | None = None,
                  verifier: FactVerifier | None = None,
                  signed_topics: Sequence[str] = ()) -> RebuildReport:
    """Reset `model` and replay its topics up to the current log end."""
    reports = await rebuild_together(engine, [model], bootstrap,
                                     consumer_options=consumer_options,
                                     client_options=client_options, progress=progress,
                                     batch_size=batch_size, workers=workers, archive=archive,
                                     verifier=verifier, signed_topics=signed_topics)
    return reports[0]


async def rebuild_together(engine: AsyncEngine, models: Sequence[ReadModel], bootstrap: str, *,
                           consumer_options: Mapping[str, Any] | None = None,
                           client_options: Mapping[str, Any] | None = None,
                           progress: Progress | None = None, batch_size: int = BATCH_SIZE,
                           workers: int = 1,
                           archive: ArchivedLog | None = None,
                           verifier: FactVerifier | None = None,
                           signed_topics: Sequence[str] = ()) -> list[RebuildReport]:
    """Reset `models` and replay their topics up to the current log end in one pass:
    each record is fetched and decoded once, whichever models read it; with `workers`
    > 1 in that many processes at most, each reading its own partitions. The reports
    share the pass's seconds. `archive` holds the records the broker no longer has
    (the embedded log's retention): a log partly in the archive is replayed by one
    process, which reads the archive first. `client_options` are the connection
    options (`settings.kafka_client_options`) of every client, workers' included. With
    `verifier`, the records of `signed_topics` are checked as the live runner checks
    them."""
    options = dict(consumer_options or {})
    connection = dict(client_options or {})
    sizes, ends = await _log_extent(bootstrap, {t for m in models for t in m.topics}, options,
                                    archive, connection)
    total = sum(sizes.values())
    archived = archive is not None and any(
        archive.retained_from(topic, partition) > 0 for topic, partition in sizes)
    shares = assign_units(rebuild_units(sizes, [co_partitioned_topics(m) for m in models]),
                          sizes, 1 if archived else max(workers, 1))
    # Started first, held until the models are reset: their start overlaps with it.
    pool = (Workers(_jobs(engine, models, bootstrap, shares, ends, options, connection,
                          batch_size, verifier, tuple(signed_topics)))
            if len(shares) > 1 else None)
    if pool is not None:
        pool.start()
    tables = [table for model in models for table in model.tables]
    try:
        await _drop_indexes(engine, tables)  # first: deleting rows then maintains none
        for model in models:
            await reset(engine, model)
        await _record_log(engine, models, bootstrap, options, connection)
    except BaseException:
        if pool is not None:
            await pool.stop()
        raise
    started = time.perf_counter()
    if progress is not None:
        progress(0, total)
    try:
        if pool is not None:
            try:
                results = await pool.run(None if progress is None
                                         else lambda done: progress(done, total))
            except WorkerFailed as failure:
                if failure.kind != "MisalignedPartitions":
                    raise
                log.warning("rebuild.misaligned_partitions", error=str(failure))
                for model in models:  # rows of one aggregate are in several partitions
                    await reset(engine, model)
                shares = [sorted(sizes)]
                results = []
        if len(shares) <= 1:
            results = [await run_share(
                engine, models, bootstrap, partitions=None, ends=ends,
                consumer_options=options, client_options=connection, batch_size=batch_size,
                archive=archive, verifier=verifier, signed_topics=signed_topics,
                progress=None if progress is None else lambda done: progress(done, total))]
    finally:
        await restore_indexes(engine, tables)
    zeroed = await zero_free_pages(engine)  # what the reset freed and the replay left
    if zeroed:
        log.info("rebuild.free_pages_zeroed", pages=zeroed)
    seconds = time.perf_counter() - started
    return _reports(models, results, seconds, len(shares))


async def _record_log(engine: AsyncEngine, models: Sequence[ReadModel], bootstrap: str,
                      options: Mapping[str, Any], connection: Mapping[str, Any]) -> None:
    """Remember which cluster's log the rebuilt models fold (once, before the workers
    start: they do not check the log's identity themselves)."""
    identity = LogIdentity(bootstrap, {**{k: v for k, v in options.items()
                                          if k not in FETCH_OPTIONS}, **connection})
    try:
        cluster = await identity.cluster_id()
    finally:
        await identity.close()
    await record_cluster(engine, [m.name for m in models], cluster)


def _jobs(engine: AsyncEngine, models: Sequence[ReadModel], bootstrap: str,
          shares: list[list[Place]], ends: Mapping[Place, int], options: dict[str, Any],
          connection: Mapping[str, Any], batch_size: int, verifier: FactVerifier | None,
          signed_topics: tuple[str, ...]) -> list[RebuildShare]:
    url = engine.url.render_as_string(hide_password=False)
    return [RebuildShare(index=i, database_url=url, bootstrap=bootstrap,
                         models=tuple((m.name, tuple(m.topics)) for m in models),
                         partitions=tuple(share),
                         ends=tuple((place, ends[place]) for place in share if place in ends),
                         consumer_options=options,
                         client_options=portable_client_options(connection),
                         batch_size=batch_size,
                         fact_keys=None if verifier is None else verifier.raw_keys(),
                         signed_topics=signed_topics)
            for i, share in enumerate(shares)]


def _reports(models: Sequence[ReadModel], results: Sequence[ShareResult], seconds: float,
             workers: int) -> list[RebuildReport]:
    cpu = sum(r.cpu_seconds for r in results)
    untrusted = sum(r.untrusted for r in results)
    reports = []
    for model in models:
        counts = [r.per_model.get(model.name, (0, 0, 0, 0)) for r in results]
        reports.append(RebuildReport(
            model.name, records=sum(c[0] for c in counts), applied=sum(c[1] for c in counts),
            undecodable=sum(c[2] for c in counts), seconds=seconds, workers=workers,
            duplicates=sum(c[3] for c in counts), cpu_seconds=cpu, untrusted=untrusted))
    return reports


async def _log_extent(bootstrap: str, topics: set[str], options: Mapping[str, Any],
                      archive: ArchivedLog | None = None,
                      connection: Mapping[str, Any] | None = None,
                      ) -> tuple[dict[Place, int], dict[Place, int]]:
    """(records per partition, end offset per partition) of `topics` now; a partition
    the archive holds earlier records of counts from its start."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False,
                                **{k: v for k, v in options.items()
                                   if k in ("request_timeout_ms", "metadata_max_age_ms")},
                                **dict(connection or {}))
    await consumer.start()
    try:
        known = await consumer.topics()
        tps = [TopicPartition(t, p) for t in sorted(topics & known)
               for p in sorted(consumer.partitions_for_topic(t) or ())]
        if not tps:
            return {}, {}
        beginnings = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    if archive is not None:
        beginnings = {tp: 0 if archive.retained_from(tp.topic, tp.partition) > 0 else begin
                      for tp, begin in beginnings.items()}
    return ({(tp.topic, tp.partition): max(ends[tp] - beginnings[tp], 0) for tp in tps},
            {(tp.topic, tp.partition): ends[tp] for tp in tps})


# --- secondary indexes -------------------------------------------------------------------

async def _drop_indexes(engine: AsyncEngine, tables: Sequence[Table]) -> None:
    async with engine.begin() as conn, secure_delete(conn, "FAST"):
        await conn.run_sync(_each_index, tables, "drop")


async def restore_indexes(engine: AsyncEngine, tables: Sequence[Table] | None = None) -> None:
    """Create every secondary index of `tables` (all read-model tables) that is missing.
    PostgreSQL builds them at the same time, each in a transaction of its own (on as
    many cores as it has); SQLite, which has one writer, one after the other."""
    chosen = tables or list(metadata.tables.values())
    if engine.dialect.name != "postgresql":
        async with engine.begin() as conn:
            await conn.run_sync(_each_index, chosen, "create")
        return

    async def create(index: Index) -> None:
        async with engine.begin() as conn:
            await conn.run_sync(index.create, checkfirst=True)

    outcomes = await asyncio.gather(*(create(index) for table in chosen
                                      for index in sorted(table.indexes,
                                                          key=lambda i: str(i.name))),
                                    return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


def _each_index(conn: Connection, tables: Sequence[Table], action: str) -> None:
    for table in tables:
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            if action == "drop":
                index.drop(conn, checkfirst=True)
            else:
                index.create(conn, checkfirst=True)
