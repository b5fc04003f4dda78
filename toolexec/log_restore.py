"""Restoring the archive into an empty broker: same topics, records, offsets, commits.

Records are produced in archive order as raw record batches whose offset deltas put
every record at its archived offset, so a log with gaps (offsets lost with a broker
that died, or left out by retention) comes back with the same gaps: a consumer whose
position falls into one moves on to the next record, as on a compacted Kafka topic.
The broker's answer to every batch must be the base offset the archive expects; the
restore stops at the first difference (`RestoreMismatch`) and the broker must not be
used. Each partition's last record goes in a batch of its own: Tansu answers
ListOffsets(latest) with the last batch's base offset + 1.

Consumer groups get their archived commits back (a commit without joining the
group), never past the restored end of their partition.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.protocol.produce import ProduceRequest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c

from toolexec.embedded_broker import ensure_topics
from toolexec.log_archive import ArchivedRecord, Entry, LogArchive, Skip

log = structlog.get_logger(__name__)

MAX_BATCH_RECORDS = 500
MAX_BATCH_BYTES = 256 * 1024
"""Kept well under consumers' max_partition_fetch_bytes (1 MiB by default): Tansu
does not hand out a batch larger than a fetch's byte limit at all."""
PRODUCE_TIMEOUT_MS = 30_000
COMPRESSION_GZIP = 1
"""Restored batches are gzip-compressed (every Kafka client reads gzip): Tansu keeps
batches as they come, so a restored record costs ~110 bytes of its memory instead of
~3 KB when produced one per batch (measured with 650-byte CloudEvents), and a fetch
walks 500 records per stored batch instead of one."""
_LAST_OFFSET_DELTA_AT = 23  # record batch v2: baseOffset(8) length(4) epoch(4) magic(1) crc(4) attributes(2)
_CRC_AT = 17
_CRC_FROM = 21


class RestoreMismatch(RuntimeError):
    """The broker put a restored record at another offset than the archive's."""


@dataclass(frozen=True, slots=True)
class PlannedBatch:
    """Records produced in one request: `base` is the broker's log end before it."""

    base: int
    records: tuple[ArchivedRecord, ...]
    end: int
    """The log end after this batch (last record + 1, or further when a skip follows)."""


@dataclass
class RestoreReport:
    """What a restore put back."""

    topics: dict[str, int] = field(default_factory=dict)
    records: int = 0
    batches: int = 0
    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    groups: int = 0
    clamped_commits: list[str] = field(default_factory=list)
    unrestorable_skips: list[str] = field(default_factory=list)
    seconds: float = 0.0


def plan_batches(entries: Iterable[Entry], *, start_end: int = 0,
                 max_records: int = MAX_BATCH_RECORDS,
                 max_bytes: int = MAX_BATCH_BYTES) -> Iterator[PlannedBatch]:
    """Group one partition's archived entries into batches to produce in order.

    `start_end` is the broker's log end before the first batch (0 for an empty
    partition). Gaps between records come from the records' own offsets; a skip after
    the last record is claimed by the last batch. The last record always travels
    alone. Pure: no I/O.
    """
    records: list[ArchivedRecord] = []
    trailing = 0
    for entry in entries:
        if isinstance(entry, Skip):
            trailing = max(trailing, entry.next_offset)
        else:
            records.append(entry)
            trailing = 0
    if not records:
        return
    chunks: list[list[ArchivedRecord]] = []
    chunk: list[ArchivedRecord] = []
    size = 0
    for record in records[:-1]:
        record_size = _record_size(record)
        if chunk and (len(chunk) >= max_records or size + record_size > max_bytes):
            chunks.append(chunk)
            chunk, size = [], 0
        chunk.append(record)
        size += record_size
    if chunk:
        chunks.append(chunk)
    chunks.append([records[-1]])
    end = start_end
    for index, members in enumerate(chunks):
        batch_end = members[-1].offset + 1
        if index == len(chunks) - 1:
            batch_end = max(batch_end, trailing)
        yield PlannedBatch(end, tuple(members), batch_end)
        end = batch_end


def retention_starts(partitions: Mapping[tuple[str, int], tuple[int | None, int]], *,
                     trim_topics: Iterable[str], retain: int,
                     pinned: Mapping[tuple[str, int], int] | None = None
                     ) -> dict[tuple[str, int], int]:
    """Where each partition's restore begins: the last `retain` offsets of the topics
    that may be trimmed, never past a consumer group's commit (`pinned`, the lowest
    commit per partition), nothing left out elsewhere. `partitions` maps each partition
    to (first archived offset or None, end). Only trimmed partitions are returned. Pure.
    """
    if retain <= 0:
        return {}
    trimmed = set(trim_topics)
    starts: dict[tuple[str, int], int] = {}
    for key, (first, end) in partitions.items():
        if key[0] not in trimmed or first is None:
            continue
        start = max(end - retain, 0)
        if pinned and key in pinned:
            start = min(start, pinned[key])
        if start > first:
            starts[key] = start
    return starts


def _record_size(record: ArchivedRecord) -> int:
    return (len(record.key or b"") + len(record.value or b"") + 32
            + sum(len(name) + len(value or b"") + 8 for name, value in record.headers))


