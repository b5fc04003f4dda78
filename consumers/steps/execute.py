"""Step 3 — execute: an allowed invocation -> tool.execution.started/finished.

Validates parameters against the leaf's schema (E3301, every violation), claims
`invocation_id/attempt` so a redelivery never runs a tool twice, merges configs into
the primitive's plan and runs it, retrying retriable failures with full-jitter
backoff per the manifest's retry_policy. Each `tool.execution.started` is on the log
(acknowledged) before its attempt starts.

`tool.invoke.cancel.requested` stops an invocation here (see consumers.steps.cancellation):
before its first attempt it never starts; a running attempt is interrupted and
finishes with E3703; a retry backoff ends and no further attempt runs. Each ends
with one terminal `tool.invoke.failed` E3703.

An invocation resumed after a restart passes what the log already holds of its
attempts (`AttemptsOnLog`): finished attempts are not run again, and an attempt whose
claim was abandoned by a dead executor is run again when its `started` fact never
reached the log (the tool cannot have started), else it is recorded as unknown
(E3404) unless the tool is idempotent — or resumable (`checkpoint_config.enabled`):
the interrupted attempt is then concluded as unknown, not final, and the next one
starts from the invocation's last checkpoint (at most MAX_RESUMES times).

A subprocess tool's reports (progress, checkpoints) become facts while it runs
(consumers.steps.tool_reports); every attempt of a resumable tool after a checkpoint starts
with that checkpoint's state (E3903/E3904 fail the invocation when it cannot be
restored).

An MCP tool's attempt first checks the definition its server announces against the
tool's pin (consumers.steps.definitions, when `ExecuteDeps.definitions` is wired): a
drifted or unlocked definition ends the attempt with E3108, not retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from consumers.ports import (
    CheckpointStore,
    ClaimStore,
    Clock,
    PrimitiveRunner,
    Publish,
    Secrets,
)
from consumers.steps.admission import (
    AttemptGate,
    enter_attempt,
    leave_attempt,
    may_wait,
    outcome_past_deadline,
)
from consumers.steps.cancellation import Cancellations, JobCancelled
from consumers.steps.definitions import DefinitionDeps, admit_definition
from consumers.steps.derived_events import derive, error_info, failed
from consumers.steps.tool_reports import AttemptReports, ReportTrail
from contracts.envelope import Envelope
from contracts.errors import ErrorInfo
from contracts.events import ExecutionFinished, ExecutionStarted, PermissionDecided
from contracts.kafka_binding import from_document, to_document
from domain.claims import ClaimDecision, ClaimStatus
from domain.credentials import REFERENCE, CredentialGrants, granted_secrets, references
from domain.errors import ToolexecError, ValidationFailed
from domain.lockfile import locked_definition
from domain.model import HttpPlan, McpPlan, PrimitiveOutcome, ResolvedChain, SubprocessPlan
from domain.plan import build_plan
from domain.redaction import secret_parameter_values
from domain.result import output_format
from domain.retry import RetryPolicy, backoff_delay, is_retriable
from domain.secret_scrub import Scrubber
from domain.validation import validate_parameters

EVENT_STDOUT_MAX = 512 * 1024
STDERR_TAIL = 2048
MAX_RESUMES = 10
"""Interrupted attempts of a resumable tool resumed per invocation; past them an
interrupted attempt ends the invocation as unknown (E3404), as for other tools."""


@dataclass(frozen=True)
class ExecuteDeps:
    publish: Publish
    clock: Clock
    runner: PrimitiveRunner
    claims: ClaimStore
    secrets: Secrets
    random: Callable[[], float]
    sleep: Callable[[float], Any] = asyncio.sleep
    gate: AttemptGate = dataclasses.field(default_factory=AttemptGate)
    cancellations: Cancellations = dataclasses.field(default_factory=Cancellations)
    credential_grants: CredentialGrants = dataclasses.field(default_factory=CredentialGrants)
    """The operator's credential grants (TOOLEXEC_CREDENTIAL_GRANTS); none by default."""
    checkpoints: CheckpointStore | None = None
    """Where tools' checkpoint states are kept (None: checkpoints are dropped)."""
    definitions: DefinitionDeps | None = None
    """MCP tool definitions pinned and checked before each call; None: not checked."""


class AttemptTakenOver(Exception):
    """Another executor took this attempt's claim over (it found it abandoned: this
    executor stalled past its lease) and concludes it; this run must not."""


