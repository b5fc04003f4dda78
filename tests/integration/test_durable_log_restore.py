"""Archiving a real broker's log and restoring it into an empty one: the same records
at the same offsets, the same consumer group commits, gaps kept, mismatches refused."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.waiting import WAIT
from toolexec.embedded_broker import EmbeddedBroker
from toolexec.log_archive import LogArchive, Skip
from toolexec.log_archiver import LogArchiver
from toolexec.log_restore import RestoreMismatch, restore

pytestmark = pytest.mark.integration

TOPICS = {"orders": 2, "audit": 1}


async def read_log(bootstrap: str, topics: dict[str, int]) -> list[tuple[Any, ...]]:
    """Every record of `topics` as a raw consumer sees it."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, fetch_max_wait_ms=50)
    await consumer.start()
    try:
        tps = [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]
        consumer.assign(tps)
        for tp in tps:
            await consumer.seek_to_beginning(tp)
        seen: list[tuple[Any, ...]] = []
        remaining = set(tps)  # until each is read up to the high watermark its fetches
        while remaining:  # report (not "nothing came for a while": a busy machine is slow)
            fetched = await consumer.getmany(timeout_ms=300)
            seen += [(tp.topic, tp.partition, r.offset, r.key, r.value, tuple(r.headers),
                      r.timestamp) for tp, records in fetched.items() for r in records]
            remaining = {tp for tp in remaining if consumer.highwater(tp) is None
                         or await consumer.position(tp) < consumer.highwater(tp)}
        return sorted(seen, key=lambda r: (r[0], r[1], r[2]))
    finally:
        await consumer.stop()


async def produce_mixed(bootstrap: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        sent = [await producer.send(
            "orders", None if n % 5 == 0 else b"v%d" % n, key=None if n % 5 == 1 else b"k%d" % n,
            partition=n % 2, timestamp_ms=1_700_000_000_000 + n,
            headers=[("ce_id", b"%d" % n), ("empty", b""), ("none", None)])
            for n in range(120)]
        await asyncio.gather(*sent)
        await producer.send_and_wait("audit", b"a" * 5000, key=b"big")
    finally:
        await producer.stop()


async def archived(tmp_path: Path, bootstrap: str) -> LogArchive:
    archive = LogArchive(tmp_path / "log", fsync="never")
    archiver = LogArchiver(archive, bootstrap, fetch_wait_ms=20)
    await archiver.start()
    try:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                    fetch_max_wait_ms=20)
        await consumer.start()
        tps = [TopicPartition(t, p) for t, n in TOPICS.items() for p in range(n)]
        consumer.assign(tps)
        ends = {}
        for tp in tps:  # the true end: a fetch's high watermark
            await consumer.seek_to_beginning(tp)
        async with asyncio.timeout(WAIT):  # until a fetch told every partition's end
            for _ in range(20):
                await consumer.getmany(timeout_ms=100)
            while any(consumer.highwater(tp) is None for tp in tps):
                await consumer.getmany(timeout_ms=100)
        ends = {(tp.topic, tp.partition): consumer.highwater(tp) or 0 for tp in tps}
        await consumer.stop()
        assert await archiver.wait_archived(ends, timeout=WAIT)
        await archiver.archive_groups()
    finally:
        await archiver.stop()
    return archive


async def test_a_restored_log_has_every_record_at_its_offset_with_key_headers_and_time(
        tmp_path: Path) -> None:
    async with EmbeddedBroker(TOPICS, log_dir=tmp_path) as first:
        await produce_mixed(first.bootstrap)
        before = await read_log(first.bootstrap, TOPICS)
        archive = await archived(tmp_path, first.bootstrap)

    async with EmbeddedBroker({}, log_dir=tmp_path) as second:
        report = await restore(archive, second.bootstrap)
        after = await read_log(second.bootstrap, TOPICS)
        producer = AIOKafkaProducer(bootstrap_servers=second.bootstrap)
        await producer.start()
        next_offset = (await producer.send_and_wait("audit", b"new")).offset
        await producer.stop()

    assert len(before) == 121
    assert after == before
    assert report.records == 121
    assert next_offset == 1  # the log goes on where it ended


