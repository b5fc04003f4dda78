"""Does a read model follow the log its stored positions came from?

A read model stores, with each partition's next offset, a fingerprint of the record
just before it, and the cluster id of the log it follows. Against the log at hand:

- another cluster id: another log altogether (`foreign`; never rebuilt on its own);
- a stored position past the log's end: the log lost records the model applied
  (a broker restarted without its log), or it is another log;
- another record at that offset, or none (and retention did not remove it): the
  same.

The check reads one record per partition (one fetch for all of them); the runner
makes it at open, when its position is out of the log's range, and every few seconds
while it runs (beside the folding, see `projections.runner`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
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
class IdentityCheck:
    """What one check found: the models that diverged, the cluster the broker serves,
    and the models whose stored cluster is not (yet) that one."""

    divergences: list[Divergence]
    cluster: str | None
    stale: tuple[str, ...]


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

    async def probe_many(self, wanted: Mapping[TopicPartition, int],
                         bounds: Mapping[TopicPartition, tuple[int, int]]
                         ) -> dict[TopicPartition, Probe]:
        """For every partition of `wanted`, its first record at or after the offset
        wanted there (None past the end), its end and its start: one fetch for all of
        them in the usual case, not one per partition."""
        if not wanted:
            return {}
        consumer = await self._started()
        consumer.assign(list(wanted))
        high: dict[TopicPartition, int] = {}
        for tp, offset in wanted.items():
            start, listed = bounds[tp]
            high[tp] = listed
            # Tansu may answer ListOffsets(latest) short of the end; a fetch tells the truth.
            consumer.seek(tp, min(offset, max(listed - 1, 0)))
        found: dict[TopicPartition, ConsumerRecord] = {}
        open_ = set(wanted)
        deadline = time.monotonic() + PROBE_SECONDS
        try:
            while open_ and time.monotonic() < deadline:
                fetched = await consumer.getmany(*open_, timeout_ms=200)
                for tp in sorted(open_, key=lambda t: (t.topic, t.partition)):
                    high[tp] = max(high[tp], consumer.highwater(tp) or 0)
                    hit = next((r for r in fetched.get(tp, []) if r.offset >= wanted[tp]), None)
                    if hit is not None:
                        found[tp] = hit
                    elif consumer.highwater(tp) is None or \
                            await consumer.position(tp) < high[tp]:
                        continue
                    open_.discard(tp)
                    consumer.pause(tp)
        finally:
            consumer.pause(*wanted)  # no fetching between checks (the next one assigns anew)
        return {tp: Probe(found.get(tp), high[tp], bounds[tp][0]) for tp in wanted}

    async def check(self, engine: AsyncEngine, models: Sequence[ReadModel],
                    partitions: Collection[TopicPartition]) -> IdentityCheck:
        """Every model whose stored positions do not match this log. Safe while the
        models fold: the stored positions are read before the log's bounds, and a
        record a model applied stays at its offset in the log it follows."""
        names = [m.name for m in models]
        stored = await stored_positions_of(engine, names)
        sources = await stored_clusters(engine, names)
        cluster = await self.cluster_id()
        bounds = await self.bounds(partitions)
        probes = await self._probes(stored.values(), partitions, bounds)
        found: list[Divergence] = []
        for name in names:
            positions = stored.get(name, {})
            if not any(offset > 0 for offset, _ in positions.values()):
                continue  # nothing applied yet: any log will do
            source = sources.get(name)
            if source and cluster and source != cluster:
                found.append(Divergence(name, f"its rows come from the log of cluster "
                                        f"{source!r}; the broker serves cluster {cluster!r}",
                                        foreign=True))
                continue
            reason = self._position_mismatch(positions, partitions, probes)
            if reason is not None and not source:
                # Rows from before log identities were kept: which log they came from
                # is unknown, so they are not replaced on a guess.
                found.append(Divergence(name, f"{reason}; its rows predate log identity "
                                        "checks (run `toolexec projections rebuild` to fold "
                                        "this log instead)", foreign=True))
            elif reason is not None:
                found.append(Divergence(name, reason))
        stale = tuple(name for name in names if sources.get(name) != cluster)
        return IdentityCheck(found, cluster, stale)

    def _archived(self, topic: str, partition: int, offset: int) -> bool:
        return self._archive is not None and \
            offset < self._archive.retained_from(topic, partition)

    async def _probes(self, stored: Iterable[Mapping[tuple[str, int], tuple[int, str | None]]],
                      partitions: Collection[TopicPartition],
                      bounds: Mapping[TopicPartition, tuple[int, int]]
                      ) -> dict[tuple[TopicPartition, int], Probe]:
        """Every (partition, offset) the models' last applied records are at, probed:
        models of one runner usually share their positions, so one round."""
        wanted: set[tuple[TopicPartition, int]] = set()
        for positions in stored:
            for (topic, partition), (next_offset, _) in positions.items():
                tp = TopicPartition(topic, partition)
                if next_offset > 0 and tp in partitions and \
                        not self._archived(topic, partition, next_offset - 1):
                    wanted.add((tp, next_offset - 1))
        done: dict[tuple[TopicPartition, int], Probe] = {}
        while wanted:
            round_: dict[TopicPartition, int] = {}
            for tp, offset in sorted(wanted, key=lambda w: (w[0].topic, w[0].partition, w[1])):
                round_.setdefault(tp, offset)
            for tp, probe in (await self.probe_many(round_, bounds)).items():
                done[(tp, round_[tp])] = probe
                wanted.discard((tp, round_[tp]))
        return done

    def _position_mismatch(self, stored: Mapping[tuple[str, int], tuple[int, str | None]],
                           partitions: Collection[TopicPartition],
                           probes: Mapping[tuple[TopicPartition, int], Probe]) -> str | None:
        for (topic, partition), (next_offset, fingerprint) in sorted(stored.items()):
            if next_offset <= 0:
                continue
            tp = TopicPartition(topic, partition)
            if self._archived(topic, partition, next_offset - 1):
                assert self._archive is not None
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
            probe = probes[(tp, next_offset - 1)]
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


async def stored_positions_of(engine: AsyncEngine, consumers: Sequence[str]
                              ) -> dict[str, dict[tuple[str, int], tuple[int, str | None]]]:
    """Each of `consumers`' stored (next offset, fingerprint) by (topic, partition), in
    one read (one snapshot of all of them)."""
    table = projection_offsets
    out: dict[str, dict[tuple[str, int], tuple[int, str | None]]] = {c: {} for c in consumers}
    async with engine.connect() as conn:
        result = await conn.execute(
            select(table.c.consumer, table.c.topic, table.c.partition, table.c.next_offset,
                   table.c.last_record).where(table.c.consumer.in_(list(consumers))))
        for r in result:
            out[r.consumer][(r.topic, r.partition)] = (r.next_offset, r.last_record)
    return out


async def stored_clusters(engine: AsyncEngine, consumers: Sequence[str]) -> dict[str, str | None]:
    """The cluster each of `consumers` follows, as stored (absent: none stored)."""
    async with engine.connect() as conn:
        result = await conn.execute(
            select(projection_sources.c.consumer, projection_sources.c.cluster_id)
            .where(projection_sources.c.consumer.in_(list(consumers))))
        return {r.consumer: r.cluster_id for r in result}


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
