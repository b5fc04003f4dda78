"""Per-external-service rate limit: a token bucket (pure; time comes in as an argument).

Manifest key (not in Appendix C; a toolexec addition)::

    rate_limit:
      requests_per_second: 5      # refill rate
      burst: 10                   # bucket size; default ceil(requests_per_second), >= 1
      on_limit: wait              # wait (default) | reject (E3504)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from domain.errors import ToolexecError

OnLimit = Literal["wait", "reject"]


class RateLimited(ToolexecError):
    """E3504: the external service's rate limit is exhausted and the tool says reject."""

    code = "E3504"


@dataclass(frozen=True, slots=True)
class RateLimitConfig:
    """A service's rate limit as the manifest declares it."""

    requests_per_second: float
    burst: float
    on_limit: OnLimit = "wait"

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> RateLimitConfig | None:
        """The manifest's `rate_limit`, or None when it declares none (or a rate <= 0)."""
        raw = manifest.get("rate_limit")
        if not isinstance(raw, Mapping):
            return None
        rate = float(raw.get("requests_per_second", 0) or 0)
        if rate <= 0:
            return None
        burst = float(raw.get("burst") or max(1, math.ceil(rate)))
        on_limit: OnLimit = "reject" if raw.get("on_limit") == "reject" else "wait"
        return cls(requests_per_second=rate, burst=max(1.0, burst), on_limit=on_limit)

    def bucket(self) -> TokenBucket:
        """A full bucket for this limit."""
        return TokenBucket(self.requests_per_second, self.burst)


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """`tokens` refill at `rate_per_second` up to `burst`; None = full (never used).

    A take that finds no token still reserves one (tokens go below zero), so callers
    that wait are served in the order they asked; a caller that rejects instead keeps
    the bucket it had.
    """

    rate_per_second: float
    burst: float
    tokens: float | None = None
    updated_at: datetime | None = None

    def available(self, at: datetime) -> float:
        """Tokens in the bucket at `at` (negative while reservations are outstanding)."""
        if self.tokens is None or self.updated_at is None:
            return self.burst
        elapsed = max(0.0, (at - self.updated_at).total_seconds())
        return min(self.burst, self.tokens + elapsed * self.rate_per_second)

    def take(self, at: datetime) -> tuple[TokenBucket, float]:
        """Take one token at `at`: the new bucket and the seconds to wait before the
        call may go (0 when a token was there)."""
        tokens = self.available(at)
        wait = 0.0 if tokens >= 1 else (1 - tokens) / self.rate_per_second
        return dataclasses.replace(self, tokens=tokens - 1, updated_at=at), wait


def rejection(service_id: str, wait_seconds: float, config: RateLimitConfig) -> RateLimited:
    """The E3504 failure of a call refused by the rate limit."""
    return RateLimited(
        f"rate limit of {config.requests_per_second:g}/s for {service_id!r} exceeded",
        details={"service_id": service_id, "retry_after_seconds": round(wait_seconds, 3),
                 "requests_per_second": config.requests_per_second, "burst": config.burst},
    )


def acquire(bucket: TokenBucket, service_id: str, config: RateLimitConfig, at: datetime, *,
            max_wait: float | None = None) -> tuple[TokenBucket, float]:
    """Take a token for one call: the bucket to keep and the seconds to wait first.

    Raises RateLimited (E3504), leaving the bucket as it was, when there is no token
    and the config says reject, or when the wait would exceed `max_wait` (e.g. the
    time left before the request's deadline).
    """
    taken, wait = bucket.take(at)
    if wait > 0 and (config.on_limit == "reject" or (max_wait is not None and wait > max_wait)):
        raise rejection(service_id, wait, config)
    return taken, wait
