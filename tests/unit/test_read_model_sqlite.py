"""The read models' SQLite connections run each statement in the caller's thread
(toolexec.read_model_sqlite), with transactions as aiosqlite's."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from projections.database import make_engine
from toolexec.read_model_sqlite import INLINE_CONNECT_ARGS


@pytest.mark.parametrize("inline", [True, False])
async def test_statements_run_in_the_caller_s_thread_only_inline(tmp_path: Path,
                                                                 inline: bool) -> None:
    options: dict[str, Any] = {"connect_args": INLINE_CONNECT_ARGS} if inline else {}
    engine = make_engine(f"sqlite:///{tmp_path / 'models.db'}", **options)

    @event.listens_for(engine.sync_engine, "connect")
    def thread_function(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.create_function("thread_id", 0, threading.get_ident)

    try:
        async with engine.connect() as conn:
            ran_in = (await conn.execute(text("SELECT thread_id()"))).scalar_one()
    finally:
        await engine.dispose()
    assert (ran_in == threading.get_ident()) is inline


async def test_inline_connections_commit_and_roll_back(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'models.db'}",
                         connect_args=INLINE_CONNECT_ARGS)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)"))
            await conn.exec_driver_sql("INSERT INTO t VALUES (?, ?)", [("a", 1), ("b", 2)])
        with pytest.raises(RuntimeError):
            async with engine.begin() as conn:
                await conn.execute(text("UPDATE t SET v = 9"))
                raise RuntimeError("the batch fails")
        async with engine.connect() as conn:
            rows = (await conn.execute(text("SELECT k, v FROM t ORDER BY k"))).all()
            journal = (await conn.execute(text("PRAGMA journal_mode"))).scalar_one()
    finally:
        await engine.dispose()
    assert [tuple(r) for r in rows] == [("a", 1), ("b", 2)]
    assert journal == "wal"  # the engine's own connect hook ran on the inline connection
