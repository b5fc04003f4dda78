"""Step 3 — execute: tool.permission.decided(allow) -> tool.execution.started/finished.

Re-reads the chain from the registry view and checks it is the one that was
resolved (same integrities), validates parameters against the leaf's schema
(E3301, every violation), claims `invocation_id/attempt` so a redelivery never runs
a tool twice, merges configs into the primitive's plan and runs it, retrying
retriable failures with full-jitter backoff per the manifest's retry_policy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from consumers.events import derive, error_info, failed
from consumers.ports import ClaimStore, Clock, PrimitiveRunner, Publish, RegistryReader, Secrets
from contracts.envelope import Envelope
from contracts.errors import ErrorInfo
from contracts.events import ExecutionFinished, ExecutionStarted, PermissionDecided
from domain.claims import ClaimStatus
from domain.errors import IntegrityMismatch, ToolexecError, ValidationFailed, VersionNotFound
from domain.integrity import verify_chain
from domain.model import HttpPlan, PrimitiveOutcome, ResolvedChain, SubprocessPlan
from domain.plan import build_plan
from domain.redaction import REDACTED
from domain.retry import RetryPolicy, backoff_delay, is_retriable
from domain.validation import validate_parameters

EVENT_STDOUT_MAX = 512 * 1024
STDERR_TAIL = 2048
_SECRET_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


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


async def on_permission_decided(event: Envelope, deps: ExecuteDeps) -> None:
    decision: PermissionDecided = event.data
    if decision.decision != "allow":
        return
    try:
        chain = _chain_for(decision, deps.registry)
        leaf = chain.leaf
        _check_parameters(leaf.manifest, decision.parameters)
        plan = build_plan(chain)
    except ToolexecError as error:
        await deps.publish(failed(event, error, stage="execute",
                                  invocation_id=decision.invocation_id,
                                  tool_id=decision.tool_id, version=decision.version,
                                  now=deps.clock()))
        return
    await _run_attempts(event, decision, chain, plan, deps)


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
                        plan: SubprocessPlan | HttpPlan, deps: ExecuteDeps) -> None:
    manifest = chain.leaf.manifest
    policy = RetryPolicy.from_manifest(manifest)
    resolved_plan, secret_values = _resolve_env_secrets(plan, deps.secrets)
    attempt = 1
    while True:
        key = f"{decision.invocation_id}/{attempt}"
        status = await _claim(key, plan.timeout_seconds, bool(manifest.get("idempotent")), deps)
        if status is ClaimStatus.FINISHED or status is ClaimStatus.RUNNING_HERE:
            return  # another delivery of this event already ran, or runs, this attempt
        if status is ClaimStatus.ABANDONED:
            await _publish_unknown(event, decision, attempt, manifest, deps)
            await deps.claims.finish(key)
            return
        await deps.publish(derive(event, _started(decision, attempt, plan, deps.runner.sandbox),
                                  step=f"execute.started.{attempt}", now=deps.clock()))
        outcome = await _run_primitive(deps, resolved_plan, decision.parameters)
        retry = attempt < policy.max_attempts and is_retriable(outcome, policy)
        finished = _finished(decision, attempt, outcome, manifest, secret_values, final=not retry)
        await deps.publish(derive(event, finished, step=f"execute.finished.{attempt}",
                                  now=deps.clock()))
        await deps.claims.finish(key)
        if not retry:
            return
        await deps.sleep(backoff_delay(attempt, policy, deps.random()))
        attempt += 1


async def _claim(key: str, timeout: float, idempotent: bool, deps: ExecuteDeps) -> ClaimStatus:
    """Claim an attempt. A claim held by another live owner is waited out (its lease
    covers its timeout); an abandoned one is taken over when the tool is idempotent,
    and otherwise reported as ABANDONED so the outcome is recorded as unknown."""
    while True:
        now = deps.clock().timestamp()
        claim = await deps.claims.claim(key, now=now, lease_seconds=timeout)
        if claim.status is ClaimStatus.HELD_ELSEWHERE and claim.record is not None:
            await deps.sleep(min(max(claim.record.lease_until - now, 0.05), 1.0))
            continue
        if claim.status is ClaimStatus.ABANDONED and idempotent:
            await deps.claims.take_over(key, now=now, lease_seconds=timeout)
            return ClaimStatus.ACQUIRED
        return claim.status


async def _publish_unknown(event: Envelope, decision: PermissionDecided, attempt: int,
                           manifest: Mapping[str, Any], deps: ExecuteDeps) -> None:
    """The executor that started this attempt stopped before finishing it, and the tool
    is not idempotent: it is not run again, and its outcome is recorded as unknown."""
    outcome = PrimitiveOutcome(ok=False, error={
        "code": "E3404",
        "message": "the executor stopped during this attempt; the tool is not idempotent, "
                   "so it was not run again and its outcome is unknown",
        "details": {"attempt": attempt}})
    finished = _finished(decision, attempt, outcome, manifest, (), final=True)
    await deps.publish(derive(event, finished, step=f"execute.finished.{attempt}",
                              now=deps.clock()))


async def _run_primitive(deps: ExecuteDeps, plan: SubprocessPlan | HttpPlan,
                         params: Mapping[str, Any]) -> PrimitiveOutcome:
    """Primitives report failures as outcomes; one that raises has a bug, and what the
    tool did is then unknown (E3404), which is recorded rather than lost."""
    try:
        return await deps.runner.run(plan, params, secrets=deps.secrets)
    except Exception as exc:  # boundary: becomes an execution.finished with outcome unknown
        return PrimitiveOutcome(ok=False, error={
            "code": "E3404", "message": f"primitive failed unexpectedly: {exc!r}",
            "details": {"exception": type(exc).__name__}})


def _resolve_env_secrets(plan: SubprocessPlan | HttpPlan,
                         secrets: Secrets) -> tuple[SubprocessPlan | HttpPlan, tuple[str, ...]]:
    """Fill `${NAME}` references in a subprocess environment just in time. The values
    go to the process only; they are returned so outputs can be scrubbed of them."""
    if not isinstance(plan, SubprocessPlan):
        values = tuple(v for ref in _references(plan.headers.values())
                       if (v := secrets(ref)) is not None)
        return plan, values
    env: dict[str, str] = {}
    values: list[str] = []
    for key, value in plan.env.items():
        def substitute(match: re.Match[str]) -> str:
            secret = secrets(match.group(1))
            if secret is None:
                return ""
            values.append(secret)
            return secret
        env[key] = _SECRET_REF.sub(substitute, value)
    return dataclasses.replace(plan, env=env), tuple(values)


def _references(values: Any) -> list[str]:
    return [m.group(1) for value in values for m in _SECRET_REF.finditer(str(value))]


def _plan_summary(plan: SubprocessPlan | HttpPlan) -> dict[str, Any]:
    if isinstance(plan, SubprocessPlan):
        return {"argv": list(plan.argv), "cwd": plan.cwd, "timeout_seconds": plan.timeout_seconds,
                "env_keys": sorted(plan.env)}
    return {"method": plan.method, "url_template": plan.url_template,
            "header_names": sorted(plan.headers), "timeout_seconds": plan.timeout_seconds}


def _started(decision: PermissionDecided, attempt: int, plan: SubprocessPlan | HttpPlan,
             sandbox: str) -> ExecutionStarted:
    return ExecutionStarted(
        invocation_id=decision.invocation_id, attempt=attempt, tool_id=decision.tool_id,
        version=decision.version,
        primitive="subprocess" if isinstance(plan, SubprocessPlan) else "http_client",
        sandbox=sandbox, plan_summary=_plan_summary(plan),
    )


def _scrub(text: str, secret_values: tuple[str, ...]) -> str:
    for value in secret_values:
        if len(value) >= 4:
            text = text.replace(value, REDACTED)
    return text


def _finished(decision: PermissionDecided, attempt: int, outcome: PrimitiveOutcome,
              manifest: Mapping[str, Any], secret_values: tuple[str, ...], *,
              final: bool) -> ExecutionFinished:
    stdout = _scrub(outcome.stdout.decode("utf-8", errors="replace"), secret_values)
    stdout_truncated = outcome.stdout_truncated or len(stdout) > EVENT_STDOUT_MAX
    stderr = _scrub(outcome.stderr.decode("utf-8", errors="replace"), secret_values)
    error = None
    if outcome.error is not None:
        raw = dict(outcome.error)
        error = ErrorInfo(code=str(raw.get("code", "E3401")),
                          message=_scrub(str(raw.get("message", "")), secret_values),
                          details=_scrub_details(raw.get("details") or {}, secret_values))
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


def _scrub_details(details: Mapping[str, Any], secret_values: tuple[str, ...]) -> dict[str, Any]:
    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return _scrub(node, secret_values)
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node
    return walk(dict(details))
