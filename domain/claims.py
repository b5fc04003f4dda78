"""Idempotency claims on `invocation_id/attempt`: who may run an attempt.

A claim has an owner (one executor process) and a lease that covers the attempt's
timeout plus a grace period. The decision is pure; stores apply it atomically.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

LEASE_GRACE_SECONDS = 5.0


class ClaimStatus(StrEnum):
    ACQUIRED = "acquired"  # run it
    FINISHED = "finished"  # already concluded: publish its stored conclusion again
    RUNNING_HERE = "running_here"  # this owner claimed it and did not conclude it
    HELD_ELSEWHERE = "held_elsewhere"  # another live owner: wait for its lease
    ABANDONED = "abandoned"  # owner vanished mid-run: outcome unknown


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    key: str
    owner: str
    lease_until: float
    finished: bool
    conclusion: bytes | None = None
    """The event that concluded the attempt (opaque bytes), stored before it is
    published so a redelivery can publish it again instead of concluding twice."""


@dataclass(frozen=True, slots=True)
class ClaimDecision:
    status: ClaimStatus
    record: ClaimRecord | None
    """The row to store (acquired: the new claim) or the one found."""


def decide(existing: ClaimRecord | None, *, key: str, owner: str, now: float,
           lease_seconds: float) -> ClaimDecision:
    """What a delivery of attempt `key` should do, given the claim found for it."""
    fresh = ClaimRecord(key, owner, now + lease_seconds + LEASE_GRACE_SECONDS, False)
    if existing is None:
        return ClaimDecision(ClaimStatus.ACQUIRED, fresh)
    if existing.finished:
        return ClaimDecision(ClaimStatus.FINISHED, existing)
    if existing.owner == owner:
        return ClaimDecision(ClaimStatus.RUNNING_HERE, existing)
    if now < existing.lease_until:
        return ClaimDecision(ClaimStatus.HELD_ELSEWHERE, existing)
    return ClaimDecision(ClaimStatus.ABANDONED, existing)


def take_over(record: ClaimRecord, *, owner: str, now: float,
              lease_seconds: float) -> ClaimRecord:
    """The claim after an idempotent tool's abandoned attempt is taken over."""
    return ClaimRecord(record.key, owner, now + lease_seconds + LEASE_GRACE_SECONDS, False)
