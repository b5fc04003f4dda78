"""What the execute step checks before each attempt, and undoes after it.

In order: the request's deadline (E3002); the external service's circuit breaker
(E3501, and a canary slot when half-open); the service's rate limit (wait, or E3504);
then the attempt's timeout is the plan's capped by the time left. Rules live in
domain.deadline, domain.circuit_breaker and domain.rate_limit; this module holds the
per-process state (token buckets) and the order of the checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from consumers.ports import CanarySlots, Clock
from domain.circuit_breaker import Admission, CircuitConfig
from domain.deadline import effective_timeout, ensure_not_expired, remaining
from domain.model import PrimitiveOutcome
from domain.rate_limit import RateLimitConfig, TokenBucket, acquire

TIMEOUT_CODES = frozenset({"E3402", "E3503"})


class CircuitGate(Protocol):
    """The breaker view an executor asks before calling an external service."""

    def admit(self, service_id: str, at: datetime, config: CircuitConfig) -> Admission: ...

    def begin_canary(self, service_id: str) -> None: ...

    def end_canary(self, service_id: str) -> None: ...


@dataclass
class RateLimits:
    """Token buckets per service, in this process. With several executor replicas
    each enforces the full rate; a shared limit needs Redis (not done here)."""

    buckets: dict[str, TokenBucket] = field(default_factory=dict)

    def take(self, key: str, config: RateLimitConfig, at: datetime, *,
             max_wait: float | None) -> float:
        """Seconds to wait before the call may go; raises RateLimited (E3504)."""
        bucket = self.buckets.get(key) or config.bucket()
        self.buckets[key], wait = acquire(bucket, key, config, at, max_wait=max_wait)
        return wait


@dataclass
class AttemptGate:
    """The executor's guards; without `circuits` no breaker is consulted."""

    circuits: CircuitGate | None = None
    rate_limits: RateLimits = field(default_factory=RateLimits)
    canaries: CanarySlots | None = None
    """Caps half-open canaries across replicas (Redis in production); None: this
    process's circuit view alone caps them (one process, the embedded profile)."""


@dataclass(frozen=True)
class AttemptPass:
    """Leave to run one attempt: its timeout, and the canary slot it holds, if any."""

    timeout_seconds: float
    capped_by_deadline: bool = False
    canary_service: str | None = None


async def enter_attempt(gate: AttemptGate, manifest: Mapping[str, Any],
                        deadline: datetime | None, plan_timeout: float, *, clock: Clock,
                        sleep: Callable[[float], Awaitable[Any]]) -> AttemptPass:
    """Run the checks; raises ToolexecError (E3002, E3501, E3504) when the attempt must
    not run. A returned pass holding a canary must be given back with `leave_attempt`."""
    now = clock()
    ensure_not_expired(deadline, now)
    checks = _checks(gate, manifest)
    canary = await _admit(gate, checks.service, manifest, now) if checks.breaker else None
    try:
        if checks.limit is not None:
            key = checks.service or f"tool:{manifest.get('tool_id')}"
            wait = gate.rate_limits.take(key, checks.limit, now,
                                         max_wait=remaining(deadline, now))
            if wait > 0:
                await sleep(wait)
                now = clock()
        timeout = effective_timeout(plan_timeout, deadline, now)
    except BaseException:
        if canary is not None:
            await _release(gate, canary)
        raise
    return AttemptPass(timeout, timeout < plan_timeout, canary)


def may_wait(gate: AttemptGate, manifest: Mapping[str, Any]) -> bool:
    """Whether `enter_attempt` may suspend for this tool (for a shared canary slot when
    its service's breaker is half-open, or for a token of a rate limit that waits);
    otherwise it returns without yielding to the event loop."""
    return _may_suspend(gate, _checks(gate, manifest))


class _Checks(NamedTuple):
    """The checks `enter_attempt` runs for one tool on one gate."""

    service: str | None
    """The tool's external service (also the key of its rate limit)."""
    breaker: bool
    """Whether the service's breaker is asked (a breaker view in this process)."""
    limit: RateLimitConfig | None
    """The rate limit to take a token from."""


def _checks(gate: AttemptGate, manifest: Mapping[str, Any]) -> _Checks:
    service = manifest.get("external_service") or None
    return _Checks(service, service is not None and gate.circuits is not None,
                   RateLimitConfig.from_manifest(manifest))


def _may_suspend(gate: AttemptGate, checks: _Checks) -> bool:
    """The one rule for when `enter_attempt` can await: only a breaker asked with shared
    canary slots (`_admit`) and a rate limit that waits rather than rejects ever do. A
    cancel can interrupt `enter_attempt` only when this holds (`may_wait`)."""
    waits_for_token = checks.limit is not None and checks.limit.on_limit == "wait"
    return (checks.breaker and gate.canaries is not None) or waits_for_token


async def _admit(gate: AttemptGate, service: str | None, manifest: Mapping[str, Any],
                 now: datetime) -> str | None:
    """Ask the breaker; returns the service when a canary slot was taken."""
    if service is None or gate.circuits is None:
        return None
    config = CircuitConfig.from_manifest(manifest)
    admission = gate.circuits.admit(service, now, config)
    if not admission.allowed:
        raise admission.error(service)
    if not admission.canary:
        return None
    if gate.canaries is not None and not await gate.canaries.acquire(
            service, config.half_open_max_calls):
        raise Admission(False, "half_open", reason=(
            f"{config.half_open_max_calls} canary call(s) already in flight "
            "across executors")).error(service)
    gate.circuits.begin_canary(service)
    return service


async def _release(gate: AttemptGate, service: str) -> None:
    if gate.circuits is not None:
        gate.circuits.end_canary(service)
    if gate.canaries is not None:
        await gate.canaries.release(service)


async def leave_attempt(gate: AttemptGate, passed: AttemptPass) -> None:
    """Give back the canary slot the attempt held (call once the attempt ended)."""
    if passed.canary_service is not None:
        await _release(gate, passed.canary_service)


def outcome_past_deadline(outcome: PrimitiveOutcome, passed: AttemptPass) -> PrimitiveOutcome:
    """An attempt cut short by the deadline (not by its own timeout) ends with E3002,
    so the breaker does not blame the service for it and no retry follows."""
    code = (outcome.error or {}).get("code")
    if outcome.ok or not passed.capped_by_deadline or code not in TIMEOUT_CODES:
        return outcome
    return dataclasses.replace(outcome, error={
        "code": "E3002", "message": "the request's deadline passed during the attempt",
        "details": {"timeout_seconds": round(passed.timeout_seconds, 3), "cut_short": code}})