@dataclass(frozen=True)
class AttemptsOnLog:
    """What the log holds of an invocation's attempts: the numbers of those started,
    the `tool.execution.finished` event of those finished, and what they reported
    (shared with the run, which keeps it up to date)."""

    started: frozenset[int] = frozenset()
    finished: Mapping[int, Envelope] = field(default_factory=dict)
    reports: ReportTrail = field(default_factory=ReportTrail)


NOTHING_ON_LOG = AttemptsOnLog()


async def execute_decision(event: Envelope, chain: ResolvedChain, deps: ExecuteDeps,
                           on_log: AttemptsOnLog = NOTHING_ON_LOG,
                           lockfile: Mapping[str, Any] | None = None) -> Envelope:
    """Run the invocation allowed by `event` (tool.permission.decided) on `chain` to its
    final conclusion: the final `tool.execution.finished`, or a `tool.invoke.failed`.
    `lockfile` is the request's (verified at resolution): the definition hash it pins
    for an MCP tool is then the only one called.

    Facts on the way (each attempt's started, a retried attempt's finished) are
    published through `deps.publish` as they happen; the final conclusion is stored
    with its claim and returned, not published: the caller appends it together with
    the terminal event it leads to."""
    decision: PermissionDecided = event.data
    try:
        leaf = chain.leaf
        _check_parameters(leaf.manifest, decision.parameters)
        plan = build_plan(chain)
        secrets = granted_secrets(chain, plan, deps.credential_grants, deps.secrets)
        locked = None if lockfile is None else locked_definition(lockfile)
    except ToolexecError as error:
        return failed(event, error, stage="execute", invocation_id=decision.invocation_id,
                      tool_id=decision.tool_id, version=decision.version, now=deps.clock())
    scoped = dataclasses.replace(deps, secrets=secrets)
    return await _run_attempts(event, decision, chain, plan, scoped, on_log,
                               _admission(chain, plan, scoped, locked))


Admission = Callable[[McpPlan], Awaitable[str]]


def _admission(chain: ResolvedChain, plan: SubprocessPlan | HttpPlan | McpPlan,
               deps: ExecuteDeps, locked: str | None) -> Admission | None:
    """The definition check of an MCP tool's calls (None for other tools, or when
    definitions are not checked): the hash the call must still see."""
    definitions = deps.definitions
    if definitions is None or not isinstance(plan, McpPlan):
        return None
    server = chain.links[1]

    async def admit(resolved: McpPlan) -> str:
        return await admit_definition(resolved, server, definitions, secrets=deps.secrets,
                                      locked=locked)

    return admit


def _check_parameters(manifest: Mapping[str, Any], params: Mapping[str, Any]) -> None:
    schema = manifest.get("parameters") or {"type": "object"}
    issues = validate_parameters(schema, params)
    errors = [issue for issue in issues if issue.severity == "error"]
    if errors:
        raise ValidationFailed(
            f"parameters violate the tool's schema ({len(errors)} issue(s))",
            code="E3301",
            details={"issues": [issue.to_dict() for issue in errors]},
        )


