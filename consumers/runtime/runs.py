"""The invocations running in one pipeline process: at most one run per invocation.

A run starts when the pipeline's consumer reads a request, or earlier when a local
producer hands its acknowledged request over in memory (consumers.runtime.pipeline); whoever
comes second joins the run that exists. Runs are bounded (`max_in_flight` at once,
the others wait for a slot in arrival order). A run waiting for an approver gives its
slot back and does not count as active until it goes on (consumers.steps.approvals); at
shutdown such a run is simply stopped: its approval request is on the log, so the
next owner waits again.

Bad input never crashes the pipeline: a run that fails unexpectedly (a bug, a port
that raises) is tried again a bounded number of times — each retry resumes from the
facts the earlier tries appended, so nothing is done twice — then the request is
dead-lettered with the traceback and the invocation ends with `tool.invoke.failed`
(E3000). If even that failure cannot be appended, the run ends without a terminal
event and its request is not marked finished: it is read again after a restart.
"""

from __future__ import annotations

import asyncio
import traceback
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from consumers.runtime.deadletter import DeadLetters
from consumers.runtime.delivery import FactLog
from consumers.runtime.invocation import (
    ApprovalPending,
    InvocationDeps,
    approval_received,
    failed_stage,
    run_invocation,
)
from consumers.runtime.invocation_facts import InvocationFacts
from consumers.steps.authorize import check_approver
from consumers.steps.derived_events import error_info, failed
from consumers.steps.execute import AttemptTakenOver
from contracts.envelope import Envelope
from contracts.errors import ErrorInfo
from domain.bounded import remember
from domain.errors import AuthorizationError, JobCancelled, ToolexecError

log = structlog.get_logger(__name__)

POISON_ATTEMPTS = 3
FINISHED_REMEMBERED = 10_000

Listener = Callable[[Envelope], None]


