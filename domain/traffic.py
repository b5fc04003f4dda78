"""Traffic over a time window: per tool and per bucket (a minute by default), how many
invocations ended, how fast (p50 / p95 latency) and how many failed.

Pure arithmetic over the endings the read models hold; the status page charts it.
A cancellation ends an invocation without counting as an error.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from domain.errors import JobCancelled

CANCELLED_CODE = JobCancelled.code


@dataclass(frozen=True, slots=True)
class Ending:
    """One invocation's terminal event: when, which tool, how it ended, how long it took."""

    at: datetime
    tool_id: str
    failed: bool
    duration_ms: float | None = None
    error_code: str | None = None

    @property
    def is_error(self) -> bool:
        return self.failed and self.error_code != CANCELLED_CODE


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile of `values` (None when empty): the smallest value
    at least `fraction` of the values are less than or equal to."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True, slots=True)
class Bucket:
    """One tool's traffic in one bucket of the window."""

    start: datetime
    ended: int
    errors: int
    p50_ms: float | None
    p95_ms: float | None
    seconds: float

    @property
    def per_second(self) -> float:
        return self.ended / self.seconds

    @property
    def error_rate(self) -> float | None:
        return None if self.ended == 0 else self.errors / self.ended

    def as_dict(self) -> dict[str, Any]:
        return {"start": self.start.isoformat(), "ended": self.ended, "errors": self.errors,
                "per_second": self.per_second, "error_rate": self.error_rate,
                "p50_ms": self.p50_ms, "p95_ms": self.p95_ms}


def traffic(endings: Iterable[Ending], *, start: datetime, end: datetime,
            bucket_seconds: int = 60) -> dict[str, list[Bucket]]:
    """Per tool, the buckets of [start, end) in time order (empty buckets included);
    endings outside the window are left out."""
    if bucket_seconds <= 0 or end <= start:
        raise ValueError("the window needs a positive length and bucket size")
    count = math.ceil((end - start).total_seconds() / bucket_seconds)
    grouped: dict[str, list[list[Ending]]] = defaultdict(lambda: [[] for _ in range(count)])
    for ending in endings:
        if start <= ending.at < end:
            index = int((ending.at - start).total_seconds() // bucket_seconds)
            grouped[ending.tool_id][index].append(ending)
    starts = [start + timedelta(seconds=i * bucket_seconds) for i in range(count)]
    return {tool: [_bucket(starts[i], group, bucket_seconds) for i, group in enumerate(groups)]
            for tool, groups in sorted(grouped.items())}


def _bucket(start: datetime, endings: Sequence[Ending], seconds: int) -> Bucket:
    durations = [e.duration_ms for e in endings if e.duration_ms is not None]
    return Bucket(start=start, ended=len(endings), errors=sum(e.is_error for e in endings),
                  p50_ms=percentile(durations, 0.50), p95_ms=percentile(durations, 0.95),
                  seconds=float(seconds))
