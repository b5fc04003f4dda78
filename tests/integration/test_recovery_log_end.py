"""The recovery reader on a real broker: facts produced together in one batch (as the
pipeline produces the write-ahead facts) are all read back, the last batch's included.
Tansu answers ListOffsets(latest) with the last batch's base offset + 1, so a reader
that stopped there would miss every record of that batch but its first."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from cryptography.hazmat.primitives.asymmetric import ed25519

from consumers.runtime.recovery import LogReader
from contracts.envelope import Envelope, new_envelope
from contracts.events import InvokeCompleted
from contracts.fact_signature import FactSigner, FactVerifier
from contracts.kafka_binding import encode
from toolexec.embedded_broker import ensure_topics

pytestmark = pytest.mark.integration

FACTS = 12


def _terminal(invocation_id: str) -> Envelope:
    data = InvokeCompleted(invocation_id=invocation_id, tool_id="hello", version="1.0.0",
                           result={"ok": True}, duration_ms=1.0, attempts=1)
    return new_envelope(data, source="urn:test", partitionkey=invocation_id,
                        correlationid=invocation_id, causationid=f"cause-{invocation_id}",
                        time=datetime.now(UTC))


async def _produce_one_batch(bootstrap: str, topic: str, signer: FactSigner,
                             invocations: list[str]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        batch = producer.create_batch()
        for record in signer.sign([encode(_terminal(i)) for i in invocations]):
            assert batch.append(key=record.key, value=record.value, timestamp=None,
                                headers=list(record.headers)) is not None
        batch.close()
        await (await producer.send_batch(batch, topic, partition=0))
    finally:
        await producer.stop()


async def test_a_batch_of_facts_is_read_back_whole(kafka_bootstrap: str) -> None:
    topic = f"recovery-end-{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka_bootstrap, {topic: 1})
    key = ed25519.Ed25519PrivateKey.generate()
    earlier = [f"inv-early-{n}" for n in range(3)]
    last = [f"inv-last-{n}" for n in range(FACTS)]
    await _produce_one_batch(kafka_bootstrap, topic, FactSigner(key), earlier)
    await _produce_one_batch(kafka_bootstrap, topic, FactSigner(key), last)

    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=None,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        reader = LogReader(consumer, FactVerifier([key.public_key()]))
        tp = TopicPartition(topic, 0)
        assert await reader.end_offset(tp) == len(earlier) + FACTS
        recovered = await reader.recover(tp)
    finally:
        await consumer.stop()
    assert recovered.end == len(earlier) + FACTS
    assert sorted(recovered.facts) == sorted(earlier + last)
    assert recovered.untrusted == 0
