"""What a rebuild's reset leaves in a SQLite file: the pages its delete freed.

A rebuild drops a read model's secondary indexes, deletes its rows and folds them
again. Builds of SQLite with `secure_delete` on (Debian's) zero every page a drop or
a delete frees and write it to the WAL: 0.5-1 s and ~170 MiB of WAL for a
100,000-event rebuild's rows. So both run with `secure_delete=FAST` (`secure_delete`),
which clears deleted content only within the pages they write anyway; the replay then
reuses the freed pages for the rows it folds again, and SQLite clears a page it reuses. What the replay does not
reuse is zeroed at the end (`zero_free_pages`), so a rebuild still purges what the
models held before (e.g. text a stricter redaction rule now hides), at the cost of
the pages left over rather than of every page deleted.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Literal

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

FILL_TABLE = "toolexec_free_page_fill"
_SECURE_DELETE = {0: "OFF", 1: "ON", 2: "FAST"}
"""`PRAGMA secure_delete`'s answers, as it is set back (it reads 2 for FAST but
takes 2 as on); anything else is set back as on."""


@contextlib.asynccontextmanager
async def secure_delete(conn: AsyncConnection,
                        mode: Literal["ON", "FAST"]) -> AsyncIterator[None]:
    """On SQLite, `PRAGMA secure_delete=<mode>` while the block runs on `conn`, then
    the connection's own setting again; elsewhere nothing."""
    if conn.dialect.name != "sqlite":
        yield
        return
    before = (await conn.exec_driver_sql("PRAGMA secure_delete")).scalar()
    await conn.exec_driver_sql(f"PRAGMA secure_delete={mode}")
    try:
        yield
    finally:
        await conn.exec_driver_sql(f"PRAGMA secure_delete={_SECURE_DELETE.get(before, 'ON')}")


async def zero_free_pages(engine: AsyncEngine) -> int:
    """On SQLite, overwrite every page on the file's free list with zeros; how many
    there were (0 elsewhere). The free pages are taken by rows of zeros (SQLite
    clears a page it reuses, and the whole page is written), then freed again with
    `secure_delete` on, which writes them as zeros."""
    if engine.dialect.name != "sqlite":
        return 0
    async with engine.begin() as conn:
        free = await _pragma(conn, "freelist_count")
        if not free:
            return 0
        row_bytes = await _pragma(conn, "page_size") // 2
        await conn.exec_driver_sql(f"CREATE TABLE {FILL_TABLE} (b BLOB)")
        async with secure_delete(conn, "FAST"):
            left = free
            while left:
                await conn.exec_driver_sql(
                    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                    f"WHERE i < {left}) INSERT INTO {FILL_TABLE} "
                    f"SELECT zeroblob({row_bytes}) FROM n")
                left = await _pragma(conn, "freelist_count")
        async with secure_delete(conn, "ON"):
            await conn.exec_driver_sql(f"DROP TABLE {FILL_TABLE}")
    return free


async def _pragma(conn: AsyncConnection, name: str) -> int:
    return int((await conn.exec_driver_sql(f"PRAGMA {name}")).scalar() or 0)
