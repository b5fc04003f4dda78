"""How far an in-memory view has read its topic, and a bounded wait to catch up.

Views folded outside any consumer group (registry, circuits, policies) record the
last offset read per partition; `catch_up` waits until they have read up to the
topic's end offsets taken when it is called (read-your-writes for the resolver, a
complete policy set before the first decision).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

EndOffsets = Callable[[], Awaitable[dict[int, int]]]


class LogPosition:
    """Offsets read per partition, with waiters woken on every advance."""

    def __init__(self, end_offsets: EndOffsets | None = None) -> None:
        self._positions: dict[int, int] = {}
        self._end_offsets = end_offsets
        self._advanced = asyncio.Event()

    def advance(self, partition: int, offset: int) -> None:
        """Mark `offset` of `partition` as read (also for records not applied)."""
        self._positions[partition] = max(self._positions.get(partition, -1), offset)
        self._advanced.set()

    def caught_up_with(self, end_offsets: dict[int, int]) -> bool:
        """True when every partition's last record (end offset - 1) has been read."""
        return all(self._positions.get(p, -1) >= end - 1 for p, end in end_offsets.items())

    async def reach(self, end_offsets: dict[int, int], timeout: float) -> bool:
        """Wait (bounded) until the view has read every partition up to `end_offsets`
        (a producer's own writes); True at once when it has."""
        try:
            async with asyncio.timeout(timeout):
                while not self.caught_up_with(end_offsets):
                    self._advanced.clear()
                    await self._advanced.wait()
                return True
        except TimeoutError:
            return False

    async def catch_up(self, timeout: float) -> bool:
        """Wait (bounded) until the view has read the topic up to its end offsets now.
        True at once without an end-offsets source (a view fed by hand)."""
        if self._end_offsets is None:
            return True
        try:
            async with asyncio.timeout(timeout):
                target = await self._end_offsets()
                while not self.caught_up_with(target):
                    self._advanced.clear()
                    await self._advanced.wait()
                return True
        except TimeoutError:
            return False
