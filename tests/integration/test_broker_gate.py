"""The broker's gate (`toolexec.kafka_relay` in front of a real Tansu): it advertises
itself to every client, relays each client over a broker connection of its own (a
waiting request holds up no one else), answers a waiting fetch when a produce lands,
and refuses connections while closed."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.waiting import WAIT
from toolexec.broker_gate import BrokerGate
from toolexec.embedded_broker import HOST, EmbeddedBroker, free_port
from toolexec.kafka_fetches import FetchAnswer, read_fetch_answer
from toolexec.kafka_relay import REQUEST_HEAD, FrameScanner, Relay
from toolexec.log_archive import LogArchive
from toolexec.log_archiver import LogArchiver

pytestmark = pytest.mark.integration

TOPIC = "gated"
WAITING_FETCHES = 6  # more than tansu proxy 0.6's four broker connections
FETCH_WAIT_MS = 20_000  # never reached: the fetches are cut off by closing the gate
LONGER_THAN_THE_TEST_MS = int(WAIT * 1000) * 10
LIBRDKAFKA_LONGEST_WAIT_MS = 299_000  # its bound: Tansu would answer at half of it,
# past the test's wait, and librdkafka's requests time out 1 s after it


@pytest.fixture
async def gate(tmp_path: Path) -> AsyncIterator[BrokerGate]:
    async with EmbeddedBroker({TOPIC: 2}, log_dir=tmp_path) as broker:
        gate = BrokerGate(free_port(), broker.bootstrap, log_dir=tmp_path)
        await gate.open()
        try:
            yield gate
        finally:
            gate.close()


def test_librdkafka_produces_and_consumes_in_a_group_through_the_gate(
        gate: BrokerGate) -> None:
    """librdkafka asks Metadata v12 and FindCoordinator v4+ (flexible versions): it
    finds the gate, never the broker's private port, and joins a group through it."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    producer = confluent_kafka.Producer({"bootstrap.servers": gate.bootstrap})
    values = [f"v{n}".encode() for n in range(6)]
    for n, value in enumerate(values):
        producer.produce(TOPIC, value, partition=n % 2)
    assert producer.flush(WAIT) == 0
    brokers = producer.list_topics(timeout=WAIT).brokers
    assert {f"{b.host}:{b.port}" for b in brokers.values()} == {gate.bootstrap}
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": gate.bootstrap, "group.id": f"gate-{uuid.uuid4().hex[:6]}",
        "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 2000, "fetch.wait.max.ms": 100})
    got: list[bytes] = []
    deadline = time.monotonic() + WAIT
    try:
        consumer.subscribe([TOPIC])
        while len(got) < len(values) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                got.append(message.value())
        assignment = {part.partition for part in consumer.assignment()}
    finally:
        consumer.close()
    assert sorted(got) == sorted(values)
    assert assignment == {0, 1}


async def test_requests_waiting_at_the_broker_hold_up_no_other_client(
        gate: BrokerGate) -> None:
    """Six clients each wait in a long-poll fetch of an empty partition; a seventh
    client is answered while all of them still wait."""
    fetches = [await _connect(gate.port) for _ in range(WAITING_FETCHES)]
    try:
        pending = [asyncio.create_task(_exchange(conn, _fetch_request(n)))
                   for n, conn in enumerate(fetches)]
        producer = AIOKafkaProducer(bootstrap_servers=gate.bootstrap)
        await producer.start()
        try:
            async with asyncio.timeout(WAIT):
                await producer.send_and_wait(TOPIC, b"x", partition=1)
        finally:
            await producer.stop()
        assert not any(task.done() for task in pending)
    finally:
        gate.close()  # cuts the waiting fetches off
        for _, writer in fetches:
            writer.close()
    results = await asyncio.gather(*pending, return_exceptions=True)
    assert all(isinstance(result, (OSError, asyncio.IncompleteReadError)) for result in results)


