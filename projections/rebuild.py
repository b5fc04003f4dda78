"""Rebuild: drop a read model's rows and position, replay its topics from offset 0.

The replay stops at the log end seen when it began; records arriving later are left
to the incremental runner. Rebuild while a runner of the same read model is live is
safe (the offsets' optimistic check makes one of them back off) but wasteful: stop
`toolexec up` first for a clean measurement.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncEngine

from projections.runner import ArchivedLog, ProjectionRunner
from projections.store import ReadModel
from projections.tables import projection_applied, projection_offsets

BATCH_SIZE = 2000
"""Records per transaction of a rebuild (larger than the incremental runner's: fewer
statements and commits per record, nobody waits for a rebuild's first rows)."""

Progress = Callable[[int, int], None]
"""Called after each batch with (records done, records in total)."""


@dataclass(frozen=True, slots=True)
class RebuildReport:
    """What one rebuild did."""

    name: str
    records: int
    applied: int
    undecodable: int
    seconds: float

    @property
    def events_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


async def reset(engine: AsyncEngine, model: ReadModel) -> None:
    """Delete every row of `model`, its applied event ids and its stored offsets (one
    transaction)."""
    async with engine.begin() as conn:
        for table in reversed(model.tables):
            await conn.execute(delete(table))
        await conn.execute(delete(projection_applied)
                           .where(projection_applied.c.consumer == model.name))
        await conn.execute(delete(projection_offsets)
                           .where(projection_offsets.c.consumer == model.name))


async def rebuild(engine: AsyncEngine, model: ReadModel, bootstrap: str, *,
                  consumer_options: Mapping[str, Any] | None = None,
                  progress: Progress | None = None, batch_size: int = BATCH_SIZE,
                  archive: ArchivedLog | None = None) -> RebuildReport:
    """Reset `model` and replay its topics up to the current log end."""
    reports = await rebuild_together(engine, [model], bootstrap,
                                     consumer_options=consumer_options, progress=progress,
                                     batch_size=batch_size, archive=archive)
    return reports[0]


async def rebuild_together(engine: AsyncEngine, models: Sequence[ReadModel], bootstrap: str, *,
                           consumer_options: Mapping[str, Any] | None = None,
                           progress: Progress | None = None, batch_size: int = BATCH_SIZE,
                           archive: ArchivedLog | None = None) -> list[RebuildReport]:
    """Reset `models` and replay their topics up to the current log end in one pass:
    each record is fetched and decoded once, whichever models read it. The reports
    share the pass's seconds. `archive` holds the records the broker no longer has
    (the embedded log's retention)."""
    for model in models:
        await reset(engine, model)
    runner = ProjectionRunner(engine, models, bootstrap, consumer_options=consumer_options,
                              batch_size=batch_size, poll_ms=50, archive=archive)
    await runner.open()
    try:
        ends = await runner.end_offsets()
        total = runner.remaining(ends)
        started = time.perf_counter()
        if progress is not None:
            progress(0, total)
        while not runner.reached(ends):
            await runner.step()
            if progress is not None:
                progress(total - runner.remaining(ends), total)
        seconds = time.perf_counter() - started
    finally:
        await runner.close()
    stats = runner.model_stats
    return [RebuildReport(m.name, stats[m.name].records, stats[m.name].applied,
                          stats[m.name].undecodable, seconds) for m in models]
