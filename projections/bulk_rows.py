"""Bulk writes of read-model rows through each driver's fast path.

Rows go in as plain tuples in a table's column order: SQLite gets one `executemany` of
a prepared ``INSERT`` (no SQLAlchemy compilation or per-value type processing per
row), PostgreSQL a ``COPY ... FROM STDIN`` through psycopg. Both run on the caller's
connection, inside its transaction. JSON columns are serialised here, once, with one
serialiser for every path (live runner, rebuild, every dialect), so that rows written
by any of them read back identically.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import orjson
import psycopg
from sqlalchemy import JSON, Table
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection


def json_text(value: Any) -> str | None:
    """The stored text of a JSON column's value (None stays SQL NULL)."""
    return None if value is None else orjson.dumps(value).decode()


@lru_cache(maxsize=64)
def _layout(table: Table) -> tuple[tuple[str, ...], tuple[bool, ...]]:
    names = tuple(column.name for column in table.columns)
    return names, tuple(isinstance(column.type, JSON) for column in table.columns)


def columns_of(table: Table) -> tuple[str, ...]:
    """`table`'s column names in the order rows are written."""
    return _layout(table)[0]


def row_tuples(table: Table, rows: Iterable[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """`rows` (column -> value) as tuples in `table`'s column order, JSON serialised."""
    names, is_json = _layout(table)
    plan = tuple(zip(names, is_json, strict=True))
    return [tuple(json_text(row[name]) if as_json else row[name] for name, as_json in plan)
            for row in rows]


async def insert_tuples(conn: AsyncConnection, table: Table,
                        rows: Sequence[Sequence[Any]]) -> None:
    """Insert `rows` (tuples in `columns_of(table)` order, JSON already text) into
    `table` within `conn`'s transaction."""
    if not rows:
        return
    if conn.dialect.name == "postgresql":
        await _copy(conn, table, rows)
        return
    names = columns_of(table)
    await conn.exec_driver_sql(_insert_sql(table.name, names), list(rows))


@lru_cache(maxsize=64)
def _insert_sql(name: str, columns: tuple[str, ...]) -> str:
    quoted = ", ".join(f'"{c}"' for c in columns)
    return f'INSERT INTO "{name}" ({quoted}) VALUES ({", ".join("?" for _ in columns)})'


async def _copy(conn: AsyncConnection, table: Table, rows: Sequence[Sequence[Any]]) -> None:
    raw = await conn.get_raw_connection()
    driver: Any = raw.driver_connection  # psycopg.AsyncConnection, in SQLAlchemy's transaction
    quoted = ", ".join(f'"{c}"' for c in columns_of(table))
    statement = f'COPY "{table.name}" ({quoted}) FROM STDIN'
    try:
        async with driver.cursor() as cursor, cursor.copy(statement) as copy:
            # `write_row`'s own steps without a coroutine per row: the formatter
            # buffers the rows and hands back a block whenever it is full.
            formatter = copy.formatter
            for row in rows:
                if block := formatter.write_row(row):
                    await copy.write(block)
    except psycopg.Error as error:  # as SQLAlchemy would raise it (IntegrityError, ...)
        raise DBAPIError.instance(statement, None, error, psycopg.Error) from error