@dataclass(frozen=True, slots=True)
class RecordRef:
    """Where a request sits in the log, and its bytes (for a dead-letter record)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]


@dataclass
class Run:
    """One invocation running here (or expected by a local producer)."""

    invocation_id: str
    done: asyncio.Future[Envelope]
    listeners: list[Listener] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    on_done: list[Callable[[], None]] = field(default_factory=list)
    waiting: bool = False
    """Waiting for an approver: holds no slot, does not count as active."""
    partition: int | None = None
    """The requests partition of its request, once started."""
    handed_over: bool = False
    """Started from a local producer's hand-over rather than read from the log."""
    tool_id: str | None = None
    """The tool its request asks for, once started (whose approvers may decide)."""

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the run ended with its terminal event on the log."""
        if self.done.done() and not self.done.cancelled() and self.done.exception() is None:
            callback()
        else:
            self.on_done.append(callback)


class _ObservedLog:
    """A run's FactLog that tells the run's listeners about every appended fact."""

    def __init__(self, inner: FactLog, run: Run) -> None:
        self._inner = inner
        self._run = run

    async def append(self, events: Sequence[Envelope]) -> None:
        await self._inner.append(events)
        for event in events:
            for listener in self._run.listeners:
                listener(event)


class InvocationRuns:
    """Starts, joins, cancels and finishes the runs of this process."""

    def __init__(self, deps: InvocationDeps, dead_letters: DeadLetters, *, consumer: str,
                 max_in_flight: int = 32, observe: Listener | None = None) -> None:
        self._deps = deps
        self._dead_letters = dead_letters
        self._consumer = consumer
        self._slots = asyncio.Semaphore(max_in_flight)
        self._observe = observe
        self._runs: dict[str, Run] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._changed = asyncio.Event()

    def running(self, invocation_id: str) -> Run | None:
        """The run of `invocation_id` here (started or only expected), if any."""
        return self._runs.get(invocation_id)

    def finished_recently(self, invocation_id: str) -> bool:
        return invocation_id in self._finished

    @property
    def active(self) -> int:
        """Runs started and not ended (running or waiting for a slot), those waiting
        for an approver left out."""
        return sum(1 for run in self._runs.values() if run.task is not None and not run.waiting)

    @property
    def active_from_log(self) -> int:
        """Active runs whose request was read from the log (not handed over in memory)."""
        return sum(1 for run in self._runs.values()
                   if run.task is not None and not run.waiting and not run.handed_over)

    def expect(self, invocation_id: str, listener: Listener | None = None
               ) -> asyncio.Future[Envelope]:
        """A future of `invocation_id`'s terminal event, for a local producer about to
        send its request; `listener` sees every fact of the run as it is appended."""
        run = self._runs.get(invocation_id)
        if run is None:
            run = self._runs[invocation_id] = Run(
                invocation_id, asyncio.get_running_loop().create_future())
        if listener is not None:
            run.listeners.append(listener)
        return run.done

    def forget(self, invocation_id: str) -> None:
        """Drop an expected run that never started (its request was not delivered)."""
        run = self._runs.get(invocation_id)
        if run is not None and run.task is None:
            del self._runs[invocation_id]
            if not run.done.done():
                run.done.cancel()

    def start(self, request: Envelope, fact_log: FactLog, facts: InvocationFacts,
              source: RecordRef, on_done: Callable[[], None], *,
              handed_over: bool = False) -> Run:
        """Run `request` (resuming from `facts`) unless a run of it exists already,
        which it then joins; `on_done` is called once the terminal event is on the log.
        `handed_over`: the request came from a local producer, not from the log."""
        invocation_id = request.data.invocation_id
        run = self._runs.get(invocation_id)
        if run is None:
            run = self._runs[invocation_id] = Run(
                invocation_id, asyncio.get_running_loop().create_future())
        run.when_done(on_done)
        run.partition = source.partition
        run.tool_id = request.data.tool_id
        if run.task is None:
            run.handed_over = handed_over
            if self._observe is not None:
                self._observe(request)
            run.task = asyncio.create_task(
                self._run(run, request, _ObservedLog(fact_log, run), facts, source),
                name=f"invocation-{invocation_id}")
            self._changed.set()
        return run

    def cancel(self, invocation_id: str, reason: str | None) -> None:
        """Stop the invocation (now if it runs here, or when it arrives)."""
        self._deps.execute.cancellations.request(invocation_id, reason)

    def decide(self, decided: Envelope) -> ErrorInfo | None:
        """An approver's `tool.approval.decided`: kept, dated by this pipeline's clock,
        waking the run waiting for it, when it may count; None then. Why it cannot count
        otherwise (its E32xx code, for a dead-letter record): only decisions that may
        count take room. One for an invocation not running here is dropped (read after
        its request, so that invocation ended or was never requested)."""
        invocation_id = decided.data.invocation_id
        run = self._runs.get(invocation_id)
        if run is None or run.tool_id is None:
            log.info("approval.decision_without_run", invocation_id=invocation_id,
                     event_id=decided.id)
            return None
        try:
            check_approver(decided, run.tool_id, self._deps.authorize)
        except AuthorizationError as refused:
            return error_info(refused)
        self._deps.approvals.record(decided, read_at=self._deps.authorize.clock())
        return None

    def stop_waiting(self, partitions: set[int]) -> None:
        """Stop the runs of `partitions` waiting for an approver (the partitions moved
        to another owner, which reads the decision and waits or ends them)."""
        for run in self._runs.values():
            if run.waiting and run.partition in partitions and run.task is not None:
                run.task.cancel()

    async def wait_below(self, limit: int) -> None:
        """Wait until fewer than `limit` runs are active."""
        while self.active >= limit:
            self._changed.clear()
            await self._changed.wait()

    async def drain(self) -> None:
        """Wait for every started run to end (on shutdown); runs waiting for an
        approver are stopped (the next owner of their request waits again)."""
        for run in self._runs.values():
            if run.waiting and run.task is not None:
                run.task.cancel()
        tasks = [run.task for run in self._runs.values() if run.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, run: Run, request: Envelope, fact_log: FactLog,
                   facts: InvocationFacts, source: RecordRef) -> None:
        try:
            terminal = await self._until_terminal(run, request, fact_log, facts, source)
        except AttemptTakenOver as exc:  # its new owner ends it
            if not run.done.done():
                run.done.set_exception(exc)
            log.warning("invocation.taken_over", invocation_id=run.invocation_id, error=str(exc))
        except Exception as exc:  # not even its failure could be appended
            if not run.done.done():
                run.done.set_exception(exc)
            log.exception("invocation.unfinished", invocation_id=run.invocation_id)
        except BaseException:  # cancelled at shutdown: read again after the restart
            run.done.cancel()
            raise
        else:
            if not run.done.done():
                run.done.set_result(terminal)
            for callback in run.on_done:
                callback()
            remember(self._finished, run.invocation_id, None, FINISHED_REMEMBERED)
        finally:
            self._runs.pop(run.invocation_id, None)
            self._changed.set()

    async def _until_terminal(self, run: Run, request: Envelope, fact_log: FactLog,
                              facts: InvocationFacts, source: RecordRef) -> Envelope:
        """Run `request` in a slot; while it waits for an approver, without one."""
        while True:
            async with self._slots:
                try:
                    return await self._guarded(request, fact_log, facts, source)
                except ApprovalPending as waiting:
                    pending = waiting
            run.waiting = True
            self._changed.set()
            try:
                await self._wait_for_approval(pending)
                await self._note_received(pending.requested, fact_log, facts)
            finally:
                run.waiting = False

    async def _note_received(self, requested: Envelope, fact_log: FactLog,
                             facts: InvocationFacts) -> None:
        """Put the decision just read on the log (`tool.approval.received`) before the
        run waits for a slot, so a restart meanwhile judges it as read in time; if
        that append fails, the run appends it once it holds a slot."""
        received = approval_received(requested, facts, self._deps)
        if received is None:
            return
        try:
            await fact_log.append([received])
        except Exception as error:  # boundary: the run's approval gate appends it again
            log.warning("approval.received_not_appended", error=repr(error))
            return
        facts.add(received)

    async def _wait_for_approval(self, pending: ApprovalPending) -> None:
        """Until a new decision, the expiry or a cancel (the run then goes on, or ends
        accordingly)."""
        requested = pending.requested
        invocation_id = requested.data.invocation_id
        wait = self._deps.approvals.wait(invocation_id, pending.seen, requested.data.expires_at,
                                         self._deps.finalize.clock())
        try:
            await self._deps.execute.cancellations.interruptible(invocation_id, wait)
        except JobCancelled:
            return

    async def _guarded(self, request: Envelope, fact_log: FactLog, facts: InvocationFacts,
                       source: RecordRef) -> Envelope:
        last: BaseException | None = None
        with structlog.contextvars.bound_contextvars(invocation_id=request.correlationid,
                                                     event_id=request.id):
            for attempt in range(1, POISON_ATTEMPTS + 1):
                try:
                    return await run_invocation(request, facts, fact_log, self._deps)
                except (AttemptTakenOver, ApprovalPending):
                    raise
                except Exception as exc:  # boundary: becomes a dead-letter record below
                    last = exc
                    log.warning("invocation.failed_unexpectedly", attempt=attempt,
                                error=repr(exc))
            return await self._give_up(request, fact_log, facts, source, last)

    async def _give_up(self, request: Envelope, fact_log: FactLog, facts: InvocationFacts,
                       source: RecordRef, last: BaseException | None) -> Envelope:
        stage = failed_stage(facts)
        error = ToolexecError(
            f"the invocation failed {POISON_ATTEMPTS} times in its {stage} step: {last!r}",
            code="E3000",
            details={"step": stage,
                     "traceback": "".join(traceback.format_exception(last))[-4000:]},
        )
        await self._dead_letters.record(source, error.to_dict(), consumer=self._consumer,
                                        attempts=POISON_ATTEMPTS)
        data: Any = request.data
        failure = failed(request, error, stage=stage, invocation_id=data.invocation_id,
                         tool_id=data.tool_id, version=None, now=self._deps.finalize.clock())
        await fact_log.append([failure])
        return failure
