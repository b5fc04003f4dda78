"""What the log already holds of one invocation: the facts a resumed run starts from.

Each step of an invocation is done once: after a crash or a rebalance the pipeline
reads the facts of the invocations it has to finish (consumers.runtime.recovery) and a run
skips every step whose fact is there (consumers.runtime.invocation). A run also records the
facts it appends, so a run that is retried after an unexpected failure knows what it
already did.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from consumers.steps.execute import AttemptsOnLog
from consumers.steps.tool_reports import ReportTrail
from contracts.envelope import Envelope
from contracts.events import TERMINAL_TYPES

FACT_TYPES = frozenset({"tool.chain.resolved", "tool.permission.decided",
                        "tool.approval.requested", "tool.approval.received",
                        "tool.execution.started",
                        "tool.execution.finished", "tool.execution.progressed",
                        "tool.execution.checkpointed"}) | TERMINAL_TYPES
"""Fact types a run reads back: the steps' outcomes."""


@dataclass
class InvocationFacts:
    """One invocation's facts, as read from the log or appended by its run."""

    resolved: Envelope | None = None
    decision: Envelope | None = None
    approval_requested: Envelope | None = None
    approval_received: Envelope | None = None
    terminal: Envelope | None = None
    started: set[int] = field(default_factory=set)
    finished: dict[int, Envelope] = field(default_factory=dict)
    reports: ReportTrail = field(default_factory=ReportTrail)

    def add(self, event: Envelope) -> None:
        """Take one fact into account (others are ignored); the first of a kind stays."""
        kind = event.type
        if kind in TERMINAL_TYPES:
            self.terminal = self.terminal or event
        elif kind == "tool.chain.resolved":
            self.resolved = self.resolved or event
        elif kind == "tool.permission.decided":
            self.decision = self.decision or event
        elif kind == "tool.approval.requested":
            self.approval_requested = self.approval_requested or event
        elif kind == "tool.approval.received":
            self.approval_received = self.approval_received or event
        elif kind == "tool.execution.started":
            self.started.add(event.data.attempt)
        elif kind == "tool.execution.finished":
            self.finished.setdefault(event.data.attempt, event)
        elif kind in ("tool.execution.progressed", "tool.execution.checkpointed"):
            self.reports.saw(event)

    def add_all(self, events: Iterable[Envelope]) -> None:
        for event in events:
            self.add(event)

    def attempts(self) -> AttemptsOnLog:
        """The attempts part, as the execute step takes it."""
        return AttemptsOnLog(frozenset(self.started), dict(self.finished), self.reports)

    @classmethod
    def of(cls, events: Iterable[Envelope]) -> InvocationFacts:
        facts = cls()
        facts.add_all(events)
        return facts
