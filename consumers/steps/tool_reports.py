"""An attempt's reports becoming facts: `tool.execution.progressed` and
`tool.execution.checkpointed`.

`AttemptReports` is the ToolSession of one attempt (consumers.ports): the subprocess
primitive hands it what the tool wrote to its report file. Progress is coalesced to
at most one event per PROGRESS_INTERVAL, checkpoints to one per CHECKPOINT_INTERVAL
(a later one supersedes a waiting one: only the last is resumed from), and what waits
when the tool ends goes out then. A checkpoint is encoded (domain.checkpoints),
stored durably in the checkpoint store, and only then its event is appended; a state
past the cap (E3906) stops the tool and fails the attempt. Messages are scrubbed of
the run's secrets.

`ReportTrail` carries what an invocation's attempts reported so far — the next
sequence numbers (per invocation, across attempts) and the last checkpoint — read
back from the log when an invocation resumes after a crash (`from_log`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from consumers.ports import CheckpointStore, Clock, Publish
from consumers.steps.checkpoint_restore import load_state
from consumers.steps.derived_events import derive
from contracts.envelope import Envelope
from contracts.events import ExecutionCheckpointed, ExecutionProgressed
from domain.checkpoints import DEFAULT_MAX_STATE_BYTES, Restored, encode_checkpoint
from domain.errors import ToolexecError
from domain.secret_scrub import Scrubber
from domain.tool_reports import MESSAGE_MAX, Checkpoint, Coalescer, Progress, Report

log = structlog.get_logger(__name__)

PROGRESS_INTERVAL = 0.25
"""At most 4 progress events a second per attempt."""
CHECKPOINT_INTERVAL = 0.1
"""At most 10 checkpoints a second per attempt."""


@dataclass
class ReportTrail:
    """What an invocation's attempts reported so far (see the module docstring)."""

    next_progress: int = 0
    next_checkpoint: int = 0
    last_checkpoint: str | None = None
    """state_hash of the last checkpoint on the log."""
    restored: Restored | None = None
    """That checkpoint's state, once read (or written) here."""

    def saw(self, event: Envelope) -> None:
        """Take a progressed or checkpointed fact into account."""
        data = event.data
        if isinstance(data, ExecutionProgressed):
            self.next_progress = max(self.next_progress, data.sequence + 1)
        elif isinstance(data, ExecutionCheckpointed) and data.sequence >= self.next_checkpoint:
            self.next_checkpoint = data.sequence + 1
            self.last_checkpoint = data.state_hash

    @classmethod
    def from_log(cls, events: Sequence[Envelope]) -> ReportTrail:
        trail = cls()
        for event in events:
            trail.saw(event)
        return trail

    async def resume_state(self, store: CheckpointStore | None) -> Restored | None:
        """The last checkpoint's state (None: no checkpoint yet). Raises
        CheckpointError E3903/E3904 when it cannot be restored."""
        if self.last_checkpoint is None:
            return None
        if self.restored is None or self.restored.state_hash != self.last_checkpoint:
            if store is None:
                raise ToolexecError("Resume failed: no checkpoint store is configured",
                                    code="E3905")
            self.restored = await load_state(store, self.last_checkpoint)
        return self.restored


@dataclass
class AttemptReports:
    """The ToolSession of one attempt (see the module docstring)."""

    cause: Envelope
    """The permission decision (any event of the invocation carrying its
    `invocation_id`): every report's event derives from it."""
    attempt: int
    trail: ReportTrail
    publish: Publish
    clock: Clock
    store: CheckpointStore | None
    scrub: Scrubber
    resume: Restored | None = None
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES
    monotonic: Callable[[], float] = time.monotonic
    _progress: Coalescer = field(default_factory=lambda: Coalescer(PROGRESS_INTERVAL))
    _checkpoints: Coalescer = field(default_factory=lambda: Coalescer(CHECKPOINT_INTERVAL))

    @property
    def invocation_id(self) -> str:
        return str(self.cause.data.invocation_id)

    @property
    def resume_state(self) -> bytes | None:
        return None if self.resume is None else self.resume.canonical

    async def receive(self, reports: Sequence[Report]) -> None:
        now = self.monotonic()
        for report in reports:
            coalescer = self._checkpoints if isinstance(report, Checkpoint) else self._progress
            await self._emit(coalescer.offer(report, now))
        await self._emit(self._checkpoints.due(now))
        await self._emit(self._progress.due(now))

    async def finish(self) -> None:
        """Send what waits (the tool ended)."""
        await self._emit(self._checkpoints.drain())
        await self._emit(self._progress.drain())

    async def _emit(self, report: Report | None) -> None:
        if isinstance(report, Checkpoint):
            await self._checkpoint(report)
        elif isinstance(report, Progress):
            await self._progressed(report)

    async def _progressed(self, report: Progress) -> None:
        sequence = self.trail.next_progress
        self.trail.next_progress += 1
        data = ExecutionProgressed(invocation_id=self.invocation_id, attempt=self.attempt,
                                   sequence=sequence, fraction=report.fraction,
                                   message=self.scrub.text(report.message)[:MESSAGE_MAX])
        await self.publish(derive(self.cause, data,
                                  step=f"execute.progressed.{self.attempt}.{sequence}",
                                  now=self.clock()))

    async def _checkpoint(self, report: Checkpoint) -> None:
        if self.store is None:
            log.warning("tool.checkpoint_dropped", reason="no checkpoint store")
            return
        base = self.trail.restored if self.trail.restored is not None and \
            self.trail.restored.state_hash == self.trail.last_checkpoint else None
        stored, restored = encode_checkpoint(report.state, base,
                                             max_bytes=self.max_state_bytes)
        await self.store.put(stored)  # durable before its event exists
        sequence = self.trail.next_checkpoint
        data = ExecutionCheckpointed(
            invocation_id=self.invocation_id, attempt=self.attempt, sequence=sequence,
            state_hash=stored.state_hash, size=stored.size, stored_size=stored.stored_size,
            compression=stored.compression, delta_of=stored.delta_of)
        await self.publish(derive(self.cause, data,
                                  step=f"execute.checkpointed.{self.attempt}.{sequence}",
                                  now=self.clock()))
        self.trail.next_checkpoint = sequence + 1
        self.trail.last_checkpoint = stored.state_hash
        self.trail.restored = restored
