"""Appending an invocation's facts to `toolexec.invocations` with one producer request.

Facts go to the partition of the invocation's request (same number, same key), so a
partition of facts belongs to one owner of requests. Each batch carries the owner's
resume point (`toolexec-resume`, consumers.runtime.partition_progress) while it owns the
partition, and returns once the broker acknowledged every record.

Each batch is signed (contracts.fact_signature): one Ed25519 signature covers the
facts appended together, and links to the batch signed before it for the partition
(whichever invocation's), so a reader of the partition checks a chain of batches with
one verification. Wrapped in `consumers.runtime.delivery.DeliveringFactLog`, a batch
refused while the broker is away is sent again until the broker takes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer

from consumers.runtime.partition_progress import PartitionProgress
from consumers.runtime.recovery import RESUME_HEADER
from contracts import topics
from contracts.envelope import Envelope
from contracts.fact_signature import FactSigner, batch_link
from contracts.kafka_binding import KafkaRecord, encode


@dataclass
class PartitionFactLog:
    """The `FactLog` of the invocations of one requests partition."""

    producer: AIOKafkaProducer
    progress: PartitionProgress
    signer: FactSigner
    observe: Callable[[Envelope], None] | None = None

    async def append(self, events: Sequence[Envelope]) -> None:
        progress = self.progress
        resume = [(RESUME_HEADER, progress.resume_header())] if progress.owned else []
        encoded = [encode(event) for event in events]
        unsigned = [([*record.headers, *resume], record.value) for record in encoded]
        signature = self.signer.batch_headers(unsigned, after=progress.last_signed_batch)
        progress.last_signed_batch = batch_link(signature)
        records = [KafkaRecord(record.key, value, [*headers, *signature])
                   for record, (headers, value) in zip(encoded, unsigned, strict=True)]
        last = await self._send(records)
        self.progress.acknowledged(last)
        if self.observe is not None:
            for event in events:
                self.observe(event)

    async def _send(self, records: Sequence[KafkaRecord]) -> int:
        """Send `records` to the partition; the offset of the last one. Records are
        handed to the producer's accumulator one by one without waiting in between, so
        the facts of every invocation appending to the partition meanwhile share one
        record batch and one produce request."""
        futures = [await self.producer.send(topics.INVOCATIONS, record.value, key=record.key,
                                            partition=self.progress.partition,
                                            headers=record.headers)
                   for record in records]
        return max([(await future).offset for future in futures])
