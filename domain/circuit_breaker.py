"""Circuit breaker per external service (spec 11.3.4, Appendix C circuit_breaker_config).

A pure state machine. Time always comes in as an argument; nothing here reads a clock.

    closed --(failure_threshold failures within window_seconds)--> open
    open ---(timeout_seconds elapsed; decided by time, see `tick`)--> half_open
    half_open --(any failure)--> open
    half_open --(success_threshold successes)--> closed

Which execution outcomes speak about a service's health is decided in one place,
`health_signal` (with `counts_as_failure`). Outcomes arriving while the breaker is
open (calls that started before it opened) change nothing.

Half-open admits canaries while fewer than `half_open_max_calls` are in flight; the
in-flight count is kept by whoever admits (see `begin_canary` / `end_canary`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from domain.errors import CircuitOpen

BreakerState = Literal["closed", "open", "half_open"]
Outcome = Literal["success", "failure"]

DEFAULT_WINDOW_SECONDS = 60.0
"""Rolling window for counting failures. Appendix C has no such field; 60 s is the
`window_size` of spec 11.3.4's controller. A manifest may set
`circuit_breaker_config.window_seconds`."""

SERVICE_FAILURE_CODES = frozenset({"E3502", "E3503"})
"""External service unavailable / timed out (spec 11.5)."""


def counts_as_failure(outcome: str, error_code: str | None, status_code: int | None) -> bool:
    """Whether an execution outcome counts against the service's health.

    The rule: a failed attempt counts when the service answered 5xx or 429, or could
    not be reached / timed out (E3502, E3503). Tool bugs and rejected input (E3301,
    E3401 on a 4xx, E3404 crashes, E3402 process timeouts), deadline expiry (E3002)
    and our own rate limiting (E3504) do not: they say nothing about the service.
    """
    if outcome != "failure":
        return False
    if status_code is not None and (status_code >= 500 or status_code == 429):
        return True
    return error_code in SERVICE_FAILURE_CODES


def health_signal(outcome: str, error_code: str | None,
                  status_code: int | None) -> Outcome | None:
    """`"success"`, `"failure"`, or None for an outcome that is neutral for the breaker
    (a tool-side failure, or an attempt whose outcome is unknown)."""
    if outcome == "success":
        return "success"
    if counts_as_failure(outcome, error_code, status_code):
        return "failure"
    return None


@dataclass(frozen=True, slots=True)
class CircuitConfig:
    """Breaker tuning of one service (Appendix C defaults)."""

    failure_threshold: int = 5
    success_threshold: int = 3
    timeout_seconds: float = 60.0
    half_open_max_calls: int = 10
    window_seconds: float = DEFAULT_WINDOW_SECONDS

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> CircuitConfig:
        """Read `circuit_breaker_config`; missing keys take the Appendix C defaults."""
        raw = manifest.get("circuit_breaker_config")
        if not isinstance(raw, Mapping):
            return cls()
        return cls(
            failure_threshold=max(1, int(raw.get("failure_threshold", 5))),
            success_threshold=max(1, int(raw.get("success_threshold", 3))),
            timeout_seconds=max(0.0, float(raw.get("timeout_seconds", 60))),
            half_open_max_calls=max(1, int(raw.get("half_open_max_calls", 10))),
            window_seconds=max(0.0, float(raw.get("window_seconds", DEFAULT_WINDOW_SECONDS))),
        )


@dataclass(frozen=True, slots=True)
class CircuitState:
    """A breaker as recorded. `failures` are the failure times still in the window
    (closed); `successes` the successes counted in half-open; `opened_at` when it last
    opened; `since` when the current state began."""

    state: BreakerState = "closed"
    failures: tuple[datetime, ...] = ()
    successes: int = 0
    opened_at: datetime | None = None
    half_open_in_flight: int = 0
    since: datetime | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """One change of state, as published in `circuit.state.changed`."""

    from_state: BreakerState
    to_state: BreakerState
    at: datetime
    failure_count: int
    success_count: int
    reason: str


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether a call may go to the service now. `canary` is set for a half-open call
    (count it with `begin_canary`/`end_canary`); `retry_after_seconds` on a refusal
    when the breaker knows when it will try again."""

    allowed: bool
    state: BreakerState
    canary: bool = False
    retry_after_seconds: float | None = None
    reason: str = ""

    def error(self, service_id: str) -> CircuitOpen:
        """The E3501 failure a refused call ends with."""
        details: dict[str, Any] = {"service_id": service_id, "state": self.state}
        if self.retry_after_seconds is not None:
            details["retry_after_seconds"] = round(self.retry_after_seconds, 3)
        return CircuitOpen(f"circuit breaker for {service_id!r} is {self.state}: {self.reason}",
                           details=details)


def tick(state: CircuitState, at: datetime,
         config: CircuitConfig) -> tuple[CircuitState, Transition | None]:
    """The time-driven transition: open becomes half-open once `timeout_seconds` have
    elapsed since it opened (the new state begins at opened_at + timeout)."""
    if state.state != "open" or state.opened_at is None:
        return state, None
    reopen_at = state.opened_at + timedelta(seconds=config.timeout_seconds)
    if at < reopen_at:
        return state, None
    half_open = dataclasses.replace(state, state="half_open", failures=(), successes=0,
                                    since=reopen_at)
    return half_open, Transition("open", "half_open", reopen_at, 0, 0,
                                 f"timeout of {config.timeout_seconds:g}s elapsed")


