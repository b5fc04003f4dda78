"""The embedded Tansu broker: lifecycle, topics and the Kafka features toolexec uses."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from tests.waiting import WAIT
from toolexec import embedded_broker
from toolexec.embedded_broker import EmbeddedBroker, ensure_topics, free_port

pytestmark = pytest.mark.integration

HANG_GUARD_SECONDS = WAIT  # fails a hanging test; not a performance bound


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _partitions(bootstrap: str) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = await admin.list_topics()
        described = await admin.describe_topics(names)
    finally:
        await admin.close()
    return {topic["topic"]: len(topic["partitions"]) for topic in described}


async def test_stopping_the_broker_leaves_no_process(tmp_path: Path) -> None:
    broker = EmbeddedBroker(log_dir=tmp_path)
    await broker.start()
    pid = broker.pid
    assert pid is not None and _alive(pid)

    await broker.stop()

    assert not _alive(pid)
    assert broker.pid is None
    assert broker.log_path is not None and broker.log_path.parent == tmp_path


async def test_broker_moves_to_another_port_when_its_port_is_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        ports = iter([taken_port])
        monkeypatch.setattr(embedded_broker, "free_port", lambda: next(ports, free_port()))
        async with EmbeddedBroker(["moved"], log_dir=tmp_path) as broker:
            assert broker.bootstrap != f"127.0.0.1:{taken_port}"
            assert "moved" in await _partitions(broker.bootstrap)


def test_broker_can_be_used_from_synchronous_code(tmp_path: Path) -> None:
    with EmbeddedBroker(["sync.topic"], log_dir=tmp_path) as broker:
        pid = broker.pid
        assert broker.running
        assert broker.startup_seconds is not None and broker.started_at is not None
    assert pid is not None and not _alive(pid)


async def test_topics_exist_with_their_partitions_after_start(tmp_path: Path) -> None:
    async with EmbeddedBroker({"orders": 4, "audit": 1}, log_dir=tmp_path) as broker:
        partitions = await _partitions(broker.bootstrap)
    assert partitions["orders"] == 4
    assert partitions["audit"] == 1


async def test_session_broker_has_every_toolexec_topic(
        kafka_bootstrap: str, kafka_topic_partitions: dict[str, int]) -> None:
    partitions = await _partitions(kafka_bootstrap)
    for topic, count in kafka_topic_partitions.items():
        assert partitions.get(topic) == count, topic


async def test_ensure_topics_keeps_existing_topics(kafka_bootstrap: str,
                                                   fresh_topic_prefix: str) -> None:
    topic = f"{fresh_topic_prefix}.again"
    await ensure_topics(kafka_bootstrap, {topic: 2})
    await ensure_topics(kafka_bootstrap, {topic: 2})
    assert (await _partitions(kafka_bootstrap))[topic] == 2


async def test_record_round_trips_with_key_and_headers(kafka_bootstrap: str,
                                                       fresh_topic_prefix: str) -> None:
    topic = f"{fresh_topic_prefix}.roundtrip"
    await ensure_topics(kafka_bootstrap, {topic: 1})
    headers = [("ce_type", b"tool.invoke.requested"), ("ce_id", "é-1".encode())]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=0)
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, group_id=None,
                                auto_offset_reset="earliest")
    await producer.start()
    await consumer.start()
    try:
        await producer.send_and_wait(topic, b'{"x": 1}', key=b"inv-1", headers=headers)
        async with asyncio.timeout(HANG_GUARD_SECONDS):
            record = await consumer.getone()
    finally:
        await producer.stop()
        await consumer.stop()
    assert (record.key, record.value) == (b"inv-1", b'{"x": 1}')
    assert list(record.headers) == headers


async def test_two_consumers_of_one_group_split_the_partitions(
        kafka_bootstrap: str, fresh_topic_prefix: str,
        kafka_consumer_kwargs: dict[str, Any]) -> None:
    topic = f"{fresh_topic_prefix}.split"
    await ensure_topics(kafka_bootstrap, {topic: 4})
    consumers = [
        AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap,
                         group_id=f"{fresh_topic_prefix}.group", **kafka_consumer_kwargs)
        for _ in range(2)
    ]
    for consumer in consumers:
        await consumer.start()
    polls = [asyncio.create_task(_poll_forever(c)) for c in consumers]
    try:
        async with asyncio.timeout(HANG_GUARD_SECONDS):
            while not _split_between(consumers, partitions=4):
                await asyncio.sleep(0.05)
    finally:
        for poll in polls:
            poll.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
        for consumer in consumers:
            await consumer.stop()


def _split_between(consumers: list[AIOKafkaConsumer], *, partitions: int) -> bool:
    assigned = [{tp.partition for tp in c.assignment()} for c in consumers]
    return all(assigned) and set().union(*assigned) == set(range(partitions)) and \
        sum(len(a) for a in assigned) == partitions


async def _poll_forever(consumer: AIOKafkaConsumer) -> None:
    while True:
        with contextlib.suppress(KafkaError):
            await consumer.getmany(timeout_ms=50)
        await asyncio.sleep(0)
