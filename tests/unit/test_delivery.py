"""Output events outlast a broker outage."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, MessageSizeTooLargeError

from consumers.runtime.delivery import (
    DeliveringFactLog,
    DeliveringPublisher,
    transient_broker_error,
)
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


class FlakyFacts:
    """A fact log that refuses the first `outage` batches, then takes every one."""

    def __init__(self, outage: int) -> None:
        self.outage = outage
        self.batches: list[list[str]] = []

    async def append(self, events: Sequence[Envelope]) -> None:
        if self.outage > 0:
            self.outage -= 1
            raise KafkaConnectionError("broker restarting")
        self.batches.append([e.id for e in events])


async def test_a_batch_of_facts_is_sent_again_whole_until_the_broker_takes_it() -> None:
    inner = FlakyFacts(outage=3)
    await DeliveringFactLog(inner, sleep=no_wait).append([an_event(), an_event()])
    assert inner.batches == [["ev-1", "ev-1"]]
