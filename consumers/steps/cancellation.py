"""Cancellation in the execute step: which invocations were asked to stop, and stopping
the work of the ones running here.

`tool.invoke.cancel.requested` is read by the execute step's group in partition order
with the invocation's other events. The ids are kept in memory, bounded (oldest
forgotten first): a cancel seen before the invocation's `tool.permission.decided` stops
it before it starts; one seen while an attempt runs interrupts it (the task running the
primitive is cancelled, which kills a subprocess's whole process group or aborts an
HTTP request); one seen during a retry backoff stops the retries.

Across an executor restart the set is empty again. A cancel of an invocation still
running when the executor stopped is delivered again (its offset is not committed past
the unfinished record before it), so it still applies; a cancel already committed for
an invocation that had not reached the execute step yet is forgotten.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any, TypeVar

from domain.bounded import remember
from domain.errors import JobCancelled

T = TypeVar("T")

DEFAULT_CAPACITY = 10_000


def cancelled_error(invocation_id: str, reason: str | None = None) -> JobCancelled:
    details = {"invocation_id": invocation_id}
    if reason:
        details["reason"] = reason
    return JobCancelled("Job cancelled", details=details)


class Cancellations:
    """Cancelled invocation ids (bounded) and the interruptible work running for them."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._cancelled: OrderedDict[str, str | None] = OrderedDict()
        self._running: dict[str, set[asyncio.Future[Any]]] = {}

    def request(self, invocation_id: str, reason: str | None = None) -> None:
        """Remember the cancel and interrupt what runs for the invocation now."""
        remember(self._cancelled, invocation_id, reason, self._capacity)
        for task in self._running.pop(invocation_id, ()):
            task.cancel()

    def is_cancelled(self, invocation_id: str) -> bool:
        return invocation_id in self._cancelled

    def error(self, invocation_id: str) -> JobCancelled:
        return cancelled_error(invocation_id, self._cancelled.get(invocation_id))

    async def interruptible(self, invocation_id: str, work: Awaitable[T]) -> T:
        """Await `work`; raises JobCancelled (after `work` was cancelled and has
        finished cleaning up) when the invocation is cancelled first.

        `work` runs in a task of its own that a cancel cancels directly: no watcher
        task and no `asyncio.wait` per call (this runs several times per invocation).
        Cancelling the caller cancels `work` too, and the caller's CancelledError
        comes once `work` has cleaned up."""
        task = asyncio.ensure_future(work)
        if self.is_cancelled(invocation_id):
            task.cancel()
            await asyncio.wait({task})
            raise self.error(invocation_id)
        running = self._running.setdefault(invocation_id, set())
        running.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if (task.cancelled() and self.is_cancelled(invocation_id)
                    and (current is None or not current.cancelling())):
                raise self.error(invocation_id) from None
            raise
        finally:
            running.discard(task)
            if not running and self._running.get(invocation_id) is running:
                del self._running[invocation_id]
