"""Kafka clients the project did not write consume the log in a consumer group
(docs/kafka-clients.md): confluent-kafka (librdkafka) and kafka-python, each with the
settings that page gives, read every record toolexec wrote, CloudEvents headers
included."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaProducer

from contracts.envelope import new_envelope
from contracts.events import InvokeRequested
from contracts.kafka_binding import encode
from tests.waiting import WAIT
from toolexec.embedded_broker import ensure_topics

pytestmark = pytest.mark.integration

RECORDS = 6
HANG_GUARD_SECONDS = WAIT  # fails a hanging client; not a performance bound
# The portable settings of docs/kafka-clients.md: accepted by Apache Kafka (whose
# minimum session is 6 s) and joining Tansu in a few seconds instead of ~23 s.
LIBRDKAFKA_GROUP = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 2000,
                    "fetch.wait.max.ms": 100}
KAFKA_PYTHON_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 2000,
                      "fetch_max_wait_ms": 100}


def _requests(prefix: str) -> list:
    now = datetime.now(UTC)
    return [new_envelope(InvokeRequested(invocation_id=f"{prefix}-{n}", tool_id="hello",
                                         parameters={"n": n}),
                         source="urn:test", partitionkey=f"{prefix}-{n}",
                         correlationid=f"{prefix}-{n}", time=now, id=str(uuid.uuid4()))
            for n in range(RECORDS)]


@pytest.fixture
def written(kafka_bootstrap: str, fresh_topic_prefix: str) -> tuple[str, list]:
    """A fresh three-partition topic holding RECORDS encoded invocation requests."""
    topic = f"{fresh_topic_prefix}.requests"
    events = _requests(fresh_topic_prefix)

    async def write() -> None:
        await ensure_topics(kafka_bootstrap, {topic: 3})
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            for event in events:
                record = encode(event)
                await producer.send_and_wait(topic, record.value, key=record.key,
                                             headers=record.headers)
        finally:
            await producer.stop()

    asyncio.run(write())
    return topic, events


def _expected(events: list) -> dict[str, tuple[bytes, bytes]]:
    return {event.id: (event.type.encode(), event.correlationid.encode()) for event in events}


def test_confluent_kafka_subscribes_in_a_group(kafka_bootstrap: str, written,
                                               fresh_topic_prefix: str) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    topic, events = written
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": kafka_bootstrap, "group.id": f"{fresh_topic_prefix}-ck",
        "auto.offset.reset": "earliest", **LIBRDKAFKA_GROUP})
    got: dict[str, tuple[bytes, bytes]] = {}
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    try:
        consumer.subscribe([topic])
        while len(got) < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            headers = dict(message.headers() or [])
            got[headers["ce_id"].decode()] = (headers["ce_type"], headers["ce_correlationid"])
        assignment = {part.partition for part in consumer.assignment()}
    finally:
        consumer.close()
    assert got == _expected(events)
    assert assignment == {0, 1, 2}  # a real group member: the coordinator assigned it all


def test_kafka_python_subscribes_in_a_group(kafka_bootstrap: str, written,
                                            fresh_topic_prefix: str) -> None:
    kafka = pytest.importorskip("kafka")
    topic, events = written
    consumer = kafka.KafkaConsumer(topic, bootstrap_servers=kafka_bootstrap,
                                   group_id=f"{fresh_topic_prefix}-kp",
                                   auto_offset_reset="earliest", **KAFKA_PYTHON_GROUP)
    got: dict[str, tuple[bytes, bytes]] = {}
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    try:
        while len(got) < RECORDS and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                for message in batch:
                    headers = dict(message.headers)
                    got[headers["ce_id"].decode()] = (headers["ce_type"],
                                                      headers["ce_correlationid"])
        consumer.commit()
        committed = {part: consumer.committed(part) for part in consumer.assignment()}
    finally:
        consumer.close()
    assert got == _expected(events)
    assert sum(offset or 0 for offset in committed.values()) == RECORDS
