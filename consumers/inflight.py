"""Concurrent processing of one partitioned stream with at-least-once commits.

A step whose work is slow (running tools) processes many records at once, yet a
partition's committed offset only ever moves past records that are finished: the
commit is the end of the contiguous prefix of done records. A crash therefore
re-delivers exactly the unfinished ones; nothing is acknowledged before its work
is done. One consumer per process, so no extra group members and no rebalances.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiokafka import TopicPartition

log = structlog.get_logger(__name__)

Commit = Callable[[dict[TopicPartition, int]], Awaitable[None]]


class PartitionWindow:
    """Offsets of one partition in flight, and the next offset safe to commit."""

    def __init__(self) -> None:
        self.pending: dict[int, bool] = {}

    def start(self, offset: int) -> None:
        self.pending[offset] = False

    def finish(self, offset: int) -> int | None:
        """Mark `offset` done; return the new commit position when it advanced."""
        self.pending[offset] = True
        committed = None
        for pending_offset in sorted(self.pending):
            if not self.pending[pending_offset]:
                break
            del self.pending[pending_offset]
            committed = pending_offset + 1
        return committed


class CommitCoalescer:
    """Commits finished positions in batches: at most one commit per `interval`.

    A commit per record is a broker round trip per record, which caps a step at a
    few dozen records per second. Positions only ever come from finished records,
    so a crash re-delivers at most the last `interval` of work, which deterministic
    event ids and execution claims make harmless.
    """

    def __init__(self, interval: float = 0.02) -> None:
        self._interval = interval
        self._positions: dict[TopicPartition, int] = {}
        self._commit: Commit | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._held: dict[TopicPartition, int] = {}

    def hold(self, tp: TopicPartition, offset: int) -> None:
        """The record at `offset` of `tp` is unfinished: commit nothing past it (it is
        delivered again after a restart or rebalance) until it is done."""
        self._held[tp] = min(offset, self._held.get(tp, offset))
        if tp in self._positions:
            self._positions[tp] = min(self._positions[tp], offset)

    def done(self, commit: Commit, tp: TopicPartition, position: int) -> None:
        """Record that every offset of `tp` below `position` is finished."""
        self._commit = commit
        held = self._held.get(tp)
        if held is not None:
            if position == held + 1:  # the unfinished record is done after all
                del self._held[tp]
            else:
                position = min(position, held)
        self._positions[tp] = max(position, self._positions.get(tp, 0))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(self._interval)
        await self.flush()

    async def flush(self) -> None:
        """Commit what is pending now (also on shutdown)."""
        batch, self._positions = self._positions, {}
        if not batch or self._commit is None:
            return
        try:
            await self._commit(batch)
        except Exception as exc:  # partitions moved in a rebalance: they are redelivered
            log.warning("commit.failed", partitions=len(batch), error=repr(exc))


class InFlight:
    """Runs up to `limit` records at once across partitions; commits in order."""

    def __init__(self, limit: int) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._windows: dict[TopicPartition, PartitionWindow] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, record: Any, work: Callable[[], Awaitable[None]],
                     commit: Commit) -> None:
        """Wait for a free slot, then run `work` in the background."""
        await self._slots.acquire()
        tp = TopicPartition(record.topic, record.partition)
        window = self._windows.setdefault(tp, PartitionWindow())
        window.start(record.offset)
        task = asyncio.create_task(self._run(tp, window, record.offset, work, commit))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run_now(self, record: Any, work: Callable[[], Awaitable[None]],
                      commit: Commit) -> None:
        """Run quick `work` inline, without a slot, in order with the others."""
        tp = TopicPartition(record.topic, record.partition)
        window = self._windows.setdefault(tp, PartitionWindow())
        window.start(record.offset)
        if await _finished(tp, record.offset, work):
            await _commit_past(window, tp, record.offset, commit)

    async def skip(self, record: Any, commit: Commit) -> None:
        """A record with nothing to do: done at once, in order with the others."""
        await self.run_now(record, _nothing, commit)

    async def _run(self, tp: TopicPartition, window: PartitionWindow, offset: int,
                   work: Callable[[], Awaitable[None]], commit: Commit) -> None:
        try:
            done = await _finished(tp, offset, work)
        finally:  # also when cancelled at shutdown: the slot frees, the offset stays
            self._slots.release()
        if done:
            await _commit_past(window, tp, offset, commit)

    async def drain(self) -> None:
        """Wait for every record in flight (on shutdown)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def _nothing() -> None:
    return None


async def _finished(tp: TopicPartition, offset: int, work: Callable[[], Awaitable[None]]) -> bool:
    """Run `work`; False when it failed. Its work (e.g. publishing its output) is then
    not done: the partition's commit stays below it, so the record is delivered again
    after a restart or rebalance instead of being skipped."""
    try:
        await work()
    except Exception:
        log.exception("record.unfinished", topic=tp.topic, partition=tp.partition, offset=offset)
        return False
    return True


async def _commit_past(window: PartitionWindow, tp: TopicPartition, offset: int,
                       commit: Commit) -> None:
    position = window.finish(offset)
    if position is not None:
        await commit({tp: position})
