"""Request deadlines (domain.deadline) and the executor's pre-attempt checks
(consumers.steps.admission) that apply them with the breaker and the rate limit."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from consumers.steps.admission import (
    AttemptGate,
    AttemptPass,
    enter_attempt,
    leave_attempt,
    may_wait,
    outcome_past_deadline,
)
from contracts.envelope import new_envelope
from contracts.events import CircuitStateChanged
from domain.circuit_breaker import CircuitConfig
from domain.deadline import DeadlineExceeded, effective_timeout, ensure_not_expired, remaining
from domain.errors import ToolexecError
from domain.model import PrimitiveOutcome
from domain.rate_limit import RateLimitConfig
from projections.circuit_view import CircuitView

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def later(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def opened(view: CircuitView, since: datetime) -> CircuitView:
    data = CircuitStateChanged(service_id="mail", from_state="closed", to_state="open",
                               failure_count=1, success_count=0, since=since)
    view.apply(new_envelope(data, source="test", partitionkey="mail", correlationid="i",
                            id=f"opened-{since.isoformat()}", time=since))
    return view


# -- domain.deadline ------------------------------------------------------------------

def test_no_deadline_leaves_no_limit() -> None:
    assert remaining(None, NOW) is None
    ensure_not_expired(None, NOW)
    assert effective_timeout(30, None, NOW) == 30


def test_remaining_counts_seconds_until_the_deadline() -> None:
    assert remaining(later(2.5), NOW) == 2.5
    assert remaining(later(-1), NOW) == -1


def test_a_passed_deadline_raises_E3002() -> None:
    with pytest.raises(DeadlineExceeded) as late:
        ensure_not_expired(later(-0.25), NOW)
    assert late.value.code == "E3002" and late.value.details["late_by_seconds"] == 0.25
    with pytest.raises(DeadlineExceeded):
        effective_timeout(30, NOW, NOW)


def test_the_timeout_is_capped_by_the_time_left() -> None:
    assert effective_timeout(30, later(5), NOW) == 5
    assert effective_timeout(3, later(5), NOW) == 3


# -- consumers.steps.admission ----------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


API = {"tool_id": "mailer", "external_service": "mail",
       "circuit_breaker_config": {"failure_threshold": 1, "timeout_seconds": 10,
                                  "half_open_max_calls": 1}}


def enter(gate: AttemptGate, clock: Clock, manifest: dict = API,
          deadline: datetime | None = None, plan_timeout: float = 30) -> AttemptPass:
    return asyncio.run(enter_attempt(gate, manifest, deadline, plan_timeout, clock=clock,
                                     sleep=clock.sleep))


def test_an_attempt_past_its_deadline_is_refused_with_E3002() -> None:
    with pytest.raises(DeadlineExceeded):
        enter(AttemptGate(), Clock(), deadline=later(-1))


def test_an_attempt_gets_the_time_left_as_its_timeout() -> None:
    passed = enter(AttemptGate(), Clock(), deadline=later(4))
    assert (passed.timeout_seconds, passed.capped_by_deadline) == (4, True)


def test_an_open_breaker_refuses_the_attempt_with_E3501() -> None:
    view = opened(CircuitView(), NOW)
    with pytest.raises(Exception) as refused:
        enter(AttemptGate(circuits=view), Clock())
    assert refused.value.code == "E3501"  # type: ignore[attr-defined]


def test_a_half_open_attempt_holds_a_canary_slot_until_it_leaves() -> None:
    view = opened(CircuitView(), later(-10))
    gate, clock = AttemptGate(circuits=view), Clock()
    passed = enter(gate, clock)
    assert passed.canary_service == "mail"
    assert not view.admit("mail", NOW, CircuitConfig.from_manifest(API)).allowed
    asyncio.run(leave_attempt(gate, passed))
    assert view.admit("mail", NOW, CircuitConfig.from_manifest(API)).allowed


def test_rate_limited_attempts_wait_for_a_token() -> None:
    manifest = {**API, "rate_limit": {"requests_per_second": 2, "burst": 1}}
    gate, clock = AttemptGate(), Clock()
    enter(gate, clock, manifest)
    enter(gate, clock, manifest)
    assert clock.now == later(0.5)


def test_rate_limit_in_reject_mode_refuses_with_E3504() -> None:
    manifest = {**API, "rate_limit": {"requests_per_second": 1, "on_limit": "reject"}}
    gate, clock = AttemptGate(), Clock()
    enter(gate, clock, manifest)
    with pytest.raises(Exception) as refused:
        enter(gate, clock, manifest)
    assert refused.value.code == "E3504"  # type: ignore[attr-defined]


def test_a_refused_rate_limit_gives_the_canary_slot_back() -> None:
    view = opened(CircuitView(), later(-10))
    manifest = {**API, "rate_limit": {"requests_per_second": 1, "on_limit": "reject"}}
    gate, clock = AttemptGate(circuits=view), Clock()
    limit = RateLimitConfig.from_manifest(manifest)
    assert limit is not None
    gate.rate_limits.take("mail", limit, NOW, max_wait=None)
    with pytest.raises(Exception) as refused:
        enter(gate, clock, manifest)
    assert refused.value.code == "E3504"  # type: ignore[attr-defined]
    admission = view.admit("mail", NOW, CircuitConfig.from_manifest(manifest))
    assert admission.allowed and admission.canary


def test_a_timeout_caused_by_the_deadline_is_reported_as_E3002() -> None:
    timed_out = PrimitiveOutcome(ok=False, error={"code": "E3503", "message": "timeout"})
    cut = outcome_past_deadline(timed_out, AttemptPass(2.0, capped_by_deadline=True))
    assert cut.error is not None and cut.error["code"] == "E3002"
    own = outcome_past_deadline(timed_out, AttemptPass(2.0, capped_by_deadline=False))
    assert own is timed_out


def run_without_suspending(gate: AttemptGate, manifest: dict) -> AttemptPass:
    """enter_attempt driven by hand: fails if it suspends even once."""
    clock = Clock()
    entering = enter_attempt(gate, manifest, later(4), 30, clock=clock, sleep=clock.sleep)
    with pytest.raises(StopIteration) as ended:
        entering.send(None)
    return ended.value.value


def test_checks_that_cannot_wait_end_without_suspending() -> None:
    """What the execute step relies on to await them without a task of their own."""
    script = {"tool_id": "script"}
    view = opened(CircuitView(), later(-10))
    assert not may_wait(AttemptGate(), script)
    assert not may_wait(AttemptGate(circuits=view), script)  # no service to ask about
    assert not may_wait(AttemptGate(), API)  # a service, but no breaker in this process
    assert run_without_suspending(AttemptGate(), script).timeout_seconds == 4
    assert run_without_suspending(AttemptGate(circuits=view), script).canary_service is None
    assert run_without_suspending(AttemptGate(), API).canary_service is None


def test_checks_that_may_wait_are_known() -> None:
    assert may_wait(AttemptGate(circuits=CircuitView(), canaries=SuspendingCanaries()), API)
    limited = {"tool_id": "script", "rate_limit": {"requests_per_second": 2, "burst": 1}}
    assert may_wait(AttemptGate(), limited)
    assert not may_wait(AttemptGate(), {**limited, "rate_limit": {"requests_per_second": 0}})


class SuspendingCanaries:
    """Shared canary slots that suspend once, as a round trip to Redis does."""

    async def acquire(self, service_id: str, limit: int) -> bool:
        await asyncio.sleep(0)
        return True

    async def release(self, service_id: str) -> None:
        return None


async def suspend_once(seconds: float) -> None:
    await asyncio.sleep(0)


def suspends(gate: AttemptGate, manifest: dict) -> bool:
    """Whether enter_attempt, driven by hand, suspends before it ends (or refuses)."""
    entering = enter_attempt(gate, manifest, None, 30, clock=lambda: NOW, sleep=suspend_once)
    try:
        entering.send(None)
    except StopIteration:
        return False
    except ToolexecError as refused:  # a refusal ends it without suspending
        assert refused.code in ("E3501", "E3504"), refused
        return False
    entering.close()
    return True


BREAKERS = {"none": None, "half-open": lambda: opened(CircuitView(), later(-3600))}
CANARIES = {"none": None, "shared": SuspendingCanaries}
SERVICES = {"none": {}, "empty": {"external_service": ""}, "mail": {"external_service": "mail"}}
BREAKER_CONFIGS = {"default": {}, "tight": {"circuit_breaker_config":
                                            API["circuit_breaker_config"]}}
RATE_LIMITS = {"none": {}, "zero": {"rate_limit": {"requests_per_second": 0}},
               "wait": {"rate_limit": {"requests_per_second": 2, "burst": 1}},
               "reject": {"rate_limit": {"requests_per_second": 2, "burst": 1,
                                         "on_limit": "reject"}}}


@pytest.mark.parametrize("breaker", BREAKERS)
@pytest.mark.parametrize("canaries", CANARIES)
@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize("breaker_config", BREAKER_CONFIGS)
@pytest.mark.parametrize("rate_limit", RATE_LIMITS)
def test_may_wait_exactly_when_enter_attempt_can_suspend(
        breaker: str, canaries: str, service: str, breaker_config: str,
        rate_limit: str) -> None:
    """The execute step gives enter_attempt a task a cancel can stop only when may_wait
    says so: were it to suspend otherwise, a cancel could not interrupt that wait.
    Each case is driven in the state most likely to suspend: the breaker half-open,
    the canary slots shared, the rate limit's bucket empty."""
    make_view, make_slots = BREAKERS[breaker], CANARIES[canaries]
    gate = AttemptGate(circuits=make_view() if make_view else None,
                       canaries=make_slots() if make_slots else None)
    manifest = {"tool_id": "mailer", **SERVICES[service], **BREAKER_CONFIGS[breaker_config],
                **RATE_LIMITS[rate_limit]}
    limit = RateLimitConfig.from_manifest(manifest)
    if limit is not None:  # empty the bucket enter_attempt will take from
        key = manifest.get("external_service") or "tool:mailer"
        gate.rate_limits.take(key, limit, NOW, max_wait=None)
    assert may_wait(gate, manifest) == suspends(gate, manifest)
