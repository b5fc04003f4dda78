"""A record that crashes its handler is dead-lettered; the records behind it flow."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

import consumers.steps.resolve
from contracts import topics
from contracts.kafka_binding import decode
from toolexec.client import InvocationClient
from toolexec.publishing import publish_event
from toolexec.settings import Settings
from toolexec.sources import load_builtin_sources, load_source
from toolexec.stack import Stack

pytestmark = pytest.mark.chaos

TOOLS = Path(__file__).parent.parent / "integration" / "tools"


def crash_on(tool_id: str, resolve: Callable[..., Any]) -> Callable[..., Any]:
    def resolve_or_crash(request: Any, registry: Any, chains: Any) -> Any:
        if request.tool_id == tool_id:
            raise RuntimeError(f"handler bug triggered by {tool_id}")
        return resolve(request, registry, chains)
    return resolve_or_crash


async def test_poison_record_is_dead_lettered_while_the_rest_is_processed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumers.steps.resolve, "_resolve", crash_on("poison", consumers.steps.resolve._resolve))
    settings = Settings(state_dir=tmp_path, tools_dir=tmp_path / "none", user_tools_dir=None)
    async with Stack(settings) as stack:
        now = datetime.now(UTC)
        for source in load_builtin_sources() + [load_source(TOOLS / "py_echo")]:
            await stack.publish(publish_event(source, now=now))
        async with InvocationClient(stack.bootstrap, verifier=stack.verifier) as client:
            poison = asyncio.create_task(client.invoke("poison", {}, invocation_id="poison-1"))
            normal = [client.invoke("py_echo", {"text": str(n)}) for n in range(40)]
            results = await asyncio.gather(*normal)
            failed = await poison
        assert [r.type for r in results] == ["tool.invoke.completed"] * 40
        assert (failed.data.error.code, failed.data.stage) == ("E3000", "resolve")
        letters = await _dead_letters(stack.bootstrap)
    assert len(letters) == 1
    letter = letters[0]
    assert letter.key == "poison-1" and letter.attempts == 3
    assert "handler bug triggered by poison" in letter.error.details["traceback"]


async def _dead_letters(bootstrap: str) -> list[Any]:
    consumer = AIOKafkaConsumer(topics.DEADLETTER, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        batch = await consumer.getmany(timeout_ms=2000)
        return [decode(r.key, r.value, r.headers).data for rs in batch.values() for r in rs]
    finally:
        await consumer.stop()
