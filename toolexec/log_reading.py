"""Reading a log up to given end offsets, as decoded events (undecodable records are
skipped: whoever reads this way counts or looks up events, it does not judge records)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiokafka import TopicPartition

from contracts.envelope import Envelope
from contracts.kafka_binding import UndecodableRecord, decode


async def at_end(consumer: Any, ends: Mapping[TopicPartition, int]) -> bool:
    """Whether `consumer` has read every partition of `ends` up to its end offset."""
    for partition, end in ends.items():
        if await consumer.position(partition) < end:
            return False
    return True


async def events_to(consumer: Any, ends: Mapping[TopicPartition, int], *,
                    timeout_ms: int = 200) -> AsyncIterator[Envelope]:
    """The events `consumer` (an aiokafka consumer) reads until it reaches `ends`."""
    while not await at_end(consumer, ends):
        batches = await consumer.getmany(timeout_ms=timeout_ms)
        for records in batches.values():
            for record in records:
                try:
                    yield decode(record.key, record.value, record.headers)
                except UndecodableRecord:
                    continue
