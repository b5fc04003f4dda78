"""Reading the whole invocations log back, for tests that count outcomes."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition

from contracts import topics
from contracts.kafka_binding import UndecodableRecord, decode

TERMINAL = ("tool.invoke.completed", "tool.invoke.failed")


async def terminal_event_ids(bootstrap: str, ids: set[str]) -> dict[str, set[str]]:
    """Distinct terminal event ids per invocation in the log (redeliveries of one event
    share its id, so distinct ids are distinct outcomes)."""
    consumer = AIOKafkaConsumer(topics.INVOCATIONS, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest")
    await consumer.start()
    found: dict[str, set[str]] = {}
    try:
        ends = await consumer.end_offsets(list(consumer.assignment()))
        async with asyncio.timeout(60):
            while not await _at_end(consumer, ends):
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    for record in records:
                        try:
                            event = decode(record.key, record.value, record.headers)
                        except UndecodableRecord:
                            continue
                        if event.type in TERMINAL and event.correlationid in ids:
                            found.setdefault(event.correlationid, set()).add(event.id)
    finally:
        await consumer.stop()
    return found


async def _at_end(consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> bool:
    for tp, end in ends.items():
        if await consumer.position(tp) < end:
            return False
    return True
