"""Does a read model follow the log its stored positions came from?

A read model stores, with each partition's next offset, a fingerprint of the record
just before it, and the cluster id of the log it follows. Against the log at hand:

- another cluster id: another log altogether (`foreign`; never rebuilt on its own);
- a stored position past the log's end: the log lost records the model applied
  (a broker restarted without its log), or it is another log;
- another record at that offset, or none (and retention did not remove it): the
  same.

The check reads one record per partition; the runner makes it at open, when its
position is out of the log's range, and every few seconds while it runs.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.protocol.metadata import MetadataRequest
from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from projections.store import ReadModel
from projections.tables import projection_offsets, projection_sources

PROBE_SECONDS = 5.0
PROBE_FETCH_WAIT_MS = 1
"""A probe's fetch asks for a record that is there: a broker that holds every fetch
for its whole wait (Tansu) would otherwise make each probe cost the wait (50 ms per
partition and model once made a check of `up`'s six read models take 5.8 s, during
which the runner folded nothing)."""


class ProjectionDiverged(RuntimeError):
    """A read model's stored positions do not belong to the log it reads."""


@dataclass(frozen=True, slots=True)
class Divergence:
    model: str
    reason: str
    foreign: bool = False
    """Another cluster's log, or a log of unknown origin: refused whatever the policy
    (rebuilding would replace the read model of one log with another's)."""


def record_fingerprint(key: bytes | None, value: bytes | None) -> str:
    """A short digest of a record's key and value (what the read model applied)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(b"k" if key is None else b"K" + len(key).to_bytes(4, "big") + key)
    digest.update(b"v" if value is None else b"V" + value)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Probe:
    """What the log has at an offset: its first record there or after, its end."""

    record: ConsumerRecord | None
    high: int
    start: int


class LogIdentity:
    """Reads the log's identity (cluster id, single records) for the checks."""

    def __init__(self, bootstrap: str, options: Mapping[str, Any] | None = None, *,
                 archive: Any | None = None) -> None:
        self._bootstrap = bootstrap
        self._options = dict(options or {})
        self._archive = archive  # records retention left out of the broker (ArchivedLog)
        self._consumer: AIOKafkaConsumer | None = None

    async def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, group_id=None,
                                        enable_auto_commit=False, auto_offset_reset="none",
                                        fetch_max_wait_ms=PROBE_FETCH_WAIT_MS, **self._options)
            await consumer.start()
            self._consumer = consumer
        return self._consumer

    async def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()

    async def cluster_id(self) -> str | None:
        """The cluster id the broker reports in metadata (None from brokers without)."""
        consumer = await self._started()
        client = consumer._client  # noqa: SLF001 - aiokafka keeps the cluster id to itself
        response = await client.send(client.get_random_node(), MetadataRequest([]))
        return getattr(response, "cluster_id", None)

    async def bounds(self, partitions: Collection[TopicPartition]
                     ) -> dict[TopicPartition, tuple[int, int]]:
        """(start, listed end) of every partition of `partitions`, in two requests."""
        if not partitions:
            return {}
        consumer = await self._started()
        starts = await consumer.beginning_offsets(list(partitions))
        ends = await consumer.end_offsets(list(partitions))
        return {tp: (starts[tp], ends[tp]) for tp in partitions}

    async def probe(self, tp: TopicPartition, offset: int,
                    bounds: tuple[int, int] | None = None) -> Probe:
        """The first record at or after `offset` in `tp` (None past the end) and the
        partition's end and start (`bounds`, when already read: see `bounds`)."""
        consumer = await self._started()
        consumer.assign([tp])
        if bounds is None:
            bounds = (await self.bounds([tp]))[tp]
        start, listed = bounds
        # Tansu may answer ListOffsets(latest) short of the end; a fetch tells the truth.
        consumer.seek(tp, min(offset, max(listed - 1, 0)))
        deadline = time.monotonic() + PROBE_SECONDS
        high = listed
        try:
            while time.monotonic() < deadline:
                fetched = await consumer.getmany(tp, timeout_ms=200, max_records=50)
                high = max(high, consumer.highwater(tp) or 0)
                found = [r for r in fetched.get(tp, []) if r.offset >= offset]
                if found:
                    return Probe(found[0], high, start)
                if consumer.highwater(tp) is not None and await consumer.position(tp) >= high:
                    break
            return Probe(None, high, start)
        finally:
            consumer.pause(tp)  # no fetching between checks (the next probe assigns anew)

    async def check(self, engine: AsyncEngine, models: Sequence[ReadModel],
                    partitions: Collection[TopicPartition]) -> list[Divergence]:
        """Every model whose stored positions do not match this log."""
        cluster = await self.cluster_id()
        found: list[Divergence] = []
        probes = _Probes(self, await self.bounds(partitions))  # shared by the models
        for model in models:
            stored = await stored_positions(engine, model.name)
            if not any(offset > 0 for offset, _ in stored.values()):
                continue  # nothing applied yet: any log will do
            source = await stored_cluster(engine, model.name)
            if source and cluster and source != cluster:
                found.append(Divergence(model.name, f"its rows come from the log of cluster "
                                        f"{source!r}; the broker serves cluster {cluster!r}",
                                        foreign=True))
                continue
            reason = await self._position_mismatch(stored, partitions, probes)
            if reason is not None and not source:
                # Rows from before log identities were kept: which log they came from
                # is unknown, so they are not replaced on a guess.
                found.append(Divergence(model.name, f"{reason}; its rows predate log identity "
                                        "checks (run `toolexec projections rebuild` to fold "
                                        "this log instead)", foreign=True))
            elif reason is not None:
                found.append(Divergence(model.name, reason))
        return found

    async def _position_mismatch(self, stored: Mapping[tuple[str, int], tuple[int, str | None]],
                                 partitions: Collection[TopicPartition],
                                 probes: _Probes) -> str | None:
        for (topic, partition), (next_offset, fingerprint) in sorted(stored.items()):
            if next_offset <= 0:
                continue
            tp = TopicPartition(topic, partition)
            if self._archive is not None and \
                    next_offset - 1 < self._archive.retained_from(topic, partition):
                archived = self._archive.record_at(topic, partition, next_offset - 1)
                if archived is None:
                    return (f"{topic}/{partition}: the record at offset {next_offset - 1} it "
                            "applied is not in the log's archive")
                if fingerprint and record_fingerprint(archived.key, archived.value) != fingerprint:
                    return (f"{topic}/{partition}: the record at offset {next_offset - 1} is "
                            "not the one it applied (another log)")
                continue
            if tp not in partitions:
                return f"{topic}/{partition} holds its position {next_offset} but is not on the broker"
            probe = await probes.at(tp, next_offset - 1)
            if next_offset > probe.high:
                return (f"{topic}/{partition}: its position {next_offset} is past the log's end "
                        f"{probe.high} (the log lost records it applied, or is another log)")
            record = probe.record
            if record is None or record.offset != next_offset - 1:
                if next_offset - 1 < probe.start:
                    continue  # removed by retention: nothing left to compare
                return (f"{topic}/{partition}: the record at offset {next_offset - 1} it applied "
                        "is missing from the log (lost with a broker that died, or another log)")
            if fingerprint and record_fingerprint(record.key, record.value) != fingerprint:
                return (f"{topic}/{partition}: the record at offset {next_offset - 1} is not the "
                        "one it applied (another log)")
        return None


