"""One invocation, end to end: the step functions chained in process.

resolve -> authorize on the request (the token is checked where it arrives), then
execute, then finalize. The steps stay stateless functions of an event and the views;
this module only chains them and appends their facts to the log (the `FactLog` port)
in the order the design asks for:

- facts that do not gate each other leave together: the resolution and the decision
  are appended with the first `tool.execution.started` (or with the failure that ends
  the invocation before any attempt), the final `tool.execution.finished` with the
  terminal event it leads to;
- write-ahead: the decision and `tool.execution.started` are acknowledged by the
  broker before the tool starts, the terminal event before anyone is answered.

A run resumes from `InvocationFacts` (what the log already holds): a step whose fact
is there is not done again.

A call that needs approval (`tool.approval.requested` after the allow) stops before
its first attempt until an approver's decision for exactly this call arrives
(domain.approval): `run_invocation` then raises `ApprovalPending`, and its caller
waits (holding no execution slot) and runs it again. The approval request is on the
log before anyone waits, so a restarted pipeline waits again; the first decision read
that may count is on the log (`tool.approval.received`, timed when it was read) before
it is judged, so a restarted pipeline judges the same decision at the same time; once
an attempt has started the approval was honoured and is not asked again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from consumers.ports import Clock, RegistryReader
from consumers.runtime.delivery import FactLog
from consumers.runtime.invocation_facts import InvocationFacts
from consumers.steps.approvals import ApprovalDecisions, decision_of, received_fact
from consumers.steps.authorize import (
    AuthorizeDeps,
    approval_hash_of,
    authorize_request,
    denial_failure,
)
from consumers.steps.derived_events import failed
from consumers.steps.execute import ExecuteDeps, execute_decision
from consumers.steps.finalize import FinalizeDeps, finalize_execution
from consumers.steps.resolve import Resolved, ResolveDeps, chain_from_links, resolve_request
from contracts.envelope import Envelope
from domain.approval import check_approval
from domain.errors import ToolexecError
from domain.model import ResolvedChain


@dataclass(frozen=True)
class InvocationDeps:
    """The steps' ports; `execute.publish` is replaced by each run's own appender."""

    resolve: ResolveDeps
    authorize: AuthorizeDeps
    execute: ExecuteDeps
    finalize: FinalizeDeps
    registry: RegistryReader
    approvals: ApprovalDecisions = field(default_factory=ApprovalDecisions)
    """The approvers' decisions read by this pipeline."""


class ApprovalPending(Exception):
    """The run waits for an approver's decision on `requested` (tool.approval.requested),
    `seen` decisions read so far (none of which counts)."""

    def __init__(self, requested: Envelope, seen: int) -> None:
        super().__init__(f"{requested.data.invocation_id} waits for approval")
        self.requested = requested
        self.seen = seen


def invocation_deps(*, registry: RegistryReader, clock: Clock, authorize: AuthorizeDeps,
                    resolve: Mapping[str, Any] | None = None,
                    **execute: Any) -> InvocationDeps:
    """The steps' ports around one registry view and one clock: `resolve` holds the
    resolver's options (strict_chain, registry_wait_seconds, max_parameter_bytes),
    `execute` the executor's ports (runner, claims, secrets, random, and optionally
    sleep, gate, credential_grants). The one wiring of the steps, for a running
    system (toolexec.stack) and for the tests alike."""
    return InvocationDeps(
        resolve=ResolveDeps(registry=registry, clock=clock, **dict(resolve or {})),
        authorize=authorize,
        execute=ExecuteDeps(publish=_publish_through_the_run, clock=clock, **execute),
        finalize=FinalizeDeps(clock=clock),
        registry=registry,
    )


async def _publish_through_the_run(envelope: Envelope) -> None:
    raise AssertionError("each run publishes through its own fact log")


class _Appender:
    """Appends a run's facts, holding back the staged ones until the next append,
    and records every acknowledged fact in the run's `facts`."""

    def __init__(self, log: FactLog, facts: InvocationFacts) -> None:
        self._log = log
        self._facts = facts
        self._staged: list[Envelope] = []

    def stage(self, *events: Envelope) -> None:
        self._staged.extend(events)

    async def append(self, *events: Envelope) -> None:
        batch = [*self._staged, *events]
        self._staged = []
        if batch:
            await self._log.append(batch)
            self._facts.add_all(batch)

    async def publish(self, event: Envelope) -> None:
        """The execute step's Publish port."""
        await self.append(event)


