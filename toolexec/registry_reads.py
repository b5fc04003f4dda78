"""Reading the registry of a running system from a CLI process, reading its own writes.

The registry read model (SQL) of the running `toolexec up` is what `toolexec publish`
plans against and what `deprecate`/`remove`/`restore` check against. Before reading,
`registry_caught_up` waits (bounded) until the read model has folded the registry
topic up to its end offsets as they are now, so a tool published just before is seen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts.topics import REGISTRY
from domain.registry import InMemoryRegistry
from projections.database import make_engine
from projections.registry_snapshot import registry_snapshot
from projections.registry_table import NAME
from projections.runner import stored_offsets

READ_MODEL_WAIT_SECONDS = 5.0  # a tool published just before may not be folded yet
POLL_SECONDS = 0.1


async def registry_caught_up(engine: AsyncEngine, bootstrap: str,
                             timeout: float = READ_MODEL_WAIT_SECONDS) -> bool:
    """Wait (bounded) until the registry read model has folded the registry topic up to
    its end offsets as they are now; False when it has not within `timeout`."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer.topics()
        partitions = [TopicPartition(REGISTRY, p)
                      for p in consumer.partitions_for_topic(REGISTRY) or ()]
        ends = await consumer.end_offsets(partitions) if partitions else {}
    finally:
        await consumer.stop()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stored = await stored_offsets(engine, NAME)
        if all(stored.get((tp.topic, tp.partition), 0) >= end for tp, end in ends.items()):
            return True
        await asyncio.sleep(POLL_SECONDS)
    return False


async def published_versions(database_url: str, bootstrap: str,
                             tool_ids: Iterable[str]) -> InMemoryRegistry:
    """Every published version of `tool_ids` in the running system's registry read
    model, once it holds every registry record in the log now (bounded wait)."""
    engine = make_engine(database_url)
    try:
        await registry_caught_up(engine, bootstrap)
        async with engine.connect() as conn:
            return await registry_snapshot(conn, tool_ids)
    finally:
        await engine.dispose()