class _Probes:
    """The probes of one check: the read models of a runner hold the same positions in
    the partitions they share, so each (partition, offset) is read once."""

    def __init__(self, identity: LogIdentity,
                 bounds: Mapping[TopicPartition, tuple[int, int]]) -> None:
        self._identity = identity
        self._bounds = bounds
        self._done: dict[tuple[TopicPartition, int], Probe] = {}

    async def at(self, tp: TopicPartition, offset: int) -> Probe:
        probe = self._done.get((tp, offset))
        if probe is None:
            probe = self._done[(tp, offset)] = await self._identity.probe(
                tp, offset, self._bounds.get(tp))
        return probe


async def stored_positions(engine: AsyncEngine,
                           consumer: str) -> dict[tuple[str, int], tuple[int, str | None]]:
    table = projection_offsets
    async with engine.connect() as conn:
        result = await conn.execute(
            select(table.c.topic, table.c.partition, table.c.next_offset, table.c.last_record)
            .where(table.c.consumer == consumer))
        return {(r.topic, r.partition): (r.next_offset, r.last_record) for r in result}


async def stored_cluster(engine: AsyncEngine, consumer: str) -> str | None:
    async with engine.connect() as conn:
        result = await conn.execute(select(projection_sources.c.cluster_id)
                                    .where(projection_sources.c.consumer == consumer))
        return result.scalar_one_or_none()


async def record_cluster(engine: AsyncEngine, consumers: Sequence[str],
                         cluster: str | None) -> None:
    """Remember which cluster's log `consumers` follow (replacing what was stored)."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    async with engine.begin() as conn:
        await conn.execute(delete(projection_sources)
                           .where(projection_sources.c.consumer.in_(list(consumers))))
        await conn.execute(insert(projection_sources), [
            {"consumer": name, "cluster_id": cluster, "updated_at": now} for name in consumers])