async def test_a_closed_gate_refuses_connections_and_an_open_one_serves(
        gate: BrokerGate) -> None:
    reader, writer = await _connect(gate.port)
    gate.close()
    # A client connected before is dropped: with an end of stream once the relay had
    # accepted it, with a reset while it still waited in the listen backlog.
    with pytest.raises((asyncio.IncompleteReadError, ConnectionResetError)):
        async with asyncio.timeout(WAIT):
            await reader.readexactly(1)
    writer.close()
    with pytest.raises(OSError), socket.create_connection((HOST, gate.port), timeout=WAIT):
        pass
    await gate.open()
    producer = AIOKafkaProducer(bootstrap_servers=gate.bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(TOPIC, b"after", partition=0)
    finally:
        await producer.stop()
    assert meta.offset >= 0


async def test_a_waiting_fetch_is_answered_when_a_produce_lands(gate: BrokerGate) -> None:
    """Tansu alone would hold this fetch for its whole wait (far longer than the test
    waits); the gate answers it with the records as soon as they are acknowledged, and
    one request sent behind it on the same connection is answered after it."""
    reader, writer = await _connect(gate.port)
    try:
        writer.write(_fetch_request(1, wait_ms=LONGER_THAN_THE_TEST_MS, partition=1)
                     + _metadata_request(2))
        await writer.drain()
        await _produce(gate.bootstrap, 1, b"first", b"second")
        async with asyncio.timeout(WAIT):
            first, answer = await _answer(reader)
            second, _ = await _answer(reader)
    finally:
        writer.close()
    assert (first, second) == (1, 2)
    assert answer is not None and answer.found
    assert answer.ends[(TOPIC, 1)] >= 1


async def test_a_waiting_fetch_with_nothing_new_is_answered_empty_at_the_end_of_its_wait(
        gate: BrokerGate) -> None:
    """The first fetch learns the partition's end from the broker, the second waits
    at the gate without asking; a produce to another partition wakes neither."""
    await _produce(gate.bootstrap, 0, b"old")
    reader, writer = await _connect(gate.port)
    try:
        answers = []
        for correlation in (1, 2):
            writer.write(_fetch_request(correlation, wait_ms=300, partition=0, offset=1))
            await writer.drain()
            if correlation == 2:
                await _produce(gate.bootstrap, 1, b"elsewhere")
            async with asyncio.timeout(WAIT):
                answers.append(await _answer(reader))
    finally:
        writer.close()
    for correlation, (got, answer) in zip((1, 2), answers, strict=True):
        assert got == correlation
        assert answer is not None and not answer.found
        assert answer.ends == {(TOPIC, 0): 1}


async def test_a_consumer_waiting_long_gets_each_record_as_it_is_produced(
        gate: BrokerGate) -> None:
    """An aiokafka consumer whose fetches wait far longer than the test: each record
    produced reaches it while it waits."""
    consumer = AIOKafkaConsumer(bootstrap_servers=gate.bootstrap, enable_auto_commit=False,
                                fetch_max_wait_ms=LONGER_THAN_THE_TEST_MS,
                                request_timeout_ms=2 * LONGER_THAN_THE_TEST_MS)
    await consumer.start()
    try:
        place = TopicPartition(TOPIC, 1)
        consumer.assign([place])
        await consumer.seek_to_end(place)
        for value in (b"one", b"two", b"three"):
            await _produce(gate.bootstrap, 1, value)
            async with asyncio.timeout(WAIT):
                batch = await consumer.getmany(place, timeout_ms=int(WAIT * 1000))
            assert [record.value for record in batch[place]] == [value]
    finally:
        await consumer.stop()


def test_librdkafka_waiting_long_gets_each_record_as_it_is_produced(
        gate: BrokerGate) -> None:
    """librdkafka would fetch in Tansu's flexible versions, which the gate does not
    read; offered Fetch up to v11 only, its waiting fetches are held and woken too."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": gate.bootstrap, "group.id": f"gate-{uuid.uuid4().hex[:6]}",
        "enable.auto.commit": False, "fetch.wait.max.ms": LIBRDKAFKA_LONGEST_WAIT_MS,
        "socket.timeout.ms": LIBRDKAFKA_LONGEST_WAIT_MS + 1_000})
    try:
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, 1, 0)])
        for value in (b"one", b"two", b"three"):
            asyncio.run(_produce(gate.bootstrap, 1, value))
            deadline = time.monotonic() + WAIT
            message = None
            while message is None and time.monotonic() < deadline:
                message = consumer.poll(0.5)
            assert message is not None, f"{value!r} did not arrive while the fetch waited"
            assert message.error() is None, message.error()
            assert message.value() == value
    finally:
        consumer.close()


async def test_a_produce_to_a_partition_fetched_before_ends_a_wait_elsewhere(
        gate: BrokerGate) -> None:
    """aiokafka sends a broker no fetch while one is in flight there: a client waiting
    on a quiet partition may be waiting to fetch a busy one again. A produce to a
    partition this connection fetched before ends the wait, empty."""
    reader, writer = await _connect(gate.port)
    try:
        writer.write(_fetch_request(1, wait_ms=10, partition=1))
        await writer.drain()
        async with asyncio.timeout(WAIT):
            await _answer(reader)
        writer.write(_fetch_request(2, wait_ms=LONGER_THAN_THE_TEST_MS, partition=0))
        await writer.drain()
        await _produce(gate.bootstrap, 1, b"busy")
        async with asyncio.timeout(WAIT):
            got, answer = await _answer(reader)
    finally:
        writer.close()
    assert got == 2
    assert answer is not None and not answer.found and answer.ends == {(TOPIC, 0): 0}


async def test_an_idle_consumer_costs_the_broker_one_fetch(tmp_path: Path) -> None:
    """A consumer at the end of its partition fetching again and again: the relay asks
    the broker once (to learn the end) and answers every later wait itself."""
    async with EmbeddedBroker({TOPIC: 2}, log_dir=tmp_path) as broker:
        await _produce(broker.bootstrap, 0, b"only")
        counter = _CountingProxy(broker.bootstrap)
        await counter.start()
        relay = Relay((HOST, free_port()), (HOST, counter.port))
        await relay.start()
        reader, writer = await _connect(relay.listen[1])
        try:
            answers = []
            for correlation in range(1, 6):
                writer.write(_fetch_request(correlation, wait_ms=50, partition=0, offset=1))
                await writer.drain()
                async with asyncio.timeout(WAIT):
                    answers.append(await _answer(reader))
        finally:
            writer.close()
            await relay.close()
            await counter.close()
    assert [got for got, _ in answers] == [1, 2, 3, 4, 5]
    assert all(answer is not None and not answer.found and answer.ends == {(TOPIC, 0): 1}
               for _, answer in answers)
    assert counter.fetches == 1


class _CountingProxy:
    """A plain TCP forwarder to a broker that counts the Fetch requests it forwards."""

    def __init__(self, origin: str) -> None:
        host, _, port = origin.rpartition(":")
        self.origin = (host, int(port))
        self.fetches = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, HOST, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()

    def _is_fetch(self, head: bytes) -> bool:
        self.fetches += int.from_bytes(head[4:6], "big") == 1
        return False

    async def _connection(self, client_in: asyncio.StreamReader,
                          client_out: asyncio.StreamWriter) -> None:
        origin_in, origin_out = await asyncio.open_connection(*self.origin)
        requests = FrameScanner(REQUEST_HEAD, self._is_fetch, bytes)

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                       feed: Callable[[bytes], bytes]) -> None:
            while chunk := await source.read(65536):
                sink.write(feed(chunk))
                await sink.drain()
            sink.close()

        with contextlib.suppress(OSError):
            await asyncio.gather(pump(client_in, origin_out, requests.feed),
                                 pump(origin_in, client_out, bytes))


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(HOST, port)


def _fetch_request(correlation: int, *, wait_ms: int = FETCH_WAIT_MS, partition: int = 0,
                   offset: int = 0) -> bytes:
    """Fetch v4 of one partition of TOPIC (by default the empty partition 0), waiting
    `wait_ms` for 1 byte."""
    topic = TOPIC.encode()
    body = (struct.pack(">hhi", 1, 4, correlation) + struct.pack(">h", 4) + b"test"
            + struct.pack(">iiiib", -1, wait_ms, 1, 1 << 20, 0)
            + struct.pack(">ih", 1, len(topic)) + topic
            + struct.pack(">iiqi", 1, partition, offset, 1 << 20))
    return struct.pack(">i", len(body)) + body


def _metadata_request(correlation: int) -> bytes:
    """Metadata v1 of every topic."""
    body = (struct.pack(">hhi", 3, 1, correlation) + struct.pack(">h", 4) + b"test"
            + struct.pack(">i", -1))
    return struct.pack(">i", len(body)) + body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, FetchAnswer | None]:
    """The next response on a connection: its correlation id, and what it says when it
    is a Fetch v4 answer."""
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    body = await reader.readexactly(size)
    frame = struct.pack(">i", size) + body
    return struct.unpack(">i", body[:4])[0], read_fetch_answer(frame, 4)


async def _produce(bootstrap: str, partition: int, *values: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        async with asyncio.timeout(WAIT):
            for value in values:
                await producer.send_and_wait(TOPIC, value, partition=partition)
    finally:
        await producer.stop()


async def _exchange(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                    request: bytes) -> bytes:
    reader, writer = conn
    writer.write(request)
    await writer.drain()
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


async def test_an_archiver_told_by_the_gate_archives_each_produce_and_never_polls(
        tmp_path: Path) -> None:
    """Behind the gate every client writes through it, so the archiver is told of each
    acknowledged produce instead of polling the broker: each record is archived, and
    once it is nothing more is fetched while nothing is produced (its only look
    without being told, at its idle wait, asks for the log's ends, not records)."""
    async with EmbeddedBroker({TOPIC: 2}, log_dir=tmp_path) as broker:
        archive = LogArchive(tmp_path / "log", fsync="never")
        archiver = LogArchiver(archive, broker.bootstrap, woken=True, idle_wait_ms=100)
        await archiver.start()
        fetches = _count_fetches(archiver)
        gate = BrokerGate(free_port(), broker.bootstrap, log_dir=tmp_path,
                          on_produce=archiver.kick)
        await gate.open()
        try:
            for n in range(4):
                await _produce(gate.bootstrap, n % 2, b"r%d" % n)
                assert await archiver.wait_archived({(TOPIC, n % 2): n // 2 + 1}, timeout=WAIT)
            fetched = fetches()
            await asyncio.sleep(1.0)  # ten idle looks: a poller would fetch all along
            idle_fetches = fetches() - fetched
        finally:
            gate.close()
            await archiver.stop()
    assert [r.value for r in archive.partition(TOPIC, 0).read()] == [b"r0", b"r2"]
    assert [r.value for r in archive.partition(TOPIC, 1).read()] == [b"r1", b"r3"]
    assert 4 <= fetched <= 4 * 3  # a fetch or two per produce told (none in between)
    assert idle_fetches <= 1  # at most the one that was on its way when it paused


def _count_fetches(archiver: LogArchiver) -> Callable[[], int]:
    """Counts the fetch requests `archiver`'s consumer sends (aiokafka's fetcher sends
    each through `_proc_fetch_request`; the broker's own metadata would send a plain
    proxy's clients straight to the broker)."""
    fetcher = archiver._consumer._fetcher  # type: ignore[union-attr]  # noqa: SLF001
    sent = fetcher._proc_fetch_request  # noqa: SLF001
    count = 0

    async def counting(*args: object) -> object:
        nonlocal count
        count += 1
        return await sent(*args)

    fetcher._proc_fetch_request = counting  # noqa: SLF001
    return lambda: count


async def test_an_archiver_that_is_not_told_still_archives_at_its_idle_look(
        tmp_path: Path) -> None:
    """A produce that reaches the broker without the gate is archived all the same:
    the told archiver looks at the log's ends every idle wait."""
    async with EmbeddedBroker({TOPIC: 2}, log_dir=tmp_path) as broker:
        archive = LogArchive(tmp_path / "log", fsync="never")
        archiver = LogArchiver(archive, broker.bootstrap, woken=True, idle_wait_ms=50)
        await archiver.start()
        try:
            await _produce(broker.bootstrap, 1, b"untold", b"also")
            assert await archiver.wait_archived({(TOPIC, 1): 2}, timeout=WAIT)
        finally:
            await archiver.stop()
    assert [r.value for r in archive.partition(TOPIC, 1).read()] == [b"untold", b"also"]


async def test_news_of_a_topic_created_since_the_last_look_is_archived_at_once(
        tmp_path: Path) -> None:
    """A topic a client creates by writing to it (Tansu creates it on first use) is
    looked for when the gate tells of it, not at the next periodic look."""
    async with EmbeddedBroker({TOPIC: 2}, log_dir=tmp_path) as broker:
        archive = LogArchive(tmp_path / "log", fsync="never")
        archiver = LogArchiver(archive, broker.bootstrap, woken=True, idle_wait_ms=5000,
                               discover_seconds=3600)
        await archiver.start()
        gate = BrokerGate(free_port(), broker.bootstrap, log_dir=tmp_path,
                          on_produce=archiver.kick)
        await gate.open()
        try:
            producer = AIOKafkaProducer(bootstrap_servers=gate.bootstrap)
            await producer.start()
            try:
                await producer.send_and_wait("created.later", b"new", partition=1)
            finally:
                await producer.stop()
            assert await archiver.wait_archived({("created.later", 1): 1}, timeout=WAIT)
        finally:
            gate.close()
            await archiver.stop()
    assert [r.value for r in archive.partition("created.later", 1).read()] == [b"new"]
