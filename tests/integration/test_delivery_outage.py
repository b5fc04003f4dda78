"""A handler's publish outlasts a broker outage longer than the client's own timeout."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from faststream.kafka import KafkaBroker

from consumers.runtime.delivery import DeliveringPublisher
from contracts import topics
from contracts.envelope import Envelope
from contracts.kafka_binding import encode
from tests.log_reading import terminal_event_ids, terminal_failure
from tests.s3_store import s3_store, tansu_s3_env
from tests.waiting import WAIT
from toolexec.embedded_broker import EmbeddedBroker

pytestmark = pytest.mark.integration

TOPICS = {topics.INVOCATIONS: 1}
REQUEST_TIMEOUT_MS = 1000  # the outage below lasts several of these


async def test_a_publish_during_an_outage_is_delivered_once_the_broker_is_back(
        tmp_path: Path) -> None:
    with s3_store() as (endpoint, _):
        broker = EmbeddedBroker(TOPICS, log_dir=tmp_path, storage_engine="s3://toolexec/",
                                env=tansu_s3_env(endpoint))
        async with broker:
            kafka = KafkaBroker(broker.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS,
                                linger_ms=0, logger=None)
            await kafka.connect()
            attempts = 0

            async def publish(envelope: Envelope) -> None:  # as toolexec.stack.Stack does
                nonlocal attempts
                attempts += 1
                record = encode(envelope)
                await kafka.publish(record.value, topics.INVOCATIONS, key=record.key,
                                    headers={k: v.decode() for k, v in record.headers})

            try:
                await broker.stop()
                delivery = asyncio.create_task(
                    DeliveringPublisher(publish, max_delay=0.5)(terminal_failure("inv-1")))
                async with asyncio.timeout(WAIT):
                    while attempts < 3:  # failed at least twice while the broker was away
                        await asyncio.sleep(0.1)
                assert not delivery.done()
                await broker.restart()
                async with asyncio.timeout(WAIT):
                    await delivery
            finally:
                await kafka.stop()
            terminals = await terminal_event_ids(broker.bootstrap, {"inv-1"})
    assert len(terminals["inv-1"]) == 1
