"""The read models' runner on an event loop of its own, in a thread of its own.

In `toolexec up` the pipeline's handlers keep the main event loop busy under load, and
every statement of a read-model batch is an await that waits for a turn of that loop:
batches of a few milliseconds of work took a hundred or more, and the read models fell
seconds behind the log. On a loop of its own the runner waits only for its broker and
its database (both release the GIL while they work). It has its own engine; the
gateway reads through the main loop's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from aiokafka import TopicPartition
from sqlalchemy.ext.asyncio import AsyncEngine

from projections.database import async_url, make_engine
from projections.runner import ProjectionRunner, RunnerStats
from toolexec.read_model_sqlite import INLINE_CONNECT_ARGS

T = TypeVar("T")
STOP_SECONDS = 15.0


class ThreadedRunner:
    """A `ProjectionRunner` running in a thread; awaitable from any loop. `build`
    makes the runner over the engine the thread opens for it."""

    def __init__(self, database_url: str, build: Callable[[AsyncEngine], ProjectionRunner],
                 *, name: str = "read-models") -> None:
        self._url = database_url
        self._build = build
        self.name = name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="read-models",
                                        daemon=True)
        self._runner: ProjectionRunner | None = None

    @property
    def stats(self) -> RunnerStats:
        assert self._runner is not None, "not started"
        return self._runner.stats

    @property
    def failure(self) -> BaseException | None:
        return None if self._runner is None else self._runner.failure

    @property
    def state(self) -> str:
        """"running", or why the runner is not simply following its log."""
        return "not started" if self._runner is None else self._runner.state

    async def start(self) -> None:
        """Start the thread, then open and start the runner on its loop."""
        self._thread.start()
        await self._call(self._start())

    async def _start(self) -> None:
        engine = make_engine(self._url, **_engine_options(self._url))
        runner = self._build(engine)
        try:
            await runner.start()
        except BaseException:
            await engine.dispose()
            raise
        self._runner = runner

    async def end_offsets(self) -> dict[TopicPartition, int]:
        """The log end of every partition the runner reads, now."""
        assert self._runner is not None, "not started"
        return await self._call(self._runner.end_offsets())

    async def wait_caught_up_to(self, ends: Mapping[TopicPartition, int],
                                timeout: float) -> bool:
        """Wait (bounded) until the rows include every record before `ends`."""
        if self._runner is None:
            return False
        return await self._call(self._runner.wait_caught_up_to(ends, timeout))

    async def wait_caught_up(self, timeout: float = 10.0) -> bool:
        """Wait (bounded) until the rows include every record in the log right now."""
        if self._runner is None:
            return False
        return await self._call(self._runner.wait_caught_up(timeout))

    async def stop(self) -> None:
        """Stop the runner (a batch in flight rolls back), its engine, then the thread."""
        if self._thread.is_alive():
            try:
                await asyncio.wait_for(self._call(self._stop()), STOP_SECONDS)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                await asyncio.to_thread(self._thread.join, STOP_SECONDS)
        if not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.close()

    async def _stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.stop()
            await runner.engine.dispose()

    async def _call(self, work: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(work, self._loop)
        return await asyncio.wrap_future(future)


def _engine_options(url: str) -> dict[str, Any]:
    """SQLite's connections run their statements in this thread (`read_model_sqlite`)."""
    if async_url(url).startswith("sqlite"):
        return {"connect_args": INLINE_CONNECT_ARGS}
    return {}