async def run_invocation(request: Envelope, facts: InvocationFacts, log: FactLog,
                         deps: InvocationDeps) -> Envelope:
    """Run `request` from where `facts` leave it to its terminal event, which is
    returned once it is on the log. `facts` is updated with every fact appended."""
    if facts.terminal is not None:
        return facts.terminal
    out = _Appender(log, facts)
    decision = facts.decision
    if decision is None:
        decided = await _decide(request, facts, out, deps)
        if isinstance(decided, Envelope):  # the failure that ends it
            await out.append(decided)
            return decided
        decision, chain = decided
    elif decision.data.decision == "deny":
        failure = denial_failure(decision, decision.data, now=deps.finalize.clock())
        await out.append(failure)
        return failure
    else:
        try:
            chain = chain_from_links(decision.data.chain, deps.registry)
        except ToolexecError as error:
            failure = _failure(decision, error, stage="execute", deps=deps)
            await out.append(failure)
            return failure
    refused = await _approval_gate(decision, facts, out, deps)
    if refused is not None:
        return refused
    conclusion = await execute_decision(decision, chain,
                                        dataclasses.replace(deps.execute, publish=out.publish),
                                        facts.attempts(), lockfile=request.data.lockfile)
    if conclusion.type != "tool.execution.finished":
        await out.append(conclusion)
        return conclusion
    terminal = finalize_execution(conclusion, deps.finalize)
    if conclusion.data.attempt in facts.finished:  # on the log already (a resumed run)
        await out.append(terminal)
    else:
        await out.append(conclusion, terminal)
    return terminal


async def _decide(request: Envelope, facts: InvocationFacts, out: _Appender,
                  deps: InvocationDeps) -> tuple[Envelope, ResolvedChain] | Envelope:
    """The chain and the allowing decision (both staged), or the terminal failure."""
    if facts.resolved is None:
        resolved = await resolve_request(request, deps.resolve)
        if not isinstance(resolved, Resolved):
            return resolved
        chain, resolution = resolved.chain, resolved.event
        out.stage(resolution)
    else:
        resolution = facts.resolved
        try:
            chain = chain_from_links(resolution.data.chain, deps.registry)
        except ToolexecError as error:
            return _failure(resolution, error, stage="resolve", deps=deps)
    decided = await authorize_request(request, resolution, chain, deps.authorize)
    if decided[0].data.decision == "deny":  # then its failure
        out.stage(decided[0])
        return decided[1]
    out.stage(*decided)
    if len(decided) > 1:  # the approval request: on the log before anyone waits for it
        await out.append()
    return decided[0], chain


async def _approval_gate(decision: Envelope, facts: InvocationFacts, out: _Appender,
                         deps: InvocationDeps) -> Envelope | None:
    """None when the allowed call may run; its terminal failure when its approval was
    denied, expired, does not match or it was cancelled while waiting. Raises
    ApprovalPending while it waits."""
    requested = facts.approval_requested
    if requested is None or facts.started:  # none needed, or honoured before an attempt
        return None
    invocation_id = decision.data.invocation_id
    cancels = deps.execute.cancellations
    received = approval_received(requested, facts, deps)
    if received is not None:
        await out.append(received)
    counted = None if facts.approval_received is None else decision_of(facts.approval_received)
    try:
        if cancels.is_cancelled(invocation_id):
            raise cancels.error(invocation_id)
        if check_approval(approval_hash_of(decision.data), requested.data.expires_at,
                          counted, deps.finalize.clock()):
            return None
    except ToolexecError as error:
        failure = _failure(requested, error, stage="authorize", deps=deps)
        await out.append(failure)
        return failure
    raise ApprovalPending(requested, seen=len(deps.approvals.decisions(invocation_id)))


def approval_received(requested: Envelope, facts: InvocationFacts,
                      deps: InvocationDeps) -> Envelope | None:
    """The `tool.approval.received` fact still to append for the call waiting for
    `requested`: of the first decision read for it that may count; None when the log
    holds one already or no decision was read."""
    if facts.approval_received is not None:
        return None
    read = deps.approvals.decisions(requested.data.invocation_id)
    return received_fact(requested, read[0]) if read else None


def _failure(cause: Envelope, error: ToolexecError, *, stage: str,
             deps: InvocationDeps) -> Envelope:
    data = cause.data
    return failed(cause, error, stage=stage, invocation_id=data.invocation_id,
                  tool_id=getattr(data, "tool_id", None), version=getattr(data, "version", None),
                  now=deps.finalize.clock())


def failed_stage(facts: InvocationFacts) -> str:
    """The step an invocation had reached, by its facts (for a run that gave up)."""
    if facts.resolved is None:
        return "resolve"
    if facts.decision is None or (facts.approval_requested is not None and not facts.started):
        return "authorize"
    return "execute"

