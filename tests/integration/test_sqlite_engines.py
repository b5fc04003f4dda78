"""Several engines on one SQLite database in one process (`up` has one per loop) while
other processes (the CLI) open and close it: every commit stays in the database."""

from __future__ import annotations

import asyncio
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from projections.database import make_engine

pytestmark = pytest.mark.integration

PEEK = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1])
print(connection.execute("select count(*) from t").fetchone()[0])
connection.close()  # a last connection checkpoints the WAL and deletes it
"""


def rows_seen_by_another_process(database: Path) -> int:
    done = subprocess.run([sys.executable, "-c", PEEK, str(database)], capture_output=True,
                          text=True, check=True)
    return int(done.stdout)


def test_a_second_engine_keeps_the_first_ones_commits_visible(tmp_path: Path) -> None:
    database = tmp_path / "toolexec.db"
    url = f"sqlite:///{database}"

    async def scenario() -> list[int]:
        first = make_engine(url)
        seen = []
        try:
            async with first.begin() as conn:
                await conn.execute(text("create table t (n integer)"))
                await conn.execute(text("insert into t values (1)"))
            second = make_engine(url)  # as a thread's own engine is made later
            try:
                async with second.begin() as conn:
                    await conn.execute(text("insert into t values (2)"))
                seen.append(rows_seen_by_another_process(database))
                async with first.begin() as conn:  # its connection has been open all along
                    await conn.execute(text("insert into t values (3)"))
                seen.append(rows_seen_by_another_process(database))
            finally:
                await second.dispose()
        finally:
            await first.dispose()
        return seen

    assert asyncio.run(scenario()) == [2, 3]
    assert rows_seen_by_another_process(database) == 3
    assert stat.S_IMODE(database.stat().st_mode) == 0o600
