"""Idempotency claims on `invocation_id/attempt`: who may run an attempt.

A claim has an owner (one executor process) and a lease that covers the attempt's
timeout plus a grace period; a store that can tell that the owner has ended (the
SQLite store, on one host) does not wait its lease out. The decision is pure; stores
apply it atomically.

An executor marks its claim started (conditionally: only while it still owns it)
before it announces and runs the attempt, and concludes it (conditionally too). So an
executor that stalled past its lease and lost its claim to another can neither start
the tool nor conclude the attempt, and the one that took the claim over knows whether
the tool may have run (started) or certainly did not.
"""

from __future__ import annotations

from collections.abc import Callable
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
    started: bool = False
    """Set by the owner just before it announces and starts the attempt: a claim left
    unfinished without it was never started, so running it again is safe."""


@dataclass(frozen=True, slots=True)
class ClaimDecision:
    status: ClaimStatus
    record: ClaimRecord | None
    """The row to store (acquired: the new claim) or the one found."""


def _never_gone(owner: str) -> bool:
    return False


def decide(existing: ClaimRecord | None, *, key: str, owner: str, now: float,
           lease_seconds: float, gone: Callable[[str], bool] = _never_gone) -> ClaimDecision:
    """What a delivery of attempt `key` should do, given the claim found for it.
    `gone(owner)` is True for an owner known to have ended (a store that can tell):
    its lease is not waited out."""
    fresh = ClaimRecord(key, owner, now + lease_seconds + LEASE_GRACE_SECONDS, False)
    if existing is None:
        return ClaimDecision(ClaimStatus.ACQUIRED, fresh)
    if existing.finished:
        return ClaimDecision(ClaimStatus.FINISHED, existing)
    if existing.owner == owner:
        return ClaimDecision(ClaimStatus.RUNNING_HERE, existing)
    if now < existing.lease_until and not gone(existing.owner):
        return ClaimDecision(ClaimStatus.HELD_ELSEWHERE, existing)
    return ClaimDecision(ClaimStatus.ABANDONED, existing)


def take_over(record: ClaimRecord, *, owner: str, now: float,
              lease_seconds: float) -> ClaimRecord:
    """The claim after an idempotent tool's abandoned attempt is taken over."""
    return ClaimRecord(record.key, owner, now + lease_seconds + LEASE_GRACE_SECONDS, False)
