"""Token bucket per external service (domain.rate_limit)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from domain.rate_limit import RateLimitConfig, TokenBucket, acquire

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_no_rate_limit_in_the_manifest_means_none() -> None:
    assert RateLimitConfig.from_manifest({}) is None
    assert RateLimitConfig.from_manifest({"rate_limit": {"requests_per_second": 0}}) is None


def test_config_reads_rate_burst_and_mode() -> None:
    config = RateLimitConfig.from_manifest(
        {"rate_limit": {"requests_per_second": 2.5, "on_limit": "reject"}})
    assert config == RateLimitConfig(requests_per_second=2.5, burst=3, on_limit="reject")


def test_a_full_bucket_serves_a_burst_without_waiting() -> None:
    bucket = TokenBucket(rate_per_second=1, burst=3)
    waits = []
    for _ in range(3):
        bucket, wait = bucket.take(at(0))
        waits.append(wait)
    assert waits == [0, 0, 0]


def test_an_empty_bucket_says_how_long_to_wait_and_queues_waiters() -> None:
    bucket = TokenBucket(rate_per_second=2, burst=1)
    bucket, first = bucket.take(at(0))
    bucket, second = bucket.take(at(0))
    bucket, third = bucket.take(at(0))
    assert (first, second, third) == (0, pytest.approx(0.5), pytest.approx(1.0))


def test_tokens_refill_over_time_up_to_the_burst() -> None:
    bucket, _ = TokenBucket(rate_per_second=1, burst=2).take(at(0))
    assert bucket.available(at(0.5)) == pytest.approx(1.5)
    assert bucket.available(at(100)) == 2


def test_reject_mode_raises_E3504_and_keeps_the_bucket() -> None:
    config = RateLimitConfig(requests_per_second=1, burst=1, on_limit="reject")
    bucket, wait = acquire(config.bucket(), "mail", config, at(0))
    assert wait == 0
    with pytest.raises(Exception) as refused:
        acquire(bucket, "mail", config, at(0.5))
    assert refused.value.code == "E3504"  # type: ignore[attr-defined]
    assert refused.value.details["retry_after_seconds"] == 0.5  # type: ignore[attr-defined]
    assert acquire(bucket, "mail", config, at(1.0))[1] == 0


def test_wait_mode_refuses_a_wait_longer_than_allowed() -> None:
    config = RateLimitConfig(requests_per_second=1, burst=1)
    bucket, _ = acquire(config.bucket(), "mail", config, at(0))
    assert acquire(bucket, "mail", config, at(0))[1] == pytest.approx(1)
    with pytest.raises(Exception) as refused:
        acquire(bucket, "mail", config, at(0), max_wait=0.5)
    assert refused.value.code == "E3504"  # type: ignore[attr-defined]
