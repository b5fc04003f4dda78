"""Step 3 — execute: tool.permission.decided(allow) -> tool.execution.started/finished.

Re-reads the chain from the registry view and checks it is the one that was
resolved (same integrities), validates parameters against the leaf's schema
(E3301, every violation), claims `invocation_id/attempt` so a redelivery never runs
a tool twice, merges configs into the primitive's plan and runs it, retrying
retriable failures with full-jitter backoff per the manifest's retry_policy.

`tool.invoke.cancel.requested` stops an invocation here (see consumers.cancellation):
before its first attempt it never starts; a running attempt is interrupted and
finishes with E3703; a retry backoff ends and no further attempt runs. Each ends
with one terminal `tool.invoke.failed` E3703. A cancel of an invocation that already
ended here publishes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from consumers.admission import AttemptGate, enter_attempt, leave_attempt, outcome_past_deadline
from consumers.cancellation import Cancellations, JobCancelled
from consumers.events import derive, error_info, failed
from consumers.ports import ClaimStore, Clock, PrimitiveRunner, Publish, RegistryReader, Secrets
from contracts.envelope import Envelope
from contracts.errors import ErrorInfo
from contracts.events import (
    ExecutionFinished,
    ExecutionStarted,
    InvokeCancelRequested,
    PermissionDecided,
)
from contracts.kafka_binding import from_document, to_document
from domain.claims import ClaimDecision, ClaimRecord, ClaimStatus
from domain.credentials import REFERENCE, CredentialGrants, granted_secrets, references
from domain.errors import IntegrityMismatch, ToolexecError, ValidationFailed, VersionNotFound
from domain.integrity import verify_chain
from domain.model import HttpPlan, McpPlan, PrimitiveOutcome, ResolvedChain, SubprocessPlan
from domain.plan import build_plan
from domain.retry import RetryPolicy, backoff_delay, is_retriable
from domain.secret_scrub import Scrubber
from domain.validation import validate_parameters

EVENT_STDOUT_MAX = 512 * 1024
STDERR_TAIL = 2048


@dataclass(frozen=True)
class ExecuteDeps:
    registry: RegistryReader
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


async def on_cancel_requested(event: Envelope, deps: ExecuteDeps) -> None:
    """Remember the cancel and interrupt the invocation's running attempt, if any; the
    attempt loop publishes what follows (nothing when the invocation already ended)."""
    request: InvokeCancelRequested = event.data
    deps.cancellations.request(request.invocation_id, request.reason)


async def on_permission_decided(event: Envelope, deps: ExecuteDeps) -> None:
    decision: PermissionDecided = event.data
    if decision.decision != "allow":
        return
    try:
        chain = _chain_for(decision, deps.registry)
        leaf = chain.leaf
        _check_parameters(leaf.manifest, decision.parameters)
        plan = build_plan(chain)
        secrets = granted_secrets(chain, plan, deps.credential_grants, deps.secrets)
    except ToolexecError as error:
        await deps.publish(failed(event, error, stage="execute",
                                  invocation_id=decision.invocation_id,
                                  tool_id=decision.tool_id, version=decision.version,
                                  now=deps.clock()))
        return
    await _run_attempts(event, decision, chain, plan, dataclasses.replace(deps, secrets=secrets))


def _chain_for(decision: PermissionDecided, registry: RegistryReader) -> ResolvedChain:
    links = []
    for link in decision.chain:
        version = registry.get(link.tool_id, link.version)
        if version is None:
            raise VersionNotFound(f"{link.tool_id}@{link.version} is not in the registry view",
                                  details={"tool_id": link.tool_id, "version": link.version})
        if version.integrity != link.integrity:
            raise IntegrityMismatch(
                f"{link.tool_id}@{link.version} changed since it was resolved",
                details={"tool_id": link.tool_id, "version": link.version,
                         "expected": link.integrity, "actual": version.integrity},
            )
        links.append(version)
    chain = ResolvedChain(tuple(links))
    verify_chain(chain)
    return chain


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
                        plan: SubprocessPlan | HttpPlan | McpPlan, deps: ExecuteDeps) -> None:
    """Run attempts until one is final (`deps.secrets` is scoped to the chain's
    declared credentials). Each attempt's concluding event is stored with
    its claim *before* it is published (an outbox): a redelivery after a crash
    republishes that same event instead of concluding the attempt a second time."""
    manifest = chain.leaf.manifest
    policy = RetryPolicy.from_manifest(manifest)
    resolved_plan, secret_values = _resolve_env_secrets(plan, deps.secrets)
    attempt = 1
    while True:
        key = f"{decision.invocation_id}/{attempt}"
        claim = await _claim(key, plan.timeout_seconds, bool(manifest.get("idempotent")), deps)
        if claim.status is ClaimStatus.RUNNING_HERE:
            return  # a duplicate delivery of an attempt this process runs now
        if claim.status is ClaimStatus.FINISHED:
            if not await _republish(claim.record, deps):
                return
            attempt += 1  # that attempt asked for a retry: go on with the next one
            continue
        if claim.status is ClaimStatus.ABANDONED:
            await _conclude(key, _unknown(event, decision, attempt, manifest, deps), deps)
            return
        cancels = deps.cancellations
        try:
            if cancels.is_cancelled(decision.invocation_id):
                raise cancels.error(decision.invocation_id)
            passed = await cancels.interruptible(decision.invocation_id, enter_attempt(
                deps.gate, manifest, decision.deadline, plan.timeout_seconds,
                clock=deps.clock, sleep=deps.sleep))
        except ToolexecError as refused:  # E3002 deadline, E3501 breaker, E3504 rate
            # limit, E3703 cancelled before the attempt started
            await _conclude(key, failed(event, refused, stage="execute",
                                        invocation_id=decision.invocation_id,
                                        tool_id=decision.tool_id, version=decision.version,
                                        now=deps.clock()), deps)
            return
        await deps.publish(derive(event, _started(decision, attempt, plan, deps.runner.sandbox),
                                  step=f"execute.started.{attempt}", now=deps.clock()))
        started = time.perf_counter()
        try:
            outcome = await cancels.interruptible(decision.invocation_id, _run_primitive(
                deps, dataclasses.replace(resolved_plan, timeout_seconds=passed.timeout_seconds),
                decision.parameters))
        except JobCancelled as cancelled:
            outcome = PrimitiveOutcome(ok=False, error=cancelled.to_dict(),
                                       duration_ms=(time.perf_counter() - started) * 1000)
        finally:
            await leave_attempt(deps.gate, passed)
        outcome = outcome_past_deadline(outcome, passed)
        # A cancel seen as a retriable failure came in ends at the next attempt's
        # claim, with E3703, without running it.
        retry = attempt < policy.max_attempts and is_retriable(outcome, policy)
        finished = _finished(decision, attempt, outcome, manifest, secret_values, final=not retry)
        await _conclude(key, derive(event, finished, step=f"execute.finished.{attempt}",
                                    now=deps.clock()), deps)
        if not retry:
            return
        with contextlib.suppress(JobCancelled):  # the next attempt then ends as cancelled
            await cancels.interruptible(decision.invocation_id,
                                        deps.sleep(backoff_delay(attempt, policy, deps.random())))
        attempt += 1


async def _conclude(key: str, conclusion: Envelope, deps: ExecuteDeps) -> None:
    """Store the attempt's concluding event with its claim, then publish it."""
    await deps.claims.finish(key, to_document(conclusion))
    await deps.publish(conclusion)