async def _run_attempts(event: Envelope, decision: PermissionDecided, chain: ResolvedChain,
                        plan: SubprocessPlan | HttpPlan | McpPlan, deps: ExecuteDeps,
                        on_log: AttemptsOnLog, admit: Admission | None = None) -> Envelope:
    """Run attempts until one is final (`deps.secrets` is scoped to the chain's
    declared credentials); returns the final conclusion. Each attempt's concluding
    event is stored with its claim before it leaves (an outbox): a redelivery after a
    crash uses that same event instead of concluding the attempt a second time."""
    manifest = chain.leaf.manifest
    policy = RetryPolicy.from_manifest(manifest)
    resolved_plan, secret_values = _resolve_env_secrets(plan, deps.secrets)
    secret_values += secret_parameter_values(manifest.get("parameters"), decision.parameters)
    resumable = resumable_tool(manifest)
    attempt = 1
    interrupted = 0  # attempts resumed after their executor died: not tries of the tool
    while True:
        on_record = on_log.finished.get(attempt)
        if on_record is not None:  # concluded before a restart: never run again
            if on_record.data.final:
                return on_record
            interrupted += _was_resumed(on_record)
            attempt += 1
            continue
        key = f"{decision.invocation_id}/{attempt}"
        claim = await _claim(key, plan.timeout_seconds, bool(manifest.get("idempotent")),
                             attempt not in on_log.started, deps)
        if claim.status is ClaimStatus.FINISHED:
            conclusion = _stored_conclusion(claim)
            if conclusion is None or _is_final(conclusion):
                return conclusion or _unknown(event, decision, attempt, manifest, deps)
            await deps.publish(conclusion)
            interrupted += _was_resumed(conclusion)
            attempt += 1  # that attempt asked for a retry or a resume: go on with the next
            continue
        if claim.status in _LEFT_UNFINISHED:
            if resumable and interrupted < MAX_RESUMES:
                await deps.publish(await _conclude(
                    key, _unknown(event, decision, attempt, manifest, deps, resumed=True), deps))
                interrupted += 1
                attempt += 1  # the next attempt resumes from the last checkpoint
                continue
            return await _conclude(key, _unknown(event, decision, attempt, manifest, deps), deps)
        cancels = deps.cancellations
        try:
            if cancels.is_cancelled(decision.invocation_id):
                raise cancels.error(decision.invocation_id)
            resume = await on_log.reports.resume_state(deps.checkpoints) if resumable else None
            entering = enter_attempt(deps.gate, manifest, decision.deadline,
                                     plan.timeout_seconds, clock=deps.clock, sleep=deps.sleep)
            # Only checks that may wait need a task a cancel can stop; the others end at
            # once (a task would cost the attempt a turn of the event loop).
            passed = await (cancels.interruptible(decision.invocation_id, entering)
                            if may_wait(deps.gate, manifest) else entering)
        except ToolexecError as refused:  # E3002 deadline, E3501 breaker, E3504 rate
            # limit, E3703 cancelled before the attempt started, E3903/E3904 the
            # checkpoint to resume from cannot be restored
            return await _conclude(key, failed(event, refused, stage="execute",
                                               invocation_id=decision.invocation_id,
                                               tool_id=decision.tool_id,
                                               version=decision.version,
                                               now=deps.clock()), deps)
        try:
            if not await deps.claims.start(key):
                raise AttemptTakenOver(f"attempt {key} was taken over by another executor")
            await deps.publish(derive(event, _started(decision, attempt, plan,
                                                      deps.runner.sandbox),
                                      step=f"execute.started.{attempt}", now=deps.clock()))
        except BaseException:
            await leave_attempt(deps.gate, passed)
            raise
        started = time.perf_counter()
        reports = AttemptReports(event, attempt, on_log.reports, deps.publish, deps.clock,
                                 deps.checkpoints, Scrubber(secret_values), resume=resume)
        try:
            outcome = await cancels.interruptible(decision.invocation_id, _run_primitive(
                deps, dataclasses.replace(resolved_plan, timeout_seconds=passed.timeout_seconds),
                decision.parameters, reports, admit))
        except JobCancelled as cancelled:
            outcome = PrimitiveOutcome(ok=False, error=cancelled.to_dict(),
                                       duration_ms=(time.perf_counter() - started) * 1000)
        finally:
            await leave_attempt(deps.gate, passed)
        outcome = outcome_past_deadline(outcome, passed)
        # A cancel seen as a retriable failure came in ends at the next attempt's
        # claim, with E3703, without running it.
        tries = attempt - interrupted
        retry = tries < policy.max_attempts and is_retriable(outcome, policy)
        finished = derive(event, _finished(decision, attempt, outcome, manifest, secret_values,
                                           final=not retry),
                          step=f"execute.finished.{attempt}", now=deps.clock())
        await _conclude(key, finished, deps)
        if not retry:
            return finished
        await deps.publish(finished)
        with contextlib.suppress(JobCancelled):  # the next attempt then ends as cancelled
            await cancels.interruptible(decision.invocation_id,
                                        deps.sleep(backoff_delay(tries, policy, deps.random())))
        attempt += 1


_LEFT_UNFINISHED = frozenset({ClaimStatus.ABANDONED, ClaimStatus.RUNNING_HERE})
"""An attempt whose claim an executor left without concluding it: a dead one
(abandoned) or this one, when an earlier run of the invocation here failed (one run
of an invocation exists at a time in a process, see consumers.runtime.invocation)."""


def _is_final(conclusion: Envelope) -> bool:
    data = conclusion.data
    return not isinstance(data, ExecutionFinished) or data.final


async def _conclude(key: str, conclusion: Envelope, deps: ExecuteDeps) -> Envelope:
    """Store the attempt's concluding event with its claim; returns it. Raises
    AttemptTakenOver when the claim is no longer this executor's."""
    if not await deps.claims.finish(key, to_document(conclusion)):
        raise AttemptTakenOver(f"attempt {key} was taken over by another executor")
    return conclusion


