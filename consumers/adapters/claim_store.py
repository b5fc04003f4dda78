"""Claim stores: the executor's idempotency record of `invocation_id/attempt`.

`RedisClaims` is the production store, shared by every executor replica (SET NX for
the claim, an optimistic transaction for a take-over). `SqliteClaims` is durable on
one host (embedded profile: a file under the state dir), so an executor restarted
after a crash knows which attempts were started and not finished, and at once (not
after their leases) that their owner is gone (`owner_locks`). `InMemoryClaims`
serves tests and single-shot runs. All apply the pure decision of `domain.claims`
atomically.
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from consumers.adapters.owner_locks import OwnerLocks
from domain.claims import ClaimDecision, ClaimRecord, ClaimStatus, decide, take_over

_SCHEMA = """
CREATE TABLE IF NOT EXISTS claims (
    key TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    lease_until REAL NOT NULL,
    finished INTEGER NOT NULL DEFAULT 0,
    conclusion BLOB,
    started INTEGER NOT NULL DEFAULT 0
)
"""
REDIS_PREFIX = "toolexec:claim:"
REDIS_TTL_SECONDS = 7 * 24 * 3600
"""Claims outlive any redelivery window; then Redis forgets them."""


def _finished(row: ClaimRecord, conclusion: bytes | None) -> ClaimRecord:
    return ClaimRecord(row.key, row.owner, row.lease_until, True, conclusion, row.started)


def _started(row: ClaimRecord) -> ClaimRecord:
    return ClaimRecord(row.key, row.owner, row.lease_until, row.finished, row.conclusion, True)


class InMemoryClaims:
    """ClaimStore for one process; forgets everything when the process ends.
    Owners given the same `rows` share one table (tests of several executors)."""

    def __init__(self, owner: str, rows: dict[str, ClaimRecord] | None = None) -> None:
        self.owner = owner
        self.rows: dict[str, ClaimRecord] = {} if rows is None else rows

    async def claim(self, key: str, *, now: float, lease_seconds: float) -> ClaimDecision:
        decision = decide(self.rows.get(key), key=key, owner=self.owner, now=now,
                          lease_seconds=lease_seconds)
        if decision.status is ClaimStatus.ACQUIRED and decision.record is not None:
            self.rows[key] = decision.record
        return decision

    async def take_over(self, found: ClaimRecord, *, now: float, lease_seconds: float) -> bool:
        if self.rows.get(found.key) != found:
            return False
        self.rows[found.key] = take_over(found, owner=self.owner, now=now,
                                         lease_seconds=lease_seconds)
        return True

    async def start(self, key: str) -> bool:
        row = self.rows.get(key)
        if row is None or row.owner != self.owner or row.finished:
            return False
        self.rows[key] = _started(row)
        return True

    async def finish(self, key: str, conclusion: bytes | None = None) -> bool:
        row = self.rows.get(key)
        if row is None or row.owner != self.owner or row.finished:
            return False
        self.rows[key] = _finished(row, conclusion)
        return True


class SqliteClaims:
    """Durable ClaimStore on SQLite (WAL); each call is one short transaction.

    Calls run on the event loop's thread: a claim is a ~50 us local transaction (no
    fsync per commit with WAL and synchronous=NORMAL), cheaper than the hand-off to a
    worker thread it replaced (measured: ~10% of the executor's CPU under load).
    """

    def __init__(self, path: Path, owner: str) -> None:
        self.owner = owner
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Outcomes are recorded here: private to this user (SQLite gives the -wal and
        # -shm files the same mode).
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        os.chmod(path, 0o600)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(claims)")}
        if "conclusion" not in columns:  # a store written before conclusions were kept
            self._db.execute("ALTER TABLE claims ADD COLUMN conclusion BLOB")
        if "started" not in columns:  # a store written before starts were marked
            self._db.execute("ALTER TABLE claims ADD COLUMN started INTEGER NOT NULL DEFAULT 1")
        self._lock = threading.Lock()
        self._owners = OwnerLocks(path.with_name(path.name + ".owners"), owner)
        self._owners.sweep(row[0] for row in self._db.execute(
            "SELECT DISTINCT owner FROM claims WHERE finished = 0"))

    async def claim(self, key: str, *, now: float, lease_seconds: float) -> ClaimDecision:
        return self._claim(key, now, lease_seconds)

    async def take_over(self, found: ClaimRecord, *, now: float, lease_seconds: float) -> bool:
        fresh = take_over(found, owner=self.owner, now=now, lease_seconds=lease_seconds)
        return self._take_over(found, fresh)

    async def start(self, key: str) -> bool:
        with self._lock:
            cursor = self._db.execute(
                "UPDATE claims SET started = 1 WHERE key = ? AND owner = ? AND finished = 0",
                (key, self.owner))
            return cursor.rowcount == 1

    async def finish(self, key: str, conclusion: bytes | None = None) -> bool:
        return self._finish(key, conclusion)

    def close(self) -> None:
        self._db.close()
        self._owners.close()

    def _claim(self, key: str, now: float, lease_seconds: float) -> ClaimDecision:
        fresh = decide(None, key=key, owner=self.owner, now=now, lease_seconds=lease_seconds)
        with self._lock:
            if fresh.status is ClaimStatus.ACQUIRED and fresh.record is not None:
                # The usual case, a key never claimed: one statement, not a transaction
                # of four (each releases and takes back the GIL, contended in `up`).
                record = fresh.record
                inserted = self._db.execute(
                    "INSERT OR IGNORE INTO claims (key, owner, lease_until, finished, started) "
                    "VALUES (?, ?, ?, 0, 0)", (record.key, record.owner, record.lease_until))
                if inserted.rowcount == 1:
                    return fresh
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT key, owner, lease_until, finished, conclusion, started FROM claims "
                    "WHERE key = ?", (key,)).fetchone()
                existing = (ClaimRecord(row[0], row[1], row[2], bool(row[3]), row[4],
                                        bool(row[5])) if row else None)
                decision = decide(existing, key=key, owner=self.owner, now=now,
                                  lease_seconds=lease_seconds, gone=self._owners.gone)
                if decision.status is ClaimStatus.ACQUIRED and decision.record is not None:
                    record = decision.record
                    self._db.execute(
                        "INSERT INTO claims (key, owner, lease_until, finished, started) "
                        "VALUES (?, ?, ?, 0, 0)", (record.key, record.owner, record.lease_until))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return decision

    def _take_over(self, found: ClaimRecord, fresh: ClaimRecord) -> bool:
        with self._lock:
            cursor = self._db.execute(
                "UPDATE claims SET owner = ?, lease_until = ?, started = 0 "
                "WHERE key = ? AND owner = ? AND lease_until = ? AND finished = 0",
                (fresh.owner, fresh.lease_until, found.key, found.owner, found.lease_until))
            return cursor.rowcount == 1

    def _finish(self, key: str, conclusion: bytes | None) -> bool:
        with self._lock:
            cursor = self._db.execute(
                "UPDATE claims SET finished = 1, conclusion = ? "
                "WHERE key = ? AND owner = ? AND finished = 0", (conclusion, key, self.owner))
            return cursor.rowcount == 1


class RedisClaims:
    """ClaimStore on Redis, shared by every executor replica (production profile).

    `client` is a `redis.asyncio.Redis`. A claim is one JSON value per key, created
    with SET NX; a take-over replaces it only if it is still the abandoned value read
    (WATCH/MULTI), so two executors never both take over one attempt.
    """

    def __init__(self, client: Any, owner: str, *, prefix: str = REDIS_PREFIX,
                 ttl_seconds: int = REDIS_TTL_SECONDS) -> None:
        self.owner = owner
        self._redis = client
        self._prefix = prefix
        self._ttl = ttl_seconds

    async def claim(self, key: str, *, now: float, lease_seconds: float) -> ClaimDecision:
        while True:
            fresh = decide(None, key=key, owner=self.owner, now=now, lease_seconds=lease_seconds)
            assert fresh.record is not None
            if await self._redis.set(self._prefix + key, _dump(fresh.record), nx=True,
                                     ex=self._ttl):
                return fresh
            raw = await self._redis.get(self._prefix + key)
            if raw is not None:  # None: it expired between the two calls, try again
                return decide(_load(raw), key=key, owner=self.owner, now=now,
                              lease_seconds=lease_seconds)

    async def take_over(self, found: ClaimRecord, *, now: float, lease_seconds: float) -> bool:
        from redis.exceptions import WatchError

        fresh = take_over(found, owner=self.owner, now=now, lease_seconds=lease_seconds)
        name = self._prefix + found.key
        async with self._redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(name)
                raw = await pipe.get(name)
                if raw is None or _load(raw) != found:
                    return False
                pipe.multi()
                pipe.set(name, _dump(fresh), ex=self._ttl)
                await pipe.execute()
            except WatchError:
                return False
        return True

    async def start(self, key: str) -> bool:
        return await self._update_own(key, _started)

    async def finish(self, key: str, conclusion: bytes | None = None) -> bool:
        return await self._update_own(key, lambda record: _finished(record, conclusion))

    async def _update_own(self, key: str, change: Callable[[ClaimRecord], ClaimRecord]) -> bool:
        """Replace this owner's unfinished claim of `key` by `change(claim)`; False when
        the claim is not (any more) this owner's or is finished."""
        from redis.exceptions import WatchError

        name = self._prefix + key
        async with self._redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(name)
                raw = await pipe.get(name)
                if raw is None:
                    return False
                record = _load(raw)
                if record.owner != self.owner or record.finished:
                    return False
                pipe.multi()
                pipe.set(name, _dump(change(record)), ex=self._ttl)
                await pipe.execute()
            except WatchError:
                return False
        return True


def _dump(record: ClaimRecord) -> str:
    conclusion = (None if record.conclusion is None
                  else base64.b64encode(record.conclusion).decode("ascii"))
    return json.dumps({"key": record.key, "owner": record.owner,
                       "lease_until": record.lease_until, "finished": record.finished,
                       "conclusion": conclusion, "started": record.started},
                      separators=(",", ":"))


def _load(raw: bytes | str) -> ClaimRecord:
    data = json.loads(raw)
    conclusion = data.get("conclusion")
    # A claim written before starts were marked counts as started (the safe side).
    return ClaimRecord(data["key"], data["owner"], float(data["lease_until"]),
                       bool(data["finished"]),
                       None if conclusion is None else base64.b64decode(conclusion),
                       bool(data.get("started", True)))
