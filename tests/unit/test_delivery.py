"""Output events outlast a broker outage, and unfinished work is never committed past."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, MessageSizeTooLargeError

from consumers.delivery import DeliveringPublisher, transient_broker_error
from consumers.inflight import CommitCoalescer, InFlight
from contracts.envelope import Envelope, new_envelope
from contracts.events import InvokeRequested


def an_event() -> Envelope:
    data = InvokeRequested(invocation_id="inv-1", tool_id="echo", version_range="*",
                           parameters={})
    return new_envelope(data, source="urn:test", partitionkey="inv-1", correlationid="inv-1",
                        id="ev-1", time=datetime(2026, 1, 1, tzinfo=UTC))


class FlakyBroker:
    """Fails the first `outage` publishes with `error`, then takes every event."""

    def __init__(self, outage: int, error: Exception) -> None:
        self.outage = outage
        self.error = error
        self.delivered: list[str] = []

    async def __call__(self, envelope: Envelope) -> None:
        if self.outage > 0:
            self.outage -= 1
            raise self.error
        self.delivered.append(envelope.id)


waits: list[float] = []


async def no_wait(seconds: float) -> None:
    waits.append(seconds)


async def test_publish_is_retried_until_the_broker_is_back() -> None:
    waits.clear()
    broker = FlakyBroker(outage=6, error=KafkaConnectionError("connection refused"))
    publish = DeliveringPublisher(broker, sleep=no_wait, first_delay=0.1, max_delay=1.0)
    await publish(an_event())
    assert broker.delivered == ["ev-1"]
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]  # capped exponential backoff


async def test_an_error_a_retry_cannot_cure_is_raised_at_once() -> None:
    broker = FlakyBroker(outage=1, error=MessageSizeTooLargeError())
    publish = DeliveringPublisher(broker, sleep=no_wait)
    with pytest.raises(MessageSizeTooLargeError):
        await publish(an_event())
    assert broker.delivered == []


def test_connection_and_timeout_errors_are_transient() -> None:
    assert transient_broker_error(KafkaConnectionError())
    assert transient_broker_error(KafkaTimeoutError())
    assert not transient_broker_error(MessageSizeTooLargeError())
    assert not transient_broker_error(ValueError())


async def test_a_record_whose_work_failed_holds_back_its_partitions_commit() -> None:
    commits: list[dict[int, int]] = []

    async def commit(positions: dict[TopicPartition, int]) -> None:
        commits.append({tp.partition: p for tp, p in positions.items()})

    async def fails() -> None:
        raise KafkaTimeoutError()

    async def works() -> None:
        return None

    inflight = InFlight(4)
    await inflight.submit(SimpleNamespace(topic="t", partition=0, offset=0), works, commit)
    await inflight.submit(SimpleNamespace(topic="t", partition=0, offset=1), fails, commit)
    await inflight.submit(SimpleNamespace(topic="t", partition=0, offset=2), works, commit)
    await inflight.drain()
    assert commits == [{0: 1}]  # never past offset 1, whose output was not delivered


async def test_a_record_cancelled_at_shutdown_is_not_committed() -> None:
    commits: list[dict[int, int]] = []

    async def commit(positions: dict[TopicPartition, int]) -> None:
        commits.append({tp.partition: p for tp, p in positions.items()})

    async def cancelled() -> None:  # what a task cancelled at shutdown sees
        raise asyncio.CancelledError

    inflight = InFlight(4)
    await inflight.submit(SimpleNamespace(topic="t", partition=0, offset=0), cancelled, commit)
    await inflight.drain()
    assert commits == []


async def test_the_coalescer_commits_nothing_past_a_held_record_until_it_is_done() -> None:
    commits: list[dict[int, int]] = []

    async def commit(positions: dict[TopicPartition, int]) -> None:
        commits.append({tp.partition: p for tp, p in positions.items()})

    tp = TopicPartition("t", 0)
    committer = CommitCoalescer(interval=0)
    committer.done(commit, tp, 5)
    committer.hold(tp, 5)  # the record at offset 5 failed
    committer.done(commit, tp, 7)
    await committer.flush()
    assert commits == [{0: 5}]
    committer.done(commit, tp, 6)  # offset 5 redelivered and done
    committer.done(commit, tp, 8)
    await committer.flush()
    assert commits == [{0: 5}, {0: 8}]
