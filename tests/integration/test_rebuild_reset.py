"""A rebuild's reset on SQLite does not zero (and log) every page its delete frees, and
leaves the connection's own `secure_delete` setting as it found it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from projections.audit import AuditModel
from projections.bulk_rows import insert_tuples
from projections.database import make_engine, migrate
from projections.rebuild import reset
from projections.sqlite_pages import zero_free_pages
from projections.tables import audit_log

ROWS = 3000
DOCUMENT = "x" * 2000  # ~1,500 pages of rows: zeroing them would fill the WAL


def _secure_delete_on(dbapi_connection: Any, _record: Any) -> None:
    """What a build with secure_delete on (Debian's) gives every connection."""
    dbapi_connection.execute("PRAGMA secure_delete=ON")


async def _engine(path: Path) -> AsyncEngine:
    engine = make_engine(f"sqlite:///{path}", pool_size=1, max_overflow=0)
    event.listen(engine.sync_engine, "connect", _secure_delete_on)
    await migrate(engine)
    return engine


async def test_reset_frees_the_pages_without_writing_them_and_restores_the_setting(
        tmp_path: Path) -> None:
    path = tmp_path / "reset.sqlite3"
    engine = await _engine(path)
    model = AuditModel(("t",))
    try:
        async with engine.begin() as conn:
            await insert_tuples(conn, audit_log, [
                ("t", 0, offset, f"e{offset}", "tool.published", "2026-01-01T00:00:00Z",
                 None, None, DOCUMENT, 0, "0" * 64, "1" * 64, None)
                for offset in range(ROWS)])
        async with engine.connect() as conn:
            await conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        wal = path.with_name(path.name + "-wal")
        assert wal.stat().st_size == 0

        await reset(engine, model)

        # secure_delete=ON would have written every freed page (> 6 MB of rows) zeroed
        # into the WAL; the pages the delete writes anyway are a few dozen.
        assert wal.stat().st_size < 1_000_000
        async with engine.connect() as conn:
            assert (await conn.execute(select(func.count()).select_from(audit_log))
                    ).scalar() == 0
            assert (await conn.exec_driver_sql("PRAGMA secure_delete")).scalar() == 1
    finally:
        await engine.dispose()


async def test_a_rebuild_purges_what_the_reset_freed_and_the_replay_did_not_reuse(
        tmp_path: Path) -> None:
    """Text the models held before (here: before a stricter redaction rule) is in no
    page of the file once the rebuild has zeroed the pages its replay left free."""
    path = tmp_path / "purge.sqlite3"
    engine = await _engine(path)
    model = AuditModel(("t",))

    async def rows(count: int, document: str) -> None:
        async with engine.begin() as conn:
            await insert_tuples(conn, audit_log, [
                ("t", 0, offset, f"e{offset}", "tool.published", "2026-01-01T00:00:00Z",
                 None, None, document, 0, "0" * 64, "1" * 64, None)
                for offset in range(count)])

    async def file_bytes() -> bytes:
        async with engine.connect() as conn:
            await conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        return path.read_bytes() + path.with_name(path.name + "-wal").read_bytes()

    try:
        await rows(ROWS, "PURGE-ME " * 200)
        assert b"PURGE-ME" in await file_bytes()
        await reset(engine, model)
        await rows(ROWS // 3, "[redacted] " * 150)  # the replay: fewer, smaller rows
        assert b"PURGE-ME" in await file_bytes()  # left by the fast reset

        assert await zero_free_pages(engine) > 0

        assert b"PURGE-ME" not in await file_bytes()
        async with engine.connect() as conn:
            assert (await conn.exec_driver_sql("PRAGMA freelist_count")).scalar() > 0
            assert (await conn.exec_driver_sql("PRAGMA secure_delete")).scalar() == 1
            assert (await conn.execute(select(func.count()).select_from(audit_log))
                    ).scalar() == ROWS // 3
    finally:
        await engine.dispose()
