"""Reading a request back from the log: the authorize step's token after a restart.

The capability token is written once, in `tool.invoke.requested`, and nowhere else.
When the authorize step meets a `tool.chain.resolved` whose request an earlier
consumer of its group consumed (a restart or a rebalance came in between), it reads
the request back here: same partition, below the resolution's offset, event id = the
resolution's causation id. The scan walks backwards in growing windows (the request
is nearly always a few records back) with its own assigned consumer, outside any
consumer group, so it never disturbs the group's positions or commits.

It also tells whether a resolution met again after a restart was decided already:
`find_after` reads forward from the resolution to the end of the log. Misses come in
offset order after a restart, so one forward index per partition (events of the
asked type, from the first miss on) serves them all, each extended by the new tail.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition

from consumers.ports import LogPosition
from contracts.envelope import Envelope
from contracts.kafka_binding import UndecodableRecord, decode, header_type
from domain.bounded import remember

log = structlog.get_logger(__name__)

REQUESTED = "tool.invoke.requested"
FIRST_WINDOW = 64
WINDOW_GROWTH = 4
FETCH_TIMEOUT_MS = 200


@dataclass
class _ForwardIndex:
    """Events of one type seen in offsets [start, end) of one partition."""

    start: int
    end: int
    events: OrderedDict[str, Envelope] = field(default_factory=OrderedDict)


class KafkaRequestLog:
    """`RequestLog` on a Kafka-protocol broker.

    Requests met on the way are kept (bounded, oldest dropped first): after a restart
    many resolutions miss their token at once, and their requests sit close together.
    """

    def __init__(self, bootstrap: str, *, consumer_options: Mapping[str, Any] | None = None,
                 keep: int = 10_000, read_timeout: float = 60.0) -> None:
        self._bootstrap = bootstrap
        self._options = dict(consumer_options or {})
        self._keep = keep
        self._read_timeout = read_timeout
        self._seen: OrderedDict[str, Envelope] = OrderedDict()
        self._consumer: AIOKafkaConsumer | None = None
        self._forward: dict[tuple[TopicPartition, str], _ForwardIndex] = {}
        self._lock = asyncio.Lock()

    async def find(self, before: LogPosition, event_id: str) -> Envelope | None:
        if event_id in self._seen:
            return self._seen.pop(event_id)
        async with self._lock:
            consumer = await self._started()
            tp = TopicPartition(before.topic, before.partition)
            consumer.assign([tp])
            floor = (await consumer.beginning_offsets([tp]))[tp]
            end, window = before.offset, FIRST_WINDOW
            async with asyncio.timeout(self._read_timeout):
                while end > floor:
                    start = max(floor, end - window)
                    found = await self._scan(consumer, tp, start, end, event_id)
                    if found is not None:
                        log.info("request_log.found", event_id=event_id,
                                 partition=before.partition, scanned=before.offset - start)
                        return found
                    end, window = start, window * WINDOW_GROWTH
        log.warning("request_log.missing", event_id=event_id, partition=before.partition,
                    before=before.offset)
        return None

    async def find_after(self, after: LogPosition, event_id: str,
                         event_type: str) -> Envelope | None:
        tp = TopicPartition(after.topic, after.partition)
        async with self._lock:
            index = self._forward.get((tp, event_type))
            if index is None or after.offset + 1 < index.start:
                index = _ForwardIndex(after.offset + 1, after.offset + 1)
                self._forward[(tp, event_type)] = index
            consumer = await self._started()
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            async with asyncio.timeout(self._read_timeout):
                await self._extend(consumer, tp, index, end, event_type)
        return index.events.get(event_id)

    async def _extend(self, consumer: AIOKafkaConsumer, tp: TopicPartition,
                      index: _ForwardIndex, end: int, event_type: str) -> None:
        """Index the events of `event_type` in offsets [index.end, end) of `tp`."""
        if index.end >= end:
            return
        consumer.seek(tp, index.end)
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=FETCH_TIMEOUT_MS)
            for record in batch.get(tp, ()):
                if (not index.end <= record.offset < end
                        or header_type(record.headers) != event_type):
                    continue
                try:
                    event = decode(record.key, record.value, record.headers)
                except UndecodableRecord:
                    continue
                index.events[event.id] = event
                while len(index.events) > self._keep:  # oldest first: a miss decides anew
                    index.events.popitem(last=False)
        index.end = end

    async def _scan(self, consumer: AIOKafkaConsumer, tp: TopicPartition, start: int, end: int,
                    event_id: str) -> Envelope | None:
        """Read offsets [start, end) of `tp`; return the event `event_id` if among them."""
        consumer.seek(tp, start)
        found = None
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=FETCH_TIMEOUT_MS)
            for record in batch.get(tp, ()):
                if not start <= record.offset < end or header_type(record.headers) != REQUESTED:
                    continue
                try:
                    request = decode(record.key, record.value, record.headers)
                except UndecodableRecord:
                    continue
                if request.id == event_id:
                    found = request
                else:
                    self._remember(request)
        return found

    def _remember(self, request: Envelope) -> None:
        remember(self._seen, request.id, request, self._keep)

    async def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, group_id=None,
                                        enable_auto_commit=False, **self._options)
            await consumer.start()
            self._consumer = consumer
        return self._consumer

    async def aclose(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

