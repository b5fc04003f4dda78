"""Offsets of a consumer committed when it matters, not after every batch.

The circuits step reads every fact but changes something (a breaker's counts, a
transition, a dead letter) only for a few: outcomes of tools that name an external
service, and bad records. Re-reading the other records after a restart or a
rebalance changes nothing, so their offsets need not be committed at once: a batch
that changed something commits (with every deferred position) at once, one that did
not leaves its positions to the next such batch or, at the latest, to a commit
`delay` seconds later, so that the group's committed offsets (`toolexec_consumer_lag`)
still catch up once the topic goes quiet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import structlog
from aiokafka import TopicPartition

log = structlog.get_logger(__name__)


class DeferredCommits:
    """Commits a consumer's positions at once, or at most `delay` seconds later."""

    def __init__(self, delay: float, *, name: str) -> None:
        self._delay = delay
        self._name = name
        self._pending: dict[TopicPartition, int] = {}
        self._consumer: Any = None
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: set[asyncio.Task[None]] = set()

    async def commit(self, consumer: Any, positions: Mapping[TopicPartition, int], *,
                     now: bool) -> None:
        """Take `positions` (next offsets read); commit everything pending when `now`,
        else make sure a commit follows within the delay."""
        for tp, offset in positions.items():
            self._pending[tp] = max(self._pending.get(tp, 0), offset)
        self._consumer = consumer
        if now:
            await self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay, self._flush_later)

    def _flush_later(self) -> None:
        self._timer = None
        task = asyncio.create_task(self.flush())
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def flush(self) -> None:
        """Commit every pending position now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, {}
        if not pending or self._consumer is None:
            return
        try:
            await self._consumer.commit(pending)
        except Exception as exc:  # moved in a rebalance: the new owner reads them again
            log.info(f"{self._name}.commit_deferred", error=repr(exc))
