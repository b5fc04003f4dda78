"""Databases for the projection tests: SQLite files and a real PostgreSQL.

PostgreSQL comes from `TOOLEXEC_TEST_DATABASE_URL` (a server URL; each test gets a
fresh database on it) or from PyPI `pgserver`, started once per session. Tests on
PostgreSQL are skipped, saying why, only when neither is available; a pgserver that
will not start (after its retries) fails them.
Import the fixtures into a test module: ``from tests.projection_db import *``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import make_url, select
from sqlalchemy.ext.asyncio import AsyncEngine

from projections.database import make_engine, migrate
from projections.runner import ProjectionRunner
from projections.store import ReadModel
from toolexec.local_postgres import pgserver_installed, start_pgserver

TEST_DATABASE_ENV = "TOOLEXEC_TEST_DATABASE_URL"

__all__ = ["postgres_server_url", "database_url", "engine", "snapshot"]


@contextlib.contextmanager
def pgserver_data_dir() -> Iterator[Path]:
    """A fresh data directory for pgserver, outside pytest's temporary directories:
    run as root, pgserver opens the folders above its data to its own user, and another
    pytest session starting on the machine makes pytest's root private again (0700),
    which cut a server starting meanwhile off from its data."""
    folder = Path(tempfile.mkdtemp(prefix="toolexec-test-pg-"))
    try:
        yield folder / "data"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """URL of a PostgreSQL server's maintenance database (psycopg driver)."""
    external = os.environ.get(TEST_DATABASE_ENV, "").strip()
    if external:
        yield external
        return
    if not pgserver_installed():
        pytest.skip("PostgreSQL tests need PyPI pgserver or TOOLEXEC_TEST_DATABASE_URL")
    # pgserver is installed with the test extra: a server that will not start is a
    # failure of every PostgreSQL test, never a silent skip
    with pgserver_data_dir() as data:
        server = start_pgserver(data)
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


def _fresh_postgres(server_url: str) -> str:
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    url = make_url(server_url.replace("postgresql+psycopg://", "postgresql://", 1))
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.set(drivername="postgresql+psycopg", database=name).render_as_string(
        hide_password=False)


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database: a SQLite file, then a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'projections.db'}"
    return _fresh_postgres(request.getfixturevalue("postgres_server_url"))


@pytest_asyncio.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on `database_url`, migrated to head."""
    created = make_engine(database_url)
    await migrate(created)
    yield created
    await created.dispose()


async def snapshot(engine: AsyncEngine, model: ReadModel) -> dict[str, list[dict[str, Any]]]:
    """Every row of `model`'s tables, ordered by primary key."""
    out: dict[str, list[dict[str, Any]]] = {}
    async with engine.connect() as conn:
        for table in model.tables:
            result = await conn.execute(select(table).order_by(*table.primary_key.columns))
            out[table.name] = [dict(row) for row in result.mappings()]
    return out


async def run_to_end(runner: ProjectionRunner, timeout: float = 60) -> None:
    """Open `runner`, apply every record up to the log end as it is now, close it."""
    await runner.open()
    try:
        await step_to_end(runner, timeout)
    finally:
        await runner.close()


async def step_to_end(runner: ProjectionRunner, timeout: float = 60) -> None:
    """Apply every record up to the log end as it is now with an open `runner`."""
    ends = await runner.end_offsets()
    async with asyncio.timeout(timeout):
        while not runner.reached(ends):
            await runner.step()