def _stored_conclusion(claim: ClaimDecision) -> Envelope | None:
    """A finished attempt's stored conclusion (same event id as when it was first
    concluded, so consumers de-duplicate it); None when none was stored."""
    record = claim.record
    if record is None or record.conclusion is None:
        return None
    return from_document(record.conclusion)


async def _claim(key: str, timeout: float, idempotent: bool, never_started: bool,
                 deps: ExecuteDeps) -> ClaimDecision:
    """Claim an attempt. A claim held by another live owner is waited out (its lease
    covers its timeout); a claim left unfinished is taken over, then run again when
    the tool cannot have started (its owner never marked it started, and no started
    fact of it is on the log) or is idempotent, and otherwise reported as ABANDONED so
    the outcome is recorded as unknown (by this executor alone: the take-over is
    atomic, and the old owner can then neither start nor conclude it)."""
    while True:
        now = deps.clock().timestamp()
        claim = await deps.claims.claim(key, now=now, lease_seconds=timeout)
        if claim.status is ClaimStatus.HELD_ELSEWHERE and claim.record is not None:
            await deps.sleep(min(max(claim.record.lease_until - now, 0.05), 1.0))
            continue
        if claim.status in _LEFT_UNFINISHED and claim.record is not None:
            if not await deps.claims.take_over(claim.record, now=now, lease_seconds=timeout):
                continue  # another executor took it over first: its lease is waited out
            rerun = idempotent or (never_started and not claim.record.started)
            return ClaimDecision(ClaimStatus.ACQUIRED if rerun else ClaimStatus.ABANDONED,
                                 claim.record)
        return claim


def resumable_tool(manifest: Mapping[str, Any]) -> bool:
    """Whether the tool declares itself resumable from its checkpoints."""
    config = manifest.get("checkpoint_config")
    return isinstance(config, Mapping) and config.get("enabled") is True


def _was_resumed(conclusion: Envelope) -> bool:
    """Whether an attempt ended because its executor died and the next one resumes it."""
    data = conclusion.data
    return isinstance(data, ExecutionFinished) and data.error is not None \
        and data.error.details.get("resumed") is True


def _unknown(event: Envelope, decision: PermissionDecided, attempt: int,
             manifest: Mapping[str, Any], deps: ExecuteDeps, *,
             resumed: bool = False) -> Envelope:
    """The executor that started this attempt stopped before finishing it: its outcome
    is recorded as unknown. The tool is not idempotent, so it is not run again; or,
    `resumed`, it is resumable and the next attempt starts from its last checkpoint
    (this conclusion is then not final)."""
    message = ("the executor stopped during this attempt; the next attempt resumes from "
               "the last checkpoint") if resumed else (
        "the executor stopped during this attempt; the tool is not idempotent, so it was "
        "not run again and its outcome is unknown")
    details: dict[str, Any] = {"attempt": attempt} | ({"resumed": True} if resumed else {})
    outcome = PrimitiveOutcome(ok=False, error={"code": "E3404", "message": message,
                                                "details": details})
    finished = _finished(decision, attempt, outcome, manifest, (), final=not resumed)
    return derive(event, finished, step=f"execute.finished.{attempt}", now=deps.clock())


async def _run_primitive(deps: ExecuteDeps, plan: SubprocessPlan | HttpPlan | McpPlan,
                         params: Mapping[str, Any], reports: AttemptReports,
                         admit: Admission | None = None) -> PrimitiveOutcome:
    """Primitives report failures as outcomes; one that raises has a bug, and what the
    tool did is then unknown (E3404), which is recorded rather than lost. A subprocess
    tool's reports go to `reports`; what waits in it goes out when the tool ended. An
    MCP call is first admitted by its definition check (a refusal is the outcome)."""
    try:
        if not isinstance(plan, SubprocessPlan):
            if admit is not None and isinstance(plan, McpPlan):
                plan = dataclasses.replace(plan, definition_hash=await admit(plan))
            return await deps.runner.run(plan, params, secrets=deps.secrets)
        outcome = await deps.runner.run(plan, params, secrets=deps.secrets, session=reports)
        try:
            await reports.finish()
        except ToolexecError as refused:  # its last checkpoint could not be stored
            return dataclasses.replace(outcome, ok=False, error=refused.to_dict())
        return outcome
    except ToolexecError as refused:  # E3108, or the server could not list its tools
        return PrimitiveOutcome(ok=False, error=refused.to_dict())
    except Exception as exc:  # boundary: becomes an execution.finished with outcome unknown
        return PrimitiveOutcome(ok=False, error={
            "code": "E3404", "message": f"primitive failed unexpectedly: {exc!r}",
            "details": {"exception": type(exc).__name__}})


