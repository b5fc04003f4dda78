"""Reading a request back from a real broker's log, as the authorize step does after a
restart: found however far back it is in its partition, never from later offsets."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaProducer

from consumers.ports import LogPosition
from consumers.request_log import KafkaRequestLog
from contracts import topics
from contracts.envelope import Envelope, new_envelope
from contracts.events import InvokeRequested
from contracts.kafka_binding import encode
from tests.handlers.conftest import FIXED_NOW

pytestmark = pytest.mark.integration

PARTITION = 3


def _request(token: str) -> Envelope:
    invocation_id = str(uuid.uuid4())
    return new_envelope(
        InvokeRequested(invocation_id=invocation_id, tool_id="hello", version_range="*",
                        parameters={}),
        source="urn:test", partitionkey=invocation_id, correlationid=invocation_id,
        id=str(uuid.uuid4()), time=FIXED_NOW, extensions={"captoken": token})


async def _append(bootstrap: str, events: list[Envelope]) -> list[int]:
    """Append `events` to one partition; their offsets."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        offsets = []
        for event in events:
            record = encode(event)
            sent = await producer.send_and_wait(topics.INVOCATIONS, record.value, key=record.key,
                                                headers=record.headers, partition=PARTITION)
            offsets.append(sent.offset)
        return offsets
    finally:
        await producer.stop()


async def test_a_request_far_back_in_its_partition_is_found_with_its_token(
        kafka_bootstrap: str) -> None:
    wanted = _request("token-wanted")
    others = [_request(f"token-{n}") for n in range(700)]
    offsets = await _append(kafka_bootstrap, [wanted, *others])
    requests = KafkaRequestLog(kafka_bootstrap)
    try:
        found = await requests.find(LogPosition(topics.INVOCATIONS, PARTITION, offsets[-1] + 1),
                                    wanted.id)
        assert found is not None and found.extensions["captoken"] == "token-wanted"
        assert found.correlationid == wanted.correlationid
        neighbour = await requests.find(LogPosition(topics.INVOCATIONS, PARTITION, offsets[-1]),
                                        others[-2].id)
        assert neighbour is not None and neighbour.extensions["captoken"] == "token-698"
    finally:
        await requests.aclose()


async def test_an_id_not_before_the_position_is_not_found(kafka_bootstrap: str) -> None:
    early, late = _request("token-early"), _request("token-late")
    offsets = await _append(kafka_bootstrap, [early, late])
    requests = KafkaRequestLog(kafka_bootstrap)
    try:
        assert await requests.find(LogPosition(topics.INVOCATIONS, PARTITION, offsets[1]),
                                   late.id) is None
        assert await requests.find(LogPosition(topics.INVOCATIONS, PARTITION, offsets[1]),
                                   str(uuid.uuid4())) is None
        found = await requests.find(LogPosition(topics.INVOCATIONS, PARTITION, offsets[1]),
                                    early.id)
        assert found is not None and found.extensions["captoken"] == "token-early"
    finally:
        await requests.aclose()


async def test_find_after_sees_later_events_including_ones_appended_since(
        kafka_bootstrap: str) -> None:
    first, second = _request("token-1"), _request("token-2")
    offsets = await _append(kafka_bootstrap, [first, second])
    requests = KafkaRequestLog(kafka_bootstrap)
    after_first = LogPosition(topics.INVOCATIONS, PARTITION, offsets[0])
    try:
        found = await requests.find_after(after_first, second.id, "tool.invoke.requested")
        assert found is not None and found.extensions["captoken"] == "token-2"
        assert await requests.find_after(after_first, first.id, "tool.invoke.requested") is None
        assert await requests.find_after(after_first, second.id, "tool.chain.resolved") is None
        third = _request("token-3")
        await _append(kafka_bootstrap, [third])
        after_second = LogPosition(topics.INVOCATIONS, PARTITION, offsets[1])
        found = await requests.find_after(after_second, third.id, "tool.invoke.requested")
        assert found is not None and found.extensions["captoken"] == "token-3"
    finally:
        await requests.aclose()
