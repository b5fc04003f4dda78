"""SQLite for the read models' own thread: each statement run where it is asked for.

aiosqlite gives every connection a worker thread and hands it each call (create a
cursor, execute, fetch, close: three or four per statement), each a round trip through
a queue and the event loop's self-pipe. The read models' runner has an event loop and
a thread of its own (`read_model_thread`) with nothing else to do while a statement
runs, so its connections run each call inline instead: the same aiosqlite objects
(SQLAlchemy's `sqlite+aiosqlite` dialect over them), no worker thread. SQLite
releases the GIL while it works, so the pipeline's thread runs meanwhile as before.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Generator
from typing import Any

import aiosqlite


class _Inline:
    """Stands in for aiosqlite's queue to its worker thread: runs each call at once
    (SQLAlchemy's dialect puts some calls, such as setting the isolation level, on
    that queue directly)."""

    @staticmethod
    def put_nowait(item: tuple[asyncio.Future[Any] | None, Callable[[], Any]]) -> None:
        future, function = item
        try:
            result = function()
        except BaseException as error:  # handed to the caller's future, as aiosqlite does
            if future is not None and not future.done():
                future.set_exception(error)
            return
        if future is not None and not future.done():
            future.set_result(result)


class InlineConnection(aiosqlite.Connection):
    """An `aiosqlite.Connection` that runs every call in the caller's thread."""

    def __init__(self, connector: Callable[[], sqlite3.Connection]) -> None:
        super().__init__(connector, iter_chunk_size=64)
        self._tx = _Inline()  # type: ignore[assignment]

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self._running or not self._connection:
            raise ValueError("Connection closed")
        return fn(*args, **kwargs)

    async def _connect(self) -> InlineConnection:
        if self._connection is None:
            self._connection = self._connector()
        return self

    def __await__(self) -> Generator[Any, None, InlineConnection]:
        return self._connect().__await__()  # no worker thread to start

    def stop(self) -> None:
        self._running = False
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def connect_inline(database: str, **kwargs: Any) -> InlineConnection:
    """`aiosqlite.connect` without the worker thread (SQLAlchemy's `async_creator_fn`)."""
    return InlineConnection(lambda: sqlite3.connect(database, **kwargs))


INLINE_CONNECT_ARGS = {"async_creator_fn": connect_inline}
"""`connect_args` of a `sqlite+aiosqlite` engine whose connections run inline."""
