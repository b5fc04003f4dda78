"""The recovery reader on a real broker: facts produced together in one batch (as the
pipeline produces the write-ahead facts) are all read back, the last batch's included.
Tansu answers ListOffsets(latest) with the last batch's base offset + 1, so a reader
that stopped there would miss every record of that batch but its first."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from cryptography.hazmat.primitives.asymmetric import ed25519

from consumers.runtime.recovery import LogReader
from contracts.fact_signature import FactSigner, FactVerifier
from contracts.kafka_binding import encode
from tests.log_reading import send_as_one_batch
from tests.projection_events import invocation
from toolexec.embedded_broker import ensure_topics

pytestmark = pytest.mark.integration

FACTS = 12


async def test_a_batch_of_facts_is_read_back_whole(kafka_bootstrap: str) -> None:
    topic = f"recovery-end-{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka_bootstrap, {topic: 1})
    key = ed25519.Ed25519PrivateKey.generate()
    signer = FactSigner(key)
    earlier = [f"inv-early-{n}" for n in range(3)]
    last = [f"inv-last-{n}" for n in range(FACTS)]
    for ids in (earlier, last):  # each a batch of terminal events, signed together
        terminals = [encode(invocation(i)[-1]) for i in ids]
        await send_as_one_batch(kafka_bootstrap, topic, signer.sign(terminals))

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
