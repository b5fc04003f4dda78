"""Reading the registry of a running system from a CLI process, reading its own writes.

`toolexec publish` plans against the registry topic itself, folded here to its end
(`published_versions`). `deprecate`/`remove`/`restore` check against the registry
read model (SQL) of the running `toolexec up`; before reading, `registry_caught_up`
waits (bounded) until it has folded the registry topic up to its end offsets as they
are now, so a tool published just before is seen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts.kafka_binding import UndecodableRecord, decode, header_type
from contracts.topics import REGISTRY
from domain.publication_limits import PublicationLimits
from projections.catalog import read_models
from projections.registry_table import NAME
from projections.registry_view import RegistryLogView
from toolexec.usecases.read_your_writes import caught_up

log = structlog.get_logger(__name__)

REGISTRY_TYPES = ("tool.published", "tool.lifecycle.changed")
LOG_READ_SECONDS = 60.0
READ_MODEL_WAIT_SECONDS = 5.0  # a tool published just before may not be folded yet
POLL_SECONDS = 0.1


async def registry_caught_up(engine: AsyncEngine, bootstrap: str,
                             timeout: float = READ_MODEL_WAIT_SECONDS, *,
                             client_options: Mapping[str, Any] | None = None,
                             model: str = NAME) -> bool:
    """Wait (bounded) until the registry read model (or `model`, another one folding
    the registry topic) has folded the registry topic up to its end offsets as they
    are now; False when it has not within `timeout` (`usecases.read_your_writes`)."""
    return await caught_up(engine, read_models()[model], bootstrap, timeout,
                           client_options=client_options)


async def published_versions(bootstrap: str, limits: PublicationLimits,
                             timeout: float = LOG_READ_SECONDS, *,
                             client_options: Mapping[str, Any] | None = None) -> RegistryLogView:
    """The registry as the log holds it now: every record of the registry topic up to
    its end offsets, folded the way a running system folds it (the same limits).

    `toolexec publish` plans against this rather than the SQL read model, which may
    not have folded the last publications yet (or at all, when `up` stopped early)."""
    view = RegistryLogView(limits=limits)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", **dict(client_options or {}))
    await consumer.start()
    try:
        async with asyncio.timeout(timeout):
            await consumer.topics()
            partitions = [TopicPartition(REGISTRY, p)
                          for p in consumer.partitions_for_topic(REGISTRY) or ()]
            ends = await consumer.end_offsets(partitions) if partitions else {}
            pending = {tp: end for tp, end in ends.items() if end > 0}
            consumer.assign(list(pending))
            for tp in pending:
                consumer.seek(tp, 0)  # the beginning of what is kept (earliest)
            while pending:
                batches = await consumer.getmany(timeout_ms=int(POLL_SECONDS * 1000))
                for tp, records in batches.items():
                    if tp not in pending:  # fetched before it was paused
                        continue
                    for record in records:
                        _fold(view, record)
                    # Tansu's end offset is the last batch's base offset + 1, short of
                    # the end when several publications went out together: the fetch's
                    # high watermark says where the last batch ends
                    end = max(pending[tp], consumer.highwater(tp) or 0)
                    if await consumer.position(tp) >= end:
                        del pending[tp]
                        consumer.pause(tp)
    finally:
        await consumer.stop()
    return view


def _fold(view: RegistryLogView, record: Any) -> None:
    if header_type(record.headers) not in REGISTRY_TYPES:
        return
    try:
        view.apply(decode(record.key, record.value, record.headers),
                   partition=record.partition, offset=record.offset)
    except UndecodableRecord as bad:
        log.warning("registry.undecodable", offset=record.offset, error=bad.error.code)
