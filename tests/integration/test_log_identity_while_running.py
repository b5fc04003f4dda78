"""A running read model keeps checking that it follows the log its rows came from.

The periodic check runs beside the folding; these tests make the log and the stored
positions disagree while a runner runs (the fingerprint of the last applied record no
longer matches what the log holds there) and expect the runner to notice and act on
its own: rebuild from the log, or refuse. With the check switched off they fail."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts import topics
from projections.log_identity import ProjectionDiverged
from projections.runner import ProjectionRunner
from projections.tables import projection_offsets
from tests.integration.test_projections_runner import INVOCATIONS, _models, log_prefix  # noqa: F401
from tests.projection_db import *  # noqa: F403 - fixtures
from tests.projection_db import snapshot
from tests.waiting import WAIT

pytestmark = [pytest.mark.integration]

CHECK_SECONDS = 0.2


async def _until(predicate: Callable[[], bool], what: str) -> None:
    """Wait for `predicate()` (the bound only stops a hang; never a timing asserted)."""
    async with asyncio.timeout(WAIT):
        while not predicate():
            await asyncio.sleep(0.05)
    assert predicate(), what


async def _forge_last_applied(engine: AsyncEngine, consumer: str, topic: str) -> None:
    """Make `consumer`'s stored fingerprint of its last record in `topic` another
    record's, as if its rows had come from another log."""
    table = projection_offsets
    async with engine.begin() as conn:
        rows = (await conn.execute(select(table.c.partition).where(
            table.c.consumer == consumer, table.c.topic == topic,
            table.c.next_offset > 0))).scalars().all()
        assert rows, "nothing applied to forge"
        await conn.execute(update(table).where(
            table.c.consumer == consumer, table.c.topic == topic,
            table.c.partition == rows[0]).values(last_record="0" * 32))


async def test_a_running_read_model_whose_log_changed_under_it_rebuilds_from_it(
        engine: AsyncEngine, kafka_bootstrap: str, log_prefix: str) -> None:  # noqa: F811
    model = _models(log_prefix)["invocations"]
    runner = ProjectionRunner(engine, model, kafka_bootstrap, batch_size=37,
                              verify_seconds=CHECK_SECONDS)
    await runner.start()
    try:
        assert await runner.wait_caught_up(WAIT)
        before = await snapshot(engine, model)
        assert runner.rebuilds == 0 and runner.state == "running"
        await _forge_last_applied(engine, model.name, f"{log_prefix}.{topics.INVOCATIONS}")
        await _until(lambda: runner.rebuilds >= 1, "the runner noticed and rebuilt")
        await _until(lambda: runner.rebuilding is None, "the rebuild finished")
        assert await runner.wait_caught_up(WAIT)
        after = await snapshot(engine, model)
    finally:
        await runner.stop()
    assert len(after["invocations"]) == INVOCATIONS
    assert after == before  # the same log folded again: the same rows


async def test_a_running_read_model_refuses_a_log_that_is_not_its_own(
        engine: AsyncEngine, kafka_bootstrap: str, log_prefix: str) -> None:  # noqa: F811
    models = _models(log_prefix)
    runner = ProjectionRunner(engine, [models["invocations"], models["audit"]], kafka_bootstrap,
                              verify_seconds=CHECK_SECONDS, on_divergence="refuse")
    await runner.start()
    try:
        assert await runner.wait_caught_up(WAIT)
        rows = await snapshot(engine, models["audit"])
        await _forge_last_applied(engine, "audit", f"{log_prefix}.{topics.INVOCATIONS}")
        await _until(lambda: isinstance(runner.failure, ProjectionDiverged), "refused")
        assert runner.state.startswith("diverged:") and "audit" in runner.state
        assert "another log" in runner.state
        assert await snapshot(engine, models["audit"]) == rows  # refused, not wiped
    finally:
        await runner.stop()