def encode_batch(batch: PlannedBatch) -> bytes:
    """The v2 record batch of `batch`: offset deltas relative to its base, its last
    offset delta covering any claimed gap after the last record."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=COMPRESSION_GZIP, is_transactional=0,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=2**31 - 1)
    for record in batch.records:
        builder.append(record.offset - batch.base, timestamp=record.timestamp, key=record.key,
                       value=record.value, headers=list(record.headers))
    data = bytearray(builder.build())
    claimed = batch.end - 1 - batch.base
    if claimed != batch.records[-1].offset - batch.base:
        struct.pack_into(">i", data, _LAST_OFFSET_DELTA_AT, claimed)
        struct.pack_into(">I", data, _CRC_AT, calc_crc32c(bytes(data[_CRC_FROM:])))
    return bytes(data)


async def restore(archive: LogArchive, bootstrap: str, *,
                  starts: Mapping[tuple[str, int], int] | None = None,
                  client_options: Mapping[str, object] | None = None) -> RestoreReport:
    """Put the archive back into the (empty) broker at `bootstrap`.

    `starts` leaves out each partition's records before the given offset (retention:
    the archive keeps them); the first restored record still lands at its offset.
    Raises `RestoreMismatch` when the broker disagrees about an offset.
    """
    began = time.monotonic()
    options = dict(client_options or {})
    report = RestoreReport(topics=_topic_counts(archive))
    if report.topics:
        await ensure_topics(bootstrap, report.topics, client_options=options)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0,
                                request_timeout_ms=PRODUCE_TIMEOUT_MS, **options)
    await producer.start()
    try:
        await asyncio.gather(*(
            _restore_partition(producer, archive, topic, partition,
                               (starts or {}).get((topic, partition), 0), report)
            for topic, partition in archive.partitions()))
    finally:
        await producer.stop()
    await _restore_groups(archive, bootstrap, report, options)
    report.seconds = time.monotonic() - began
    log.info("log_restore.done", records=report.records, batches=report.batches,
             partitions=len(report.ends), groups=report.groups,
             seconds=round(report.seconds, 3))
    return report


def _topic_counts(archive: LogArchive) -> dict[str, int]:
    counts = dict(archive.topics())
    for topic, partition in archive.partitions():
        counts[topic] = max(counts.get(topic, 0), partition + 1)
    return counts


async def _restore_partition(producer: AIOKafkaProducer, archive: LogArchive, topic: str,
                             partition: int, start: int, report: RestoreReport) -> None:
    tp = TopicPartition(topic, partition)
    entries = list(archive.partition(topic, partition).read(start))
    records = [e for e in entries if isinstance(e, ArchivedRecord)]
    end = 0
    if not records:
        skips = [e.next_offset for e in entries if isinstance(e, Skip)]
        if skips:  # an empty partition cannot claim offsets without a record
            report.unrestorable_skips.append(f"{topic}/{partition}: log end {max(skips)}")
            log.warning("log_restore.skip_without_records", topic=topic, partition=partition,
                        next_offset=max(skips))
        report.ends[(topic, partition)] = 0
        return
    await producer.client._wait_on_metadata(topic)  # noqa: SLF001 - leader lookup
    for batch in plan_batches(entries):
        base = await _produce(producer, tp, encode_batch(batch))
        if base != batch.base:
            raise RestoreMismatch(
                f"{topic}/{partition}: the broker put the batch of offsets "
                f"{batch.records[0].offset}..{batch.records[-1].offset} at base offset "
                f"{base}, the archive expects {batch.base}; was the broker not empty, or "
                "did a client write to it during the restore?")
        report.records += len(batch.records)
        report.batches += 1
        end = batch.end
    report.ends[(topic, partition)] = end


async def _produce(producer: AIOKafkaProducer, tp: TopicPartition, data: bytes) -> int:
    client = producer.client
    request = ProduceRequest(transactional_id=None, required_acks=-1,
                             timeout=PRODUCE_TIMEOUT_MS, topics=[(tp.topic, [(tp.partition, data)])])
    leader = client.cluster.leader_for_partition(tp)
    if leader is None or leader == -1:
        await client.force_metadata_update()
        leader = client.cluster.leader_for_partition(tp)
    response = await client.send(leader, request)
    for _topic, partitions in response.topics:
        for answer in partitions:
            partition, error_code, offset = answer[0], answer[1], answer[2]
            if partition == tp.partition:
                if error_code != 0:
                    raise RestoreMismatch(f"{tp.topic}/{tp.partition}: the broker refused a "
                                          f"restored batch (error code {error_code})")
                return int(offset)
    raise RestoreMismatch(f"{tp.topic}/{tp.partition}: no answer for a restored batch")


async def _restore_groups(archive: LogArchive, bootstrap: str, report: RestoreReport,
                          options: Mapping[str, object]) -> None:
    for group, offsets in sorted(archive.groups().items()):
        commits: dict[TopicPartition, int] = {}
        for (topic, partition), offset in offsets.items():
            end = report.ends.get((topic, partition))
            if end is None:
                continue  # a partition the archive has no record of
            if offset > end:
                report.clamped_commits.append(f"{group} {topic}/{partition}: {offset} -> {end}")
                log.warning("log_restore.commit_past_end", group=group, topic=topic,
                            partition=partition, committed=offset, restored_end=end)
                offset = end
            commits[TopicPartition(topic, partition)] = offset
        if not commits:
            continue
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                    enable_auto_commit=False, **dict(options))
        await consumer.start()
        try:
            consumer.assign(list(commits))
            await consumer.commit(commits)  # no join: the group's members are not here yet
        finally:
            await consumer.stop()
        report.groups += 1
