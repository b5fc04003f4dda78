"""Appending an invocation's facts to `toolexec.invocations` with one producer request.

Facts go to the partition of the invocation's request (same number, same key), so a
partition of facts belongs to one owner of requests. Each batch carries the owner's
resume point (`toolexec-resume`, consumers.partition_progress) while it owns the
partition, and returns once the broker acknowledged every record.

Wrapped in `consumers.delivery.DeliveringFactLog`, a batch refused while the broker
is away is sent again until the broker takes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer

from consumers.partition_progress import PartitionProgress
from consumers.recovery import RESUME_HEADER
from contracts import topics
from contracts.envelope import Envelope
from contracts.kafka_binding import KafkaRecord, encode


@dataclass
class PartitionFactLog:
    """The `FactLog` of the invocations of one requests partition."""

    producer: AIOKafkaProducer
    progress: PartitionProgress
    observe: Callable[[Envelope], None] | None = None

    async def append(self, events: Sequence[Envelope]) -> None:
        last = await self._send([encode(event) for event in events])
        self.progress.acknowledged(last)
        if self.observe is not None:
            for event in events:
                self.observe(event)

    async def _send(self, records: Sequence[KafkaRecord]) -> int:
        """Send `records` in as few batches as their size allows; the last offset."""
        progress = self.progress
        extra = [(RESUME_HEADER, progress.resume_header())] if progress.owned else []
        pending: list[tuple[asyncio.Future[object], int]] = []
        batch, count = self.producer.create_batch(), 0
        for record in records:
            headers = [*record.headers, *extra]
            if batch.append(key=record.key, value=record.value, timestamp=None,
                            headers=headers) is None:
                pending.append((await self._submit(batch), count))
                batch, count = self.producer.create_batch(), 0
                if batch.append(key=record.key, value=record.value, timestamp=None,
                                headers=headers) is None:
                    raise ValueError("a fact does not fit in one record batch")
            count += 1
        pending.append((await self._submit(batch), count))
        last = -1
        for future, size in pending:
            metadata = await future
            last = max(last, metadata.offset + size - 1)  # type: ignore[attr-defined]
        return last

    async def _submit(self, batch: object) -> asyncio.Future[object]:
        return await self.producer.send_batch(batch, topics.INVOCATIONS,
                                              partition=self.progress.partition)