def _resolve_env_secrets(plan: SubprocessPlan | HttpPlan | McpPlan, secrets: Secrets
                         ) -> tuple[SubprocessPlan | HttpPlan | McpPlan, tuple[str, ...]]:
    """Fill `${NAME}` references in a subprocess environment (a stdio MCP server's
    too) just in time (the http primitive fills its headers itself). The values go to
    the process only; they are returned so outputs can be scrubbed of them."""
    values = tuple(v for name in references(plan) if (v := secrets(name)) is not None)
    if isinstance(plan, McpPlan) and plan.server is not None:
        return dataclasses.replace(plan, server=_filled_env(plan.server, secrets)), values
    if not isinstance(plan, SubprocessPlan):
        return plan, values
    return _filled_env(plan, secrets), values


def _filled_env(plan: SubprocessPlan, secrets: Secrets) -> SubprocessPlan:
    env = {key: REFERENCE.sub(lambda m: secrets(m.group(1)) or "", value)
           for key, value in plan.env.items()}
    return dataclasses.replace(plan, env=env)


def _plan_summary(plan: SubprocessPlan | HttpPlan | McpPlan) -> dict[str, Any]:
    if isinstance(plan, McpPlan):
        inner = plan.server or plan.endpoint
        assert inner is not None
        return {"mcp_server": plan.server_key, "mcp_tool": plan.tool_name,
                "transport": plan.transport, "timeout_seconds": plan.timeout_seconds,
                "server": _plan_summary(inner)}
    if isinstance(plan, SubprocessPlan):
        return {"argv": list(plan.argv), "cwd": plan.cwd, "timeout_seconds": plan.timeout_seconds,
                "env_keys": sorted(plan.env)}
    return {"method": plan.method, "url_template": plan.url_template,
            "header_names": sorted(plan.headers), "timeout_seconds": plan.timeout_seconds}


def _started(decision: PermissionDecided, attempt: int,
             plan: SubprocessPlan | HttpPlan | McpPlan, sandbox: str) -> ExecutionStarted:
    if isinstance(plan, McpPlan):
        primitive = plan.primitive
    else:
        primitive = "subprocess" if isinstance(plan, SubprocessPlan) else "http_client"
    return ExecutionStarted(
        invocation_id=decision.invocation_id, attempt=attempt, tool_id=decision.tool_id,
        version=decision.version, primitive=primitive,
        sandbox=sandbox,
        plan_summary=_plan_summary(plan),
    )


def _finished(decision: PermissionDecided, attempt: int, outcome: PrimitiveOutcome,
              manifest: Mapping[str, Any], secret_values: tuple[str, ...], *,
              final: bool) -> ExecutionFinished:
    """The attempt's event, every string that left the run scrubbed of the run's
    credential values and their encodings (domain.secret_scrub) before it exists."""
    scrub = Scrubber(secret_values)
    stdout = scrub.text(outcome.stdout.decode("utf-8", errors="replace"))
    stdout_truncated = outcome.stdout_truncated or len(stdout) > EVENT_STDOUT_MAX
    stderr = scrub.text(outcome.stderr.decode("utf-8", errors="replace"))
    error = None
    if outcome.error is not None:
        raw = dict(outcome.error)
        error = ErrorInfo(code=str(raw.get("code", "E3401")),
                          message=scrub.text(str(raw.get("message", ""))),
                          details=scrub.value(dict(raw.get("details") or {})))
    elif not outcome.ok:
        error = error_info(ToolexecError("tool execution failed", code="E3401"))
    return ExecutionFinished(
        invocation_id=decision.invocation_id, attempt=attempt, tool_id=decision.tool_id,
        version=decision.version, outcome=_outcome_label(outcome),
        exit_code=outcome.exit_code, status_code=outcome.status_code,
        duration_ms=outcome.duration_ms, stdout=stdout[:EVENT_STDOUT_MAX],
        stdout_truncated=stdout_truncated, stderr_tail=stderr[-STDERR_TAIL:],
        stderr_truncated=outcome.stderr_truncated or len(stderr) > STDERR_TAIL,
        result=None, error=error, external_service=manifest.get("external_service"),
        result_schema=manifest.get("result_schema"), output_format=output_format(manifest),
        final=final,
    )


def _outcome_label(outcome: PrimitiveOutcome) -> str:
    if outcome.ok:
        return "success"
    return "unknown" if (outcome.error or {}).get("code") == "E3404" and outcome.exit_code is None \
        else "failure"
