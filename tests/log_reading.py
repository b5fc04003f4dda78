"""Reading the whole invocations log back, for tests that count outcomes, and making
terminal events to put on it (signed as a pipeline signs them, or forged)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from consumers.steps.derived_events import failed
from contracts import topics
from contracts.envelope import Envelope, new_envelope
from contracts.events import InvokeRequested
from contracts.fact_signature import FactSigner, FactVerifier
from contracts.kafka_binding import KafkaRecord, encode, send_event
from domain.errors import ToolexecError
from tests.waiting import WAIT
from toolexec.log_reading import events_to

TERMINAL = ("tool.invoke.completed", "tool.invoke.failed")


async def terminal_event_ids(bootstrap: str, ids: set[str]) -> dict[str, set[str]]:
    """Distinct terminal event ids per invocation in the log (redeliveries of one event
    share its id, so distinct ids are distinct outcomes)."""
    found: dict[str, set[str]] = {}
    for event in await invocation_events(
            bootstrap, lambda e: e.type in TERMINAL and e.correlationid in ids):
        found.setdefault(event.correlationid, set()).add(event.id)
    return found


async def invocation_events(bootstrap: str, wanted: Callable[[Envelope], bool], *,
                            until: Callable[[list[Envelope]], bool] | None = None,
                            timeout: float = 120) -> list[Envelope]:
    """The events of the invocations log that `wanted` keeps, in log order per
    partition, read from the start to the log's end as it is when called, or, given
    `until`, on past it until `until(kept)` holds at the log's end."""
    consumer = AIOKafkaConsumer(topics.INVOCATIONS, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest")
    await consumer.start()
    found: list[Envelope] = []
    try:
        ends = await consumer.end_offsets(list(consumer.assignment()))
        async with asyncio.timeout(timeout):
            while True:
                found.extend([event async for event in events_to(consumer, ends)
                              if wanted(event)])
                if until is None or until(found):
                    return found
                later = await consumer.end_offsets(list(ends))
                if later == ends:  # nothing new yet: look again shortly
                    await asyncio.sleep(0.1)
                ends = later
    finally:
        await consumer.stop()


def terminal_failure(invocation_id: str) -> Envelope:
    """What a pipeline would emit at the end of `invocation_id` (a failure is simplest
    to make)."""
    now = datetime.now(UTC)
    request = new_envelope(InvokeRequested(invocation_id=invocation_id, tool_id="echo",
                                           version_range="*", parameters={}),
                           source="urn:test", partitionkey=invocation_id,
                           correlationid=invocation_id, id=f"req-{invocation_id}", time=now)
    return failed(request, ToolexecError("tool not found", code="E3101"), stage="resolve",
                  invocation_id=invocation_id, tool_id="echo", version=None, now=now)


def pretend_pipeline_key() -> tuple[FactSigner, FactVerifier]:
    """A signing key of a pretend pipeline, and a verifier trusting it."""
    signer = FactSigner(Ed25519PrivateKey.generate())
    return signer, FactVerifier([signer.public_key])


async def put_facts(bootstrap: str, events: list[Envelope], *,
                    signer: FactSigner | None = None, partition: int | None = None) -> None:
    """Produce `events` on their topic as one signed batch (`signer`), or unsigned."""
    records = [encode(event) for event in events]
    if signer is not None:
        records = signer.sign(records)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    await producer.start()
    try:
        for event, record in zip(events, records, strict=True):
            await send_event(producer, event, record=record, partition=partition)
    finally:
        await producer.stop()


async def request_on_the_log(bootstrap: str, invocation_id: str) -> None:
    """Until the request of `invocation_id` is on the requests topic."""
    consumer = AIOKafkaConsumer(topics.REQUESTS, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest", fetch_max_wait_ms=100)
    await consumer.start()
    try:
        async with asyncio.timeout(WAIT):
            async for record in consumer:
                if record.key == invocation_id.encode():
                    return
    finally:
        await consumer.stop()


async def send_as_one_batch(bootstrap: str, topic: str, records: list[KafkaRecord],
                            partition: int = 0) -> None:
    """Produce `records` to `partition` of `topic` as one record batch (as a producer
    sends records produced together)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        batch = producer.create_batch()
        for record in records:
            assert batch.append(key=record.key, value=record.value, timestamp=None,
                                headers=list(record.headers)) is not None
        batch.close()
        await (await producer.send_batch(batch, topic, partition=partition))
    finally:
        await producer.stop()
