"""Request deadlines (`InvokeRequested.deadline`): work past one stops with E3002."""

from __future__ import annotations

from datetime import datetime

from domain.errors import ToolexecError


class DeadlineExceeded(ToolexecError):
    """E3002: the request's deadline passed before the work could be done."""

    code = "E3002"


def remaining(deadline: datetime | None, now: datetime) -> float | None:
    """Seconds left until `deadline` (negative once past); None without a deadline."""
    if deadline is None:
        return None
    return (deadline - now).total_seconds()


def ensure_not_expired(deadline: datetime | None, now: datetime) -> None:
    """Raise DeadlineExceeded (E3002) when `deadline` is at or before `now`."""
    left = remaining(deadline, now)
    if left is not None and left <= 0:
        assert deadline is not None
        raise DeadlineExceeded(
            "the request's deadline has passed",
            details={"deadline": deadline.isoformat(), "late_by_seconds": round(-left, 3)},
        )


def effective_timeout(plan_timeout: float, deadline: datetime | None, now: datetime) -> float:
    """The timeout one attempt gets: the plan's, capped by the time left until the
    deadline. Raises DeadlineExceeded when none is left."""
    ensure_not_expired(deadline, now)
    left = remaining(deadline, now)
    return plan_timeout if left is None else min(plan_timeout, left)
