"""Where a log ends now, as a process outside `toolexec up` sees it from the broker:
the cluster id and, per partition of some topics, the offset after its last record.

Tansu answers ListOffsets(latest) with the last batch's base offset + 1, short of the
end when that batch holds several records (facts produced together); the last batch
is fetched and its last record gives the end. Not the fetch's high watermark: after a
broker died, a partition's last batch claims a gap of offsets that hold no record
(`toolexec.broker_supervisor`), and a read model's stored position stops at the
record before it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.protocol.metadata import MetadataRequest

FETCH_WAIT_MS = 1
"""The fetch asks for records that are there: a broker holding every fetch for its
whole wait (Tansu) would otherwise make each round cost the wait."""
ROUND_MS = 100


@dataclass(frozen=True, slots=True)
class LogEnds:
    """The log's cluster id (None from brokers without) and, by (topic, partition),
    the offset after its last record (0 for an empty partition)."""

    cluster: str | None
    ends: dict[tuple[str, int], int] = field(default_factory=dict)


async def log_ends(bootstrap: str, topics: Iterable[str], *,
                   client_options: Mapping[str, Any] | None = None) -> LogEnds:
    """The ends of every partition of `topics` now (unbounded: the caller bounds it)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, fetch_max_wait_ms=FETCH_WAIT_MS,
                                **dict(client_options or {}))
    await consumer.start()
    try:
        cluster = await _cluster_id(consumer)
        await consumer.topics()
        partitions = [TopicPartition(topic, p) for topic in topics
                      for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not partitions:
            return LogEnds(cluster)
        starts = await consumer.beginning_offsets(partitions)
        listed = await consumer.end_offsets(partitions)
        last = await _last_records(consumer, {tp: listed[tp] for tp in partitions
                                              if listed[tp] > starts[tp]})
        return LogEnds(cluster, {(tp.topic, tp.partition): max(listed[tp], last.get(tp, 0))
                                 for tp in partitions})
    finally:
        await consumer.stop()


async def _cluster_id(consumer: AIOKafkaConsumer) -> str | None:
    client = consumer._client  # noqa: SLF001 - aiokafka keeps the cluster id to itself
    response = await client.send(client.get_random_node(), MetadataRequest([]))
    return getattr(response, "cluster_id", None)


async def _last_records(consumer: AIOKafkaConsumer,
                        listed: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """The offset after the last record of each partition in `listed` (its listed
    end), read from its last batch."""
    consumer.assign(list(listed))
    for tp, end in listed.items():
        consumer.seek(tp, end - 1)  # the last batch's base offset: a record is there
    found: dict[TopicPartition, int] = {}
    while len(found) < len(listed):
        pending = [tp for tp in listed if tp not in found]
        fetched = await consumer.getmany(*pending, timeout_ms=ROUND_MS)
        for tp, records in fetched.items():
            if records:
                found[tp] = records[-1].offset + 1
    return found
