"""A consumer group never commits past a record whose outcome it could not publish."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import MessageSizeTooLargeError

from consumers.pipeline import Group, Handler, attach_group
from contracts import topics
from contracts.envelope import Envelope, new_envelope
from contracts.events import InvokeRequested
from contracts.kafka_binding import encode

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


class CapturingBroker:
    """Stands in for FastStream's broker: keeps the subscribed handler."""

    handler: Callable[[Any], Any]

    def subscriber(self, *topics: str, **options: Any) -> Callable[[Any], Any]:
        def register(handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
            self.handler = handler
            return handler
        return register


class UnpublishableDeadLetters:
    """Even the dead-letter record cannot be published (the broker refuses it)."""

    async def record(self, record: Any, error: Any, *, consumer: str, attempts: int) -> None:
        raise MessageSizeTooLargeError()


def message_at(offset: int, commits: list[dict[int, int]]) -> SimpleNamespace:
    invocation_id = str(uuid.uuid4())
    envelope: Envelope = new_envelope(
        InvokeRequested(invocation_id=invocation_id, tool_id="echo", version_range="*",
                        parameters={}),
        source="urn:test", partitionkey=invocation_id, correlationid=invocation_id,
        id=str(uuid.uuid4()), time=NOW)
    record = encode(envelope)

    async def commit(positions: dict[TopicPartition, int]) -> None:
        commits.append({tp.partition: position for tp, position in positions.items()})

    raw = SimpleNamespace(topic=topics.INVOCATIONS, partition=0, offset=offset,
                          key=record.key, value=record.value, headers=list(record.headers))
    return SimpleNamespace(raw_message=raw, consumer=SimpleNamespace(commit=commit))


async def test_a_record_whose_failure_could_not_be_published_is_not_committed_past() -> None:
    async def crashes(event: Envelope) -> None:
        raise RuntimeError("handler bug")

    async def succeeds(event: Envelope) -> None:
        return None

    broker = CapturingBroker()
    group = Group("test.pipeline", {"tool.invoke.requested": (
        Handler("tool.invoke.requested", "resolve", crashes, fails_invocation=False),)})
    deps = SimpleNamespace(dead_letters=UnpublishableDeadLetters(), clock=lambda: NOW)
    attached = attach_group(broker, group, deps, consumer_options={})  # type: ignore[arg-type]
    commits: list[dict[int, int]] = []

    with pytest.raises(MessageSizeTooLargeError):
        await broker.handler(message_at(0, commits))
    group.handlers = {"tool.invoke.requested": (
        Handler("tool.invoke.requested", "resolve", succeeds),)}
    await broker.handler(message_at(1, commits))
    await attached.drain()
    assert all(position <= 0 for commit in commits for position in commit.values()), commits
