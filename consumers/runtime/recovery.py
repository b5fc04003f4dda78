"""Reading back where a partition's invocations stand, when the pipeline takes it over.

Runs at start and after every rebalance, for each requests partition assigned, before
any of its requests is handled: the last `toolexec-resume` header of the matching
invocations partition says which requests are finished (below L) and from where
their facts are (F); the facts from F to the end are folded per invocation, so each
request still to run resumes from its last fact (consumers.runtime.partition_progress).

Only facts signed by a trusted pipeline key count (contracts.fact_signature): a fact
anyone else wrote on the topic — say a forged permission decision — is left out, so no
step of a resumed invocation stands on it. The resume point is read from signed facts
only, too. Reads go through one consumer of its own, outside any consumer group, so
they never disturb the group's positions or commits.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from consumers.runtime.invocation_facts import FACT_TYPES, InvocationFacts
from consumers.runtime.partition_progress import ResumePoint
from contracts.fact_signature import FactVerifier, Verdict
from contracts.kafka_binding import UndecodableRecord, decode, header_type

log = structlog.get_logger(__name__)

RESUME_HEADER = "toolexec-resume"
FIRST_WINDOW = 64
WINDOW_GROWTH = 4
FETCH_TIMEOUT_MS = 500


@dataclass
class Recovered:
    """What the log says about one partition when it is taken over."""

    resume_below: int
    """Requests below this offset are finished."""
    end: int
    """End offset of the invocations partition when it was read."""
    facts: dict[str, InvocationFacts] = field(default_factory=dict)
    """Facts from the resume point on, by invocation id (only those signed by a
    trusted pipeline key)."""
    scanned: int = 0
    untrusted: int = 0
    """Facts left out because their signature did not check out."""


def resume_point(headers: object) -> ResumePoint | None:
    """The record's `toolexec-resume` header, if it has a valid one."""
    for name, value in headers or ():  # type: ignore[attr-defined]
        if name == RESUME_HEADER and isinstance(value, bytes | bytearray):
            return ResumePoint.parse(bytes(value))
    return None


class LogReader:
    """Reads partitions of the invocations topic for recovery (assign mode)."""

    def __init__(self, consumer: AIOKafkaConsumer, verifier: FactVerifier, *,
                 read_timeout: float = 120.0) -> None:
        self._consumer = consumer
        self._verifier = verifier
        self._read_timeout = read_timeout
        self._lock = asyncio.Lock()

    async def recover(self, tp: TopicPartition) -> Recovered:
        """Where partition `tp` of the invocations topic says its requests stand."""
        try:
            return await self._recover(tp)
        finally:  # an assigned partition is fetched on and on: stop until the next read
            self._consumer.pause(*self._consumer.assignment())

    async def _recover(self, tp: TopicPartition) -> Recovered:
        async with self._lock, asyncio.timeout(self._read_timeout):
            consumer = self._consumer
            consumer.assign([tp])
            begin = (await consumer.beginning_offsets([tp]))[tp]
            end = await self._end(tp, begin)
            point = await self._last_resume_point(tp, begin, end)
            floor = max(point.facts_floor, begin) if point is not None else begin
            recovered = Recovered(point.low_water if point is not None else 0, end)
            facts: dict[str, InvocationFacts] = defaultdict(InvocationFacts)
            async for record in self._read(tp, floor, end):
                if header_type(record.headers) not in FACT_TYPES:
                    continue
                verdict = self._verifier.verify(record.headers, record.value)
                if verdict is not Verdict.VALID:  # no step stands on a fact we did not sign
                    recovered.untrusted += 1
                    log.warning("pipeline.untrusted_fact", partition=tp.partition,
                                offset=record.offset, verdict=verdict.value)
                    continue
                try:
                    event = decode(record.key, record.value, record.headers)
                except UndecodableRecord:
                    continue
                facts[event.correlationid].add(event)
            recovered.facts = dict(facts)
            recovered.scanned = end - floor
        log.info("pipeline.recovered", partition=tp.partition, resume_below=recovered.resume_below,
                 facts_from=floor, end=end, invocations=len(recovered.facts))
        return recovered

    async def end_offset(self, tp: TopicPartition) -> int:
        """The end offset of any partition (e.g. of the requests topic)."""
        try:
            async with self._lock, asyncio.timeout(self._read_timeout):
                self._consumer.assign([tp])
                begin = (await self._consumer.beginning_offsets([tp]))[tp]
                return await self._end(tp, begin)
        finally:
            self._consumer.pause(*self._consumer.assignment())

    async def _end(self, tp: TopicPartition, begin: int) -> int:
        """The offset after the last record of assigned partition `tp` (lock held).
        Tansu answers ListOffsets(latest) with the last batch's base offset + 1, short
        of the end when that batch holds several records (facts produced together):
        the last batch is fetched and its records and the fetch's high watermark
        give the end."""
        consumer = self._consumer
        listed = (await consumer.end_offsets([tp]))[tp]
        if listed <= begin:
            return listed
        consumer.seek(tp, listed - 1)
        records: list[ConsumerRecord] = []
        while not records:
            records = (await consumer.getmany(tp, timeout_ms=FETCH_TIMEOUT_MS)).get(tp, [])
        return max(listed, records[-1].offset + 1, consumer.highwater(tp) or 0)

    async def _last_resume_point(self, tp: TopicPartition, begin: int,
                                 end: int) -> ResumePoint | None:
        """The resume point of the last record carrying one, scanning back in growing
        windows; None when no record of the partition has one."""
        high, window = end, FIRST_WINDOW
        while high > begin:
            low = max(begin, high - window)
            for record in reversed([r async for r in self._read(tp, low, high)]):
                point = resume_point(record.headers)
                if point is not None and self._verifier.verify(
                        record.headers, record.value) is Verdict.VALID:
                    return point
            high, window = low, window * WINDOW_GROWTH
        return None

    async def _read(self, tp: TopicPartition, start: int,
                    end: int) -> AsyncIterator[ConsumerRecord]:
        """Records of offsets [start, end) of `tp`, in order."""
        if start >= end:
            return
        consumer = self._consumer
        consumer.seek(tp, start)
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=FETCH_TIMEOUT_MS)
            for record in batch.get(tp, ()):
                if start <= record.offset < end:
                    yield record
