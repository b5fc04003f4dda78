"""Claim stores: the executor's idempotency record of `invocation_id/attempt`.

`SqliteClaims` is durable (embedded profile: a file under the state dir), so an
executor restarted after a crash knows which attempts were started and not
finished. `InMemoryClaims` serves tests and single-shot runs. Both apply the pure
decision of `domain.claims` atomically.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

from domain.claims import ClaimDecision, ClaimRecord, ClaimStatus, decide, take_over

_SCHEMA = """
CREATE TABLE IF NOT EXISTS claims (
    key TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    lease_until REAL NOT NULL,
    finished INTEGER NOT NULL DEFAULT 0,
    conclusion BLOB
)
"""


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

    async def take_over(self, key: str, *, now: float, lease_seconds: float) -> None:
        self.rows[key] = take_over(self.rows[key], owner=self.owner, now=now,
                                    lease_seconds=lease_seconds)

    async def finish(self, key: str, conclusion: bytes | None = None) -> None:
        row = self.rows.get(key)
        if row is not None:
            self.rows[key] = ClaimRecord(row.key, row.owner, row.lease_until, True, conclusion)


class SqliteClaims:
    """Durable ClaimStore on SQLite (WAL); each call is one short transaction."""

    def __init__(self, path: Path, owner: str) -> None:
        self.owner = owner
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(claims)")}
        if "conclusion" not in columns:  # a store written before conclusions were kept
            self._db.execute("ALTER TABLE claims ADD COLUMN conclusion BLOB")
        self._lock = threading.Lock()

    async def claim(self, key: str, *, now: float, lease_seconds: float) -> ClaimDecision:
        return await asyncio.to_thread(self._claim, key, now, lease_seconds)

    async def take_over(self, key: str, *, now: float, lease_seconds: float) -> None:
        await asyncio.to_thread(self._write, take_over(
            ClaimRecord(key, "", 0.0, False), owner=self.owner, now=now,
            lease_seconds=lease_seconds))

    async def finish(self, key: str, conclusion: bytes | None = None) -> None:
        await asyncio.to_thread(self._finish, key, conclusion)

    def close(self) -> None:
        self._db.close()

    def _claim(self, key: str, now: float, lease_seconds: float) -> ClaimDecision:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT key, owner, lease_until, finished, conclusion FROM claims "
                    "WHERE key = ?", (key,)).fetchone()
                existing = (ClaimRecord(row[0], row[1], row[2], bool(row[3]), row[4])
                            if row else None)
                decision = decide(existing, key=key, owner=self.owner, now=now,
                                  lease_seconds=lease_seconds)
                if decision.status is ClaimStatus.ACQUIRED and decision.record is not None:
                    self._upsert(decision.record)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return decision

    def _write(self, record: ClaimRecord) -> None:
        with self._lock:
            self._upsert(record)

    def _upsert(self, record: ClaimRecord) -> None:
        self._db.execute(
            "INSERT INTO claims (key, owner, lease_until, finished) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET owner = excluded.owner, "
            "lease_until = excluded.lease_until, finished = excluded.finished",
            (record.key, record.owner, record.lease_until, int(record.finished)))

    def _finish(self, key: str, conclusion: bytes | None) -> None:
        with self._lock:
            self._db.execute("UPDATE claims SET finished = 1, conclusion = ? WHERE key = ?",
                             (conclusion, key))
