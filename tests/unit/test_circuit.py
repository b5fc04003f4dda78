"""The circuit-breaker state machine (domain.circuit_breaker): pure, time passed in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.circuit_breaker import (
    CircuitConfig,
    CircuitState,
    Transition,
    admit,
    begin_canary,
    counts_as_failure,
    current,
    evolve,
    fold,
    health_signal,
    record,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
CONFIG = CircuitConfig(failure_threshold=3, success_threshold=2, timeout_seconds=10,
                       half_open_max_calls=2, window_seconds=60)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run(outcomes: list[tuple[str, float]], state: CircuitState | None = None,
        config: CircuitConfig = CONFIG) -> tuple[CircuitState, list[Transition]]:
    state = state or CircuitState()
    seen: list[Transition] = []
    for outcome, when in outcomes:
        state, transitions = record(state, outcome, at(when), config)  # type: ignore[arg-type]
        seen.extend(transitions)
    return state, seen


def opened_at(seconds: float) -> CircuitState:
    state, _ = run([("failure", seconds)] * CONFIG.failure_threshold)
    assert state.state == "open"
    return state


# -- configuration --------------------------------------------------------------------

def test_config_defaults_follow_appendix_c() -> None:
    config = CircuitConfig.from_manifest({})
    assert (config.failure_threshold, config.success_threshold, config.timeout_seconds,
            config.half_open_max_calls, config.window_seconds) == (5, 3, 60, 10, 60)


def test_config_reads_the_manifest_and_keeps_defaults_for_the_rest() -> None:
    config = CircuitConfig.from_manifest(
        {"circuit_breaker_config": {"failure_threshold": 2, "timeout_seconds": 1,
                                    "window_seconds": 5}})
    assert (config.failure_threshold, config.timeout_seconds, config.window_seconds) == (2, 1, 5)
    assert config.success_threshold == 3


# -- which outcomes count -------------------------------------------------------------

@pytest.mark.parametrize(("outcome", "code", "status", "signal"), [
    ("success", None, 200, "success"),
    ("failure", "E3502", 503, "failure"),
    ("failure", "E3502", None, "failure"),
    ("failure", "E3503", None, "failure"),
    ("failure", "E3401", 429, "failure"),
    ("failure", "E3401", 404, None),
    ("failure", "E3301", None, None),
    ("failure", "E3401", None, None),
    ("failure", "E3402", None, None),
    ("failure", "E3002", None, None),
    ("unknown", "E3404", None, None),
])
def test_only_service_side_failures_count(outcome: str, code: str | None, status: int | None,
                                          signal: str | None) -> None:
    assert health_signal(outcome, code, status) == signal
    assert counts_as_failure(outcome, code, status) is (signal == "failure")


# -- closed -> open -------------------------------------------------------------------

def test_threshold_failures_within_the_window_open_the_breaker() -> None:
    state, transitions = run([("failure", 0), ("failure", 1), ("failure", 2)])
    assert state.state == "open" and state.opened_at == at(2)
    assert [(t.from_state, t.to_state, t.failure_count) for t in transitions] == [
        ("closed", "open", 3)]


def test_fewer_failures_than_the_threshold_keep_it_closed() -> None:
    state, transitions = run([("failure", 0), ("failure", 1), ("success", 2)])
    assert state.state == "closed" and transitions == []
    assert admit(state, at(3), CONFIG).allowed


def test_failures_older_than_the_window_are_dropped() -> None:
    state, transitions = run([("failure", 0), ("failure", 1), ("failure", 61.5)])
    assert state.state == "closed" and transitions == []
    assert state.failures == (at(61.5),)


# -- open -----------------------------------------------------------------------------

def test_open_breaker_refuses_with_E3501_and_the_time_left() -> None:
    admission = admit(opened_at(0), at(4), CONFIG)
    assert not admission.allowed and admission.state == "open"
    assert admission.retry_after_seconds == pytest.approx(6)
    error = admission.error("mail")
    assert error.code == "E3501" and error.details["service_id"] == "mail"


def test_outcomes_arriving_while_open_change_nothing() -> None:
    state = opened_at(0)
    assert evolve(state, "failure", at(1), CONFIG) == (state, None)
    assert evolve(state, "success", at(1), CONFIG) == (state, None)


def test_open_becomes_half_open_once_the_timeout_elapsed() -> None:
    state = opened_at(0)
    assert current(state, at(9.9), CONFIG).state == "open"
    assert current(state, at(10), CONFIG).state == "half_open"
    admission = admit(state, at(10), CONFIG)
    assert admission.allowed and admission.canary


# -- half-open ------------------------------------------------------------------------

def test_half_open_admits_only_half_open_max_calls_canaries_in_flight() -> None:
    state = current(opened_at(0), at(10), CONFIG)
    state = begin_canary(begin_canary(state))
    admission = admit(state, at(11), CONFIG)
    assert not admission.allowed and admission.state == "half_open"
    assert admission.error("mail").code == "E3501"


def test_a_canary_failure_reopens_the_breaker() -> None:
    state, transitions = run([("failure", 12)], state=opened_at(0))
    assert state.state == "open" and state.opened_at == at(12)
    assert [(t.from_state, t.to_state) for t in transitions] == [
        ("open", "half_open"), ("half_open", "open")]
    assert transitions[0].at == at(10)
    assert not admit(state, at(13), CONFIG).allowed


def test_success_threshold_canary_successes_close_the_breaker() -> None:
    state, transitions = run([("success", 11), ("success", 12)], state=opened_at(0))
    assert state.state == "closed"
    assert [(t.from_state, t.to_state) for t in transitions] == [
        ("open", "half_open"), ("half_open", "closed")]
    assert transitions[-1].success_count == 2


def test_a_closed_breaker_starts_counting_failures_afresh() -> None:
    state, _ = run([("success", 11), ("success", 12), ("failure", 13), ("failure", 14)],
                   state=opened_at(0))
    assert state.state == "closed" and len(state.failures) == 2


# -- rebuild --------------------------------------------------------------------------

def test_folding_the_recorded_transitions_reproduces_the_state() -> None:
    live, transitions = run([("failure", 0)] * 3 + [("failure", 12)] + [("success", 30)])
    rebuilt = fold(transitions)
    assert (rebuilt.state, rebuilt.opened_at, rebuilt.since) == (
        live.state, live.opened_at, live.since)
    assert admit(rebuilt, at(31), CONFIG) == admit(live, at(31), CONFIG)


def test_folding_nothing_is_closed() -> None:
    assert fold([]).state == "closed"


# -- properties -----------------------------------------------------------------------

steps = st.lists(st.tuples(st.sampled_from(["success", "failure"]),
                           st.floats(min_value=0, max_value=30)), max_size=60)


def timeline(gaps: list[tuple[str, float]]) -> list[tuple[str, float]]:
    clock, out = 0.0, []
    for outcome, gap in gaps:
        clock += gap
        out.append((outcome, clock))
    return out


@settings(max_examples=300)
@given(steps, st.floats(min_value=0, max_value=1))
def test_never_admits_while_open_before_the_timeout(gaps: list[tuple[str, float]],
                                                    fraction: float) -> None:
    state = CircuitState()
    for outcome, when in timeline(gaps):
        state, _ = record(state, outcome, at(when), CONFIG)  # type: ignore[arg-type]
        if state.state == "open":
            assert state.opened_at is not None
            probe = state.opened_at + timedelta(seconds=fraction * CONFIG.timeout_seconds * 0.999)
            assert not admit(state, probe, CONFIG).allowed


@settings(max_examples=300)
@given(steps)
def test_closes_only_after_success_threshold_successes_in_half_open(
        gaps: list[tuple[str, float]]) -> None:
    state = CircuitState()
    half_open_successes = 0
    for outcome, when in timeline(gaps):
        before = current(state, at(when), CONFIG)
        state, transitions = record(state, outcome, at(when), CONFIG)  # type: ignore[arg-type]
        if before.state == "half_open":
            half_open_successes = half_open_successes + 1 if outcome == "success" else 0
        for transition in transitions:
            if transition.to_state == "closed":
                assert transition.from_state == "half_open"
                assert half_open_successes == CONFIG.success_threshold
        if state.state != "half_open":
            half_open_successes = 0


@settings(max_examples=300)
@given(steps)
def test_recorded_transitions_chain_and_fold_to_the_live_state(
        gaps: list[tuple[str, float]]) -> None:
    state, transitions = run(timeline(gaps))
    previous = "closed"
    for transition in transitions:
        assert transition.from_state == previous
        previous = transition.to_state
    assert fold(transitions).state == state.state
