from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from domain.model import PrimitiveOutcome
from domain.retry import RetryPolicy, backoff_delay, is_retriable


def test_no_policy_means_one_attempt() -> None:
    assert RetryPolicy.from_manifest({}).max_attempts == 1


def test_policy_defaults_follow_the_spec() -> None:
    policy = RetryPolicy.from_manifest({"retry_policy": {}})
    assert policy.max_attempts == 3
    assert 503 in policy.retry_on_status_codes


def test_listed_status_codes_are_retried_and_others_not() -> None:
    policy = RetryPolicy.from_manifest({"retry_policy": {"retry_on_status_codes": [503]}})
    assert is_retriable(PrimitiveOutcome(ok=False, status_code=503), policy)
    assert not is_retriable(PrimitiveOutcome(ok=False, status_code=404), policy)


def test_tool_failures_and_timeouts_are_not_retried() -> None:
    policy = RetryPolicy(max_attempts=3)
    assert not is_retriable(PrimitiveOutcome(ok=False, error={"code": "E3401"}), policy)
    assert not is_retriable(PrimitiveOutcome(ok=False, error={"code": "E3402"}), policy)
    assert is_retriable(PrimitiveOutcome(ok=False, error={"code": "E3502"}), policy)


@given(st.integers(1, 30), st.floats(0, 1))
def test_full_jitter_delay_stays_within_the_capped_exponential(attempt: int, r: float) -> None:
    policy = RetryPolicy(max_attempts=30, backoff_multiplier=2.0, backoff_max_seconds=5)
    delay = backoff_delay(attempt, policy, r)
    assert 0 <= delay <= min(5, 0.1 * 2 ** (attempt - 1))