async def test_consumer_group_commits_come_back_without_the_group_joining(
        tmp_path: Path) -> None:
    tp = TopicPartition("orders", 1)
    async with EmbeddedBroker(TOPICS, log_dir=tmp_path) as first:
        await produce_mixed(first.bootstrap)
        committer = AIOKafkaConsumer(bootstrap_servers=first.bootstrap, group_id="billing",
                                     enable_auto_commit=False)
        await committer.start()
        committer.assign([tp])
        await committer.commit({tp: 42})
        await committer.stop()
        archive = await archived(tmp_path, first.bootstrap)

    async with EmbeddedBroker({}, log_dir=tmp_path) as second:
        await restore(archive, second.bootstrap)
        reader = AIOKafkaConsumer(bootstrap_servers=second.bootstrap, group_id="billing",
                                  enable_auto_commit=False)
        await reader.start()
        committed = await reader.committed(tp)
        await reader.stop()

    assert committed == 42


async def test_offsets_left_by_a_dead_broker_stay_a_gap_that_consumers_step_over(
        tmp_path: Path) -> None:
    async with EmbeddedBroker(TOPICS, log_dir=tmp_path) as first:
        await produce_mixed(first.bootstrap)
        archive = await archived(tmp_path, first.bootstrap)
    part = archive.partition("audit", 0)
    part.append([Skip(part.next_offset + 1000)])  # as the supervisor does after a crash

    async with EmbeddedBroker({}, log_dir=tmp_path) as second:
        await restore(archive, second.bootstrap)
        producer = AIOKafkaProducer(bootstrap_servers=second.bootstrap)
        await producer.start()
        new = (await producer.send_and_wait("audit", b"after")).offset
        await producer.stop()
        tp = TopicPartition("audit", 0)
        consumer = AIOKafkaConsumer(bootstrap_servers=second.bootstrap, group_id=None,
                                    fetch_max_wait_ms=50)
        await consumer.start()
        consumer.assign([tp])
        consumer.seek(tp, 500)  # a position a consumer of the dead broker may hold
        fetched = await consumer.getmany(tp, timeout_ms=3000)
        await consumer.stop()

    assert new == 1001
    assert [(r.offset, r.value) for r in fetched[tp]] == [(1001, b"after")]


async def test_a_restore_into_a_broker_that_is_not_empty_is_refused(tmp_path: Path) -> None:
    async with EmbeddedBroker(TOPICS, log_dir=tmp_path) as first:
        await produce_mixed(first.bootstrap)
        archive = await archived(tmp_path, first.bootstrap)

    async with EmbeddedBroker(TOPICS, log_dir=tmp_path) as second:
        producer = AIOKafkaProducer(bootstrap_servers=second.bootstrap)
        await producer.start()
        await producer.send_and_wait("orders", b"someone else's", partition=0)
        await producer.stop()
        with pytest.raises(RestoreMismatch, match="orders/0"):
            await restore(archive, second.bootstrap)


async def test_topics_created_later_are_archived_too(tmp_path: Path) -> None:
    async with EmbeddedBroker({}, log_dir=tmp_path) as broker:
        archive = LogArchive(tmp_path / "log", fsync="never")
        archiver = LogArchiver(archive, broker.bootstrap, fetch_wait_ms=20,
                               discover_seconds=0.1)
        await archiver.start()
        try:
            producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
            await producer.start()
            # Tansu creates a topic on first use (four partitions)
            await producer.send_and_wait("toolexec.requests", b"r", partition=2)
            await producer.stop()
            assert await archiver.wait_archived({("toolexec.requests", 2): 1}, timeout=WAIT)
        finally:
            await archiver.stop()
    assert archive.topics() == {"toolexec.requests": 4}