def current(state: CircuitState, at: datetime, config: CircuitConfig) -> CircuitState:
    """The state as seen at time `at` (an open breaker past its timeout is half-open)."""
    return tick(state, at, config)[0]


def evolve(state: CircuitState, outcome: Outcome, at: datetime,
           config: CircuitConfig) -> tuple[CircuitState, Transition | None]:
    """Apply one outcome observed at `at`. Returns the new state and the transition the
    outcome caused, if any; the time-driven open -> half-open step is applied first but
    not returned (use `record` to get it as well)."""
    seen = current(state, at, config)
    if seen.state == "closed":
        return _closed(seen, outcome, at, config)
    if seen.state == "half_open":
        return _half_open(seen, outcome, at, config)
    return seen, None  # open: a call that started before the breaker opened


def record(state: CircuitState, outcome: Outcome, at: datetime,
           config: CircuitConfig) -> tuple[CircuitState, tuple[Transition, ...]]:
    """`tick` then `evolve`: every transition up to and including this outcome, in order."""
    ticked, by_time = tick(state, at, config)
    evolved, by_outcome = evolve(ticked, outcome, at, config)
    return evolved, tuple(t for t in (by_time, by_outcome) if t is not None)


def _closed(state: CircuitState, outcome: Outcome, at: datetime,
            config: CircuitConfig) -> tuple[CircuitState, Transition | None]:
    failures = _in_window(state.failures, at, config.window_seconds)
    if outcome == "success":
        return dataclasses.replace(state, failures=failures), None
    failures = (*failures, at)
    if len(failures) < config.failure_threshold:
        return dataclasses.replace(state, failures=failures), None
    opened = CircuitState("open", (), 0, at, state.half_open_in_flight, at)
    return opened, Transition("closed", "open", at, len(failures), 0,
                              f"{len(failures)} failures within {config.window_seconds:g}s")


def _half_open(state: CircuitState, outcome: Outcome, at: datetime,
               config: CircuitConfig) -> tuple[CircuitState, Transition | None]:
    if outcome == "failure":
        opened = CircuitState("open", (), 0, at, state.half_open_in_flight, at)
        return opened, Transition("half_open", "open", at, 1, state.successes, "canary failed")
    successes = state.successes + 1
    if successes < config.success_threshold:
        return dataclasses.replace(state, successes=successes), None
    closed = CircuitState("closed", (), 0, None, state.half_open_in_flight, at)
    return closed, Transition("half_open", "closed", at, 0, successes,
                              f"{successes} canary successes")


def _in_window(failures: tuple[datetime, ...], at: datetime,
               window_seconds: float) -> tuple[datetime, ...]:
    start = at - timedelta(seconds=window_seconds)
    return tuple(t for t in failures if t > start)


def admit(state: CircuitState, at: datetime, config: CircuitConfig) -> Admission:
    """May a call go to the service at `at`? Closed: yes. Open: no (E3501), with the
    seconds left until half-open. Half-open: yes, as a canary, while fewer than
    `half_open_max_calls` canaries are in flight."""
    seen = current(state, at, config)
    if seen.state == "closed":
        return Admission(True, "closed")
    if seen.state == "open":
        opened_at = seen.opened_at or at
        left = (opened_at + timedelta(seconds=config.timeout_seconds) - at).total_seconds()
        return Admission(False, "open", retry_after_seconds=max(left, 0.0),
                         reason="the service kept failing")
    if seen.half_open_in_flight < config.half_open_max_calls:
        return Admission(True, "half_open", canary=True)
    return Admission(False, "half_open",
                     reason=f"{config.half_open_max_calls} canary call(s) already in flight")


def begin_canary(state: CircuitState) -> CircuitState:
    """One more canary call in flight."""
    return dataclasses.replace(state, half_open_in_flight=state.half_open_in_flight + 1)


def end_canary(state: CircuitState) -> CircuitState:
    """One canary call finished (never below zero)."""
    return dataclasses.replace(state, half_open_in_flight=max(0, state.half_open_in_flight - 1))


def apply_transition(state: CircuitState, transition: Transition) -> CircuitState:
    """Fold one recorded transition (rebuilds). Counts inside a state (failures in the
    window, half-open successes) are not in the log; a rebuilt state starts them at
    zero, which only delays the next transition. Canaries in flight are kept."""
    at = transition.at
    in_flight = state.half_open_in_flight
    if transition.to_state == "open":
        return CircuitState("open", (), 0, at, in_flight, at)
    if transition.to_state == "half_open":
        return CircuitState("half_open", (), 0, state.opened_at, in_flight, at)
    return CircuitState("closed", (), 0, None, in_flight, at)


def fold(transitions: Iterable[Transition],
         initial: CircuitState | None = None) -> CircuitState:
    """The state of one service after its recorded transitions, in log order."""
    state = initial or CircuitState()
    for transition in transitions:
        state = apply_transition(state, transition)
    return state
