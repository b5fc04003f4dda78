"""Approval decisions in the pipeline: the `tool.approval.decided` commands read, and
the runs waiting for one.

A decision is a command on `toolexec.requests`, keyed by the invocation id, so it is
read by the pipeline that owns the invocation, in partition order after its request.
Decisions are kept in arrival order per invocation (bounded: a few per invocation, the
oldest invocations forgotten first); the waiting run takes the first one whose
approver may decide (consumers.steps.authorize.approver_may_decide): anyone can write the
requests topic, so a decision without the right token counts for nothing and blocks
nobody. Across a restart the decisions are read again, since the partition's committed
offset never passes a request that has not ended (consumers.runtime.partition_progress).

A waiting run holds no execution slot (consumers.runtime.runs): it sleeps here until a new
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
PER_INVOCATION = 16
"""Decisions kept per invocation; later ones are dropped (the first that counts is
almost always the first one)."""


def decision_of(event: Envelope) -> Decision:
    """The domain view of a `tool.approval.decided` event (its time is when it was
    decided)."""
    data: ApprovalDecided = event.data
    return Decision(verdict=data.decision, approved_hash=data.approved_hash,
                    decided_by=data.decided_by, decided_at=event.time, reason=data.reason)


class ApprovalDecisions:
    """The decisions read per invocation (bounded), and the runs waiting for one."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._decisions: OrderedDict[str, tuple[Envelope, ...]] = OrderedDict()
        self._waiting: dict[str, asyncio.Event] = {}

    def record(self, event: Envelope) -> None:
        """Take a `tool.approval.decided` into account and wake its waiting run."""
        invocation_id = event.data.invocation_id
        known = self._decisions.get(invocation_id, ())
        if len(known) >= PER_INVOCATION or any(e.id == event.id for e in known):
            return
        remember(self._decisions, invocation_id, (*known, event), self._capacity)
        waiting = self._waiting.get(invocation_id)
        if waiting is not None:
            waiting.set()

    def decisions(self, invocation_id: str) -> tuple[Envelope, ...]:
        """The decisions read for `invocation_id`, in log order."""
        return self._decisions.get(invocation_id, ())

    async def wait(self, invocation_id: str, seen: int, until: datetime, now: datetime) -> None:
        """Return once `invocation_id` has more than `seen` decisions, or at `until`
        (by the clock that gave `now`)."""
        if len(self.decisions(invocation_id)) > seen:
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
