"""Approval decisions in the pipeline: the `tool.approval.decided` commands read, and
the runs waiting for one.

A decision is a command on `toolexec.requests`, keyed by the invocation id, so it is
read by the pipeline that owns the invocation, in partition order after its request.
Anyone can write the requests topic, so a decision is checked as it is read, before it
is kept (consumers.steps.authorize.check_approver: the approver's token, its approve
scope on the invocation's tool, the approver it names): one that could not count is
never kept (the pipeline dead-letters it with its E32xx code) and a flood of forged
decisions takes no room. Those that may count are kept in arrival order per invocation
(bounded: a few per invocation, the oldest invocations forgotten first); the waiting run
takes the first one.

A decision is dated by when the pipeline read it, never by its event's own `time`
(chosen by its producer: a backdated late decision is late), and the first one that
may count is put on the log by the run waiting for it as the pipeline's own signed fact
`tool.approval.received` (timed when it was read) before the run needs a slot: after a
restart the run judges that fact, so a decision read in time stays in time. A decision
with no such fact yet is read again after a restart, since the partition's committed
offset never passes a request that has not ended (consumers.runtime.partition_progress),
and dated anew.

A waiting run holds no execution slot (consumers.runtime.runs): it sleeps here until a new
decision arrives or its approval expires.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from consumers.steps.derived_events import derive
from contracts.envelope import Envelope
from contracts.events import ApprovalDecided, ApprovalReceived
from domain.approval import Decision
from domain.bounded import remember

DEFAULT_CAPACITY = 10_000
PER_INVOCATION = 16
"""Decisions kept per invocation (each from an approver who may decide); later ones are
dropped: the first one counts."""


@dataclass(frozen=True, slots=True)
class ReadDecision:
    """A `tool.approval.decided` whose approver may decide, and when this pipeline read
    it (by its own clock)."""

    event: Envelope
    read_at: datetime


def received_fact(requested: Envelope, read: ReadDecision) -> Envelope:
    """The `tool.approval.received` fact of `read`, for the call that `requested`
    (its `tool.approval.requested`) asked approval for; its time is when it was read.
    One id per invocation: the first decision is the one that counts."""
    data: ApprovalDecided = read.event.data
    received = ApprovalReceived(invocation_id=data.invocation_id, decision_id=read.event.id,
                                decision=data.decision, approved_hash=data.approved_hash,
                                decided_by=data.decided_by, reason=data.reason)
    return derive(requested, received, step="approval-received", now=read.read_at)


def decision_of(received: Envelope) -> Decision:
    """The domain view of a `tool.approval.received` fact: decided when the pipeline
    read it."""
    data: ApprovalReceived = received.data
    return Decision(verdict=data.decision, approved_hash=data.approved_hash,
                    decided_by=data.decided_by, decided_at=received.time, reason=data.reason)


class ApprovalDecisions:
    """The decisions that may count, read per invocation (bounded), and the runs
    waiting for one."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._decisions: OrderedDict[str, tuple[ReadDecision, ...]] = OrderedDict()
        self._waiting: dict[str, asyncio.Event] = {}

    def record(self, event: Envelope, read_at: datetime) -> None:
        """Keep a `tool.approval.decided` already checked (its approver may decide),
        read at `read_at`, and wake its waiting run."""
        invocation_id = event.data.invocation_id
        known = self._decisions.get(invocation_id, ())
        if len(known) >= PER_INVOCATION or any(kept.event.id == event.id for kept in known):
            return
        remember(self._decisions, invocation_id, (*known, ReadDecision(event, read_at)),
                 self._capacity)
        waiting = self._waiting.get(invocation_id)
        if waiting is not None:
            waiting.set()

    def decisions(self, invocation_id: str) -> tuple[ReadDecision, ...]:
        """The decisions kept for `invocation_id`, in log order."""
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
