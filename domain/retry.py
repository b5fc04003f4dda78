"""Retry decisions with exponential backoff and full jitter (manifest retry_policy)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain.model import PrimitiveOutcome

RETRIABLE_CODES = frozenset({"E3502", "E3503"})
BASE_DELAY_SECONDS = 0.1


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 1
    backoff_multiplier: float = 2.0
    backoff_max_seconds: float = 60.0
    retry_on_status_codes: frozenset[int] = frozenset({429, 500, 502, 503, 504})

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> RetryPolicy:
        """No retry_policy -> one attempt; a policy without max_attempts -> 3 (spec)."""
        raw = manifest.get("retry_policy")
        if not isinstance(raw, Mapping):
            return cls()
        return cls(
            max_attempts=int(raw.get("max_attempts", 3)),
            backoff_multiplier=float(raw.get("backoff_multiplier", 2.0)),
            backoff_max_seconds=float(raw.get("backoff_max_seconds", 60)),
            retry_on_status_codes=frozenset(
                int(c) for c in raw.get("retry_on_status_codes", (429, 500, 502, 503, 504))
            ),
        )


def is_retriable(outcome: PrimitiveOutcome, policy: RetryPolicy) -> bool:
    """Transient external failures are retried; tool bugs, timeouts and denials not."""
    if outcome.ok:
        return False
    if outcome.status_code is not None:
        return outcome.status_code in policy.retry_on_status_codes
    code = (outcome.error or {}).get("code")
    return code in RETRIABLE_CODES


def backoff_delay(attempt: int, policy: RetryPolicy, unit_random: float) -> float:
    """Full jitter: uniform in [0, min(cap, base * multiplier^(attempt-1))]."""
    ceiling = min(policy.backoff_max_seconds,
                  BASE_DELAY_SECONDS * policy.backoff_multiplier ** (attempt - 1))
    return max(0.0, min(1.0, unit_random)) * ceiling


def longest_run_seconds(timeout: float, policy: RetryPolicy) -> float:
    """The longest the attempts of one invocation take: every attempt to its
    `timeout`, and the longest backoff before each retry."""
    backoffs = sum(backoff_delay(attempt, policy, 1.0)
                   for attempt in range(1, policy.max_attempts))
    return timeout * policy.max_attempts + backoffs
