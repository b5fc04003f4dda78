"""Decision stores: where the authorize step keeps ABAC decisions for reuse.

A decision is keyed by (subject, tool, version, policy version, parameter keys)
(`domain.policy.cache_key`) and lives `ttl_seconds`. Two adapters of one port
(`consumers.ports.DecisionStore`, re-exported here):

- `MemoryDecisions` — the embedded profile: the in-process `domain.policy.DecisionCache`.
- `RedisDecisions` — the production profile: one Redis shared by every authorize
  replica, so a decision made by one is reused by all. Keys carry the policy version,
  so a replica that has folded a newer `policy.updated` never reads a decision made
  under older policies; and every replica, when its policy view folds a
  `policy.updated` from the log, deletes the cached decisions (this also clears the
  decisions of an external ABAC engine, whose key has no policy version). There is no
  other channel between replicas than the log.

Limits: a purge that fails (Redis down) is not retried, so decisions of an external
engine may then live until their TTL; and policy text re-applied under an unchanged
version id (`toolexec policy apply` versions by content hash unless told otherwise)
relies on the purge alone, so a replica that has not folded it yet may write one
last decision under the old text.

Redis is an optimisation, never a dependency of a decision: when it fails (down,
timeout, bad data) the step evaluates the policies as if the entry were missing,
says so in one warning log line per outage, and retries Redis after
`retry_after_seconds`.

Hits and misses are counted in the default Prometheus registry
(`toolexec_decision_cache_hits_total` / `_misses_total`, label `backend` = memory or
redis; `toolexec_decision_cache_errors_total` for Redis failures).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog
from prometheus_client import Counter

from consumers.ports import DecisionStore
from domain.policy import CacheKey, DecisionCache, PolicyDecision

log = structlog.get_logger(__name__)

__all__ = ["DecisionStore", "MemoryDecisions", "RedisDecisions"]

REDIS_PREFIX = "toolexec:decision:"
HITS = Counter("toolexec_decision_cache_hits", "ABAC decisions served from the cache",
               ["backend"])
MISSES = Counter("toolexec_decision_cache_misses",
                 "ABAC decisions not in the cache (evaluated)", ["backend"])
ERRORS = Counter("toolexec_decision_cache_errors",
                 "Decision cache operations that failed (the decision was evaluated)",
                 ["backend"])


class MemoryDecisions:
    """DecisionStore of one process (embedded profile)."""

    backend = "memory"

    def __init__(self, cache: DecisionCache | None = None) -> None:
        self.cache = cache if cache is not None else DecisionCache()

    async def get(self, key: CacheKey, *, now: float) -> PolicyDecision | None:
        found = self.cache.get(key, now=now)
        (MISSES if found is None else HITS).labels(self.backend).inc()
        return None if found is None else replace(found, cached=True)

    async def put(self, key: CacheKey, decision: PolicyDecision, *, now: float) -> None:
        self.cache.put(key, decision, now=now)

    def invalidate(self) -> None:
        self.cache.clear()


class RedisDecisions:
    """DecisionStore in Redis, shared by every replica (production profile).

    `client` is a `redis.asyncio.Redis`, best created with short socket timeouts: a
    slow Redis delays decisions by at most `operation_timeout` before they are
    evaluated instead."""

    backend = "redis"

    def __init__(self, client: Any, *, ttl_seconds: float = 300.0, prefix: str = REDIS_PREFIX,
                 operation_timeout: float = 1.0, retry_after_seconds: float = 5.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._redis = client
        self._ttl_ms = max(int(ttl_seconds * 1000), 1)
        self._prefix = prefix
        self._timeout = operation_timeout
        self._retry_after = retry_after_seconds
        self._monotonic = monotonic
        self._down_until: float | None = None
        self._purge_wanted = False
        self._purge: asyncio.Task[None] | None = None

    @property
    def prefix(self) -> str:
        """Every key of this store starts with it."""
        return self._prefix

    def name(self, key: CacheKey) -> str:
        """The Redis key: prefix, a digest of the policy version, a digest of the rest."""
        subject, tool_id, version, policy_version, parameter_keys = key
        rest = json.dumps([subject, tool_id, version, list(parameter_keys)])
        return f"{self._prefix}{_digest(policy_version)[:16]}:{_digest(rest)}"

    async def get(self, key: CacheKey, *, now: float) -> PolicyDecision | None:
        raw = await self._call("get", self.name(key))
        found = _load(raw) if isinstance(raw, bytes | str) else None
        if raw is not None and found is None:
            ERRORS.labels(self.backend).inc()
            log.warning("decision_cache.bad_entry", key=self.name(key))
        (MISSES if found is None else HITS).labels(self.backend).inc()
        return found

    async def put(self, key: CacheKey, decision: PolicyDecision, *, now: float) -> None:
        await self._call("set", self.name(key), _dump(decision), px=self._ttl_ms)

    def invalidate(self) -> None:
        """Schedule the deletion of every cached decision (coalesced: one purge at a
        time, another one after it when more policy updates arrived meanwhile)."""
        self._purge_wanted = True
        if self._purge is None or self._purge.done():
            with contextlib.suppress(RuntimeError):  # no running loop: nothing cached yet
                self._purge = asyncio.get_running_loop().create_task(self._purge_all())

    async def settled(self) -> None:
        """Wait until scheduled purges are done (tests, shutdown)."""
        while self._purge is not None and not self._purge.done():
            await asyncio.shield(self._purge)

    async def _purge_all(self) -> None:
        while self._purge_wanted:
            self._purge_wanted = False
            names = await self._call("keys_of", self._prefix + "*")
            if names:
                await self._call("unlink", *names)

    async def _call(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        """One Redis command; None when Redis is (or was recently) unavailable."""
        now = self._monotonic()
        if self._down_until is not None and now < self._down_until:
            return None
        try:
            async with asyncio.timeout(self._timeout):
                if operation == "keys_of":
                    result = [name async for name in self._redis.scan_iter(match=args[0],
                                                                           count=1000)]
                else:
                    result = await getattr(self._redis, operation)(*args, **kwargs)
        except (OSError, TimeoutError, _redis_error()) as error:
            ERRORS.labels(self.backend).inc()
            if self._down_until is None:
                log.warning("decision_cache.redis_unavailable", operation=operation,
                            error=f"{type(error).__name__}: {error}",
                            fallback="evaluating policies without the cache")
            self._down_until = now + self._retry_after
            return None
        if self._down_until is not None:
            log.info("decision_cache.redis_available")
            self._down_until = None
        return result


def _redis_error() -> type[Exception]:
    from redis.exceptions import RedisError

    return RedisError


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _dump(decision: PolicyDecision) -> str:
    return json.dumps({"allowed": decision.allowed, "reason": decision.reason,
                       "policy_version": decision.policy_version,
                       "policy_ids": list(decision.policy_ids),
                       "approval": list(decision.approval)})


def _load(raw: bytes | str) -> PolicyDecision | None:
    try:
        data = json.loads(raw)
        return PolicyDecision(allowed=data["allowed"] is True, reason=str(data["reason"]),
                              policy_version=data["policy_version"],
                              policy_ids=tuple(str(i) for i in data["policy_ids"]),
                              approval=tuple(str(i) for i in data.get("approval", ())),
                              cached=True)
    except (ValueError, KeyError, TypeError):
        return None
