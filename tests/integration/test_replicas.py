"""Two consumer replicas in one group share the work and lose nothing."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from contracts import topics
from contracts.kafka_binding import UndecodableRecord, decode
from toolexec.client import InvocationClient
from toolexec.publishing import publish_event
from toolexec.settings import Settings
from toolexec.sources import load_builtin_sources, load_source
from toolexec.stack import Stack

pytestmark = pytest.mark.integration

TOOLS = Path(__file__).parent / "tools"
INVOCATIONS = 200
TERMINAL = ("tool.invoke.completed", "tool.invoke.failed")


async def test_two_replicas_give_every_invocation_exactly_one_terminal_event(
        tmp_path: Path) -> None:
    group = f"replica{uuid.uuid4().hex[:6]}"
    first = Stack(Settings(state_dir=tmp_path / "a", tools_dir=tmp_path / "none",
                           user_tools_dir=None), group_prefix=group)
    await first.start()
    second = Stack(Settings(state_dir=tmp_path / "b", tools_dir=tmp_path / "none",
                            user_tools_dir=None, kafka_bootstrap=first.bootstrap),
                   group_prefix=group)
    try:
        await second.start()
        now = datetime.now(UTC)
        for source in load_builtin_sources() + [load_source(TOOLS / "py_echo")]:
            await first.publish(publish_event(source, now=now))
        ids = [str(uuid.uuid4()) for _ in range(INVOCATIONS)]
        async with InvocationClient(first.bootstrap) as client:
            results = await asyncio.gather(*(
                client.invoke("py_echo", {"text": i[:8]}, invocation_id=i, timeout=180)
                for i in ids))
        assert [r.data for r in results if r.type != "tool.invoke.completed"] == []
        terminals = await _distinct_terminal_ids(first.bootstrap, set(ids))
        assert {i: len(terminals.get(i, ())) for i in ids} == {i: 1 for i in ids}
    finally:
        await second.stop()
        await first.stop()


async def _distinct_terminal_ids(bootstrap: str, ids: set[str]) -> dict[str, set[str]]:
    """Every terminal event id per invocation in the whole log (redeliveries of the same
    event share its id, so distinct ids are distinct outcomes)."""
    consumer = AIOKafkaConsumer(topics.INVOCATIONS, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest")
    await consumer.start()
    found: dict[str, set[str]] = {}
    try:
        ends = await consumer.end_offsets(list(consumer.assignment()))
        async with asyncio.timeout(60):
            while not await _at_end(consumer, ends):
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    for record in records:
                        try:
                            event = decode(record.key, record.value, record.headers)
                        except UndecodableRecord:
                            continue
                        if event.type in TERMINAL and event.correlationid in ids:
                            found.setdefault(event.correlationid, set()).add(event.id)
    finally:
        await consumer.stop()
    return found


async def _at_end(consumer: AIOKafkaConsumer, ends: dict) -> bool:
    for tp, end in ends.items():
        if await consumer.position(tp) < end:
            return False
    return True