async def _republish(record: ClaimRecord | None, deps: ExecuteDeps) -> bool:
    """Publish a finished attempt's stored conclusion again (same event id, so
    consumers de-duplicate it); True when that conclusion asked for another attempt."""
    if record is None or record.conclusion is None:
        return False
    conclusion = from_document(record.conclusion)
    await deps.publish(conclusion)
    data = conclusion.data
    return isinstance(data, ExecutionFinished) and not data.final


async def _claim(key: str, timeout: float, idempotent: bool, deps: ExecuteDeps) -> ClaimDecision:
    """Claim an attempt. A claim held by another live owner is waited out (its lease
    covers its timeout); an abandoned one is taken over when the tool is idempotent,
    and otherwise reported as ABANDONED so the outcome is recorded as unknown."""
    while True:
        now = deps.clock().timestamp()
        claim = await deps.claims.claim(key, now=now, lease_seconds=timeout)
        if claim.status is ClaimStatus.HELD_ELSEWHERE and claim.record is not None:
            await deps.sleep(min(max(claim.record.lease_until - now, 0.05), 1.0))
            continue
        if claim.status is ClaimStatus.ABANDONED and idempotent and claim.record is not None:
            if await deps.claims.take_over(claim.record, now=now, lease_seconds=timeout):
                return ClaimDecision(ClaimStatus.ACQUIRED, claim.record)
            continue  # another executor took it over first: its lease is waited out
        return claim


def _unknown(event: Envelope, decision: PermissionDecided, attempt: int,
             manifest: Mapping[str, Any], deps: ExecuteDeps) -> Envelope:
    """The executor that started this attempt stopped before finishing it, and the tool
    is not idempotent: it is not run again, and its outcome is recorded as unknown."""
    outcome = PrimitiveOutcome(ok=False, error={
        "code": "E3404",
        "message": "the executor stopped during this attempt; the tool is not idempotent, "
                   "so it was not run again and its outcome is unknown",
        "details": {"attempt": attempt}})
    finished = _finished(decision, attempt, outcome, manifest, (), final=True)
    return derive(event, finished, step=f"execute.finished.{attempt}", now=deps.clock())


async def _run_primitive(deps: ExecuteDeps, plan: SubprocessPlan | HttpPlan | McpPlan,
                         params: Mapping[str, Any]) -> PrimitiveOutcome:
    """Primitives report failures as outcomes; one that raises has a bug, and what the
    tool did is then unknown (E3404), which is recorded rather than lost."""
    try:
        return await deps.runner.run(plan, params, secrets=deps.secrets)
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
        result_schema=manifest.get("result_schema"), final=final,
    )


def _outcome_label(outcome: PrimitiveOutcome) -> str:
    if outcome.ok:
        return "success"
    return "unknown" if (outcome.error or {}).get("code") == "E3404" and outcome.exit_code is None \
        else "failure"
