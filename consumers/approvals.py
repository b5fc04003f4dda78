"""Approval decisions in the pipeline: the `tool.approval.decided` commands read, and
the runs waiting for one.

A decision is a command on `toolexec.requests`, keyed by the invocation id, so it is
read by the pipeline that owns the invocation, in partition order after its request.
The first decision read for an invocation is the one that counts (later ones change
nothing). Decisions are kept in memory, bounded (oldest forgotten first); across a
restart they are read again, since the partition's committed offset never passes a
request that has not ended (consumers.partition_progress).

A waiting run holds no execution slot (consumers.runs): it sleeps here until a
decision arrives or its approval expires.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from datetime import datetime

from contracts.envelope import Envelope
from contracts.events import ApprovalDecided
from domain.approval import Decision
from domain.bounded import remember

DEFAULT_CAPACITY = 10_000


def decision_of(event: Envelope) -> Decision:
    """The domain view of a `tool.approval.decided` event (its time is when it was
    decided)."""
    data: ApprovalDecided = event.data
    return Decision(verdict=data.decision, approved_hash=data.approved_hash,
                    decided_by=data.decided_by, decided_at=event.time, reason=data.reason)


class ApprovalDecisions:
    """The first decision read per invocation (bounded), and the runs waiting for one."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._decisions: OrderedDict[str, Decision] = OrderedDict()
        self._waiting: dict[str, asyncio.Event] = {}

    def record(self, event: Envelope) -> None:
        """Take a `tool.approval.decided` into account (a later one for the same
        invocation is ignored) and wake its waiting run."""
        invocation_id = event.data.invocation_id
        if invocation_id in self._decisions:
            return
        remember(self._decisions, invocation_id, decision_of(event), self._capacity)
        waiting = self._waiting.get(invocation_id)
        if waiting is not None:
            waiting.set()

    def decision(self, invocation_id: str) -> Decision | None:
        return self._decisions.get(invocation_id)

    async def wait(self, invocation_id: str, until: datetime, now: datetime) -> None:
        """Return once `invocation_id` has a decision, or at `until` (by the clock that
        gave `now`)."""
        if invocation_id in self._decisions:
            return
        event = self._waiting.setdefault(invocation_id, asyncio.Event())
        try:
            async with asyncio.timeout(max(0.0, (until - now).total_seconds())):
                await event.wait()
        except TimeoutError:
            return
        finally:
            if self._waiting.get(invocation_id) is event:
                del self._waiting[invocation_id]
