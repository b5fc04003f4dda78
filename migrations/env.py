"""Alembic environment: runs on a connection handed in by `projections.database.migrate`,
or on its own async engine (``alembic -c alembic.ini upgrade head`` from the shell,
URL from ``sqlalchemy.url`` or the toolexec settings). SQLite runs in batch mode."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from projections.search import migration_managed
from projections.tables import metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata,
                      render_as_batch=connection.dialect.name == "sqlite",
                      compare_type=True,
                      include_name=lambda name, *_: not migration_managed(name))
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str:
    from projections.database import async_url
    from toolexec.settings import Settings

    return async_url(config.get_main_option("sqlalchemy.url") or
                     Settings().effective_database_url)


async def _run_async() -> None:
    engine = create_async_engine(_url())
    try:
        async with engine.begin() as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=metadata, literal_binds=True,
                      render_as_batch=_url().startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()
elif (given := config.attributes.get("connection")) is not None:
    _run(given)
else:
    asyncio.run(_run_async())
