"""Read-your-writes outside `up` against a real broker and a real read model: where the
log ends (`toolexec.log_ends`), and `caught_up` waiting for a projection runner that
folds, giving up when none does, not waiting for a read model of another log."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts import topics
from contracts.kafka_binding import encode
from projections.catalog import read_models
from projections.database import make_engine, migrate
from projections.log_identity import record_cluster
from projections.queries import invocation_status
from projections.runner import ProjectionRunner
from projections.store import ReadModel
from tests.projection_events import invocation
from tests.waiting import WAIT
from toolexec.embedded_broker import ensure_topics
from toolexec.log_ends import log_ends
from toolexec.usecases.read_your_writes import caught_up

pytestmark = [pytest.mark.integration]


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    created = make_engine(f"sqlite:///{tmp_path / 'read-models.db'}")
    await migrate(created)
    yield created
    await created.dispose()


@pytest.fixture
async def model(kafka_bootstrap: str) -> ReadModel:
    """The invocations read model over fresh copies of its topics (2 partitions each)."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    model = read_models()["invocations"]
    assert isinstance(model.topics, tuple) and set(model.topics) == {topics.REQUESTS,
                                                                    topics.INVOCATIONS}
    mine = tuple(f"{prefix}.{t}" for t in model.topics)
    await ensure_topics(kafka_bootstrap, dict.fromkeys(mine, 2))
    return dataclasses.replace(model, topics=mine)


async def _write_invocation(bootstrap: str, model: ReadModel, invocation_id: str) -> None:
    """One invocation's events, request to terminal, to `model`'s copies of the topics;
    its facts sent together (one batch: Tansu's listed end is short of them)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=50)
    await producer.start()
    try:
        sent = []
        for event in invocation(invocation_id, reports=2):
            record = encode(event)
            topic = topics.TOPIC_OF_TYPE[event.type]
            copy = next(t for t in model.topics if t.endswith("." + topic))
            sent.append(await producer.send(copy, record.value, key=record.key,
                                            headers=record.headers))
        await producer.flush()
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def _row(engine: AsyncEngine, invocation_id: str) -> object:
    async with engine.connect() as conn:
        return await invocation_status(conn, invocation_id)


async def test_log_ends_are_after_the_last_record_of_a_batch(kafka_bootstrap: str,
                                                           model: ReadModel) -> None:
    await _write_invocation(kafka_bootstrap, model, "inv-ends")
    ends = await asyncio.wait_for(log_ends(kafka_bootstrap, model.topics), WAIT)
    requests, facts = model.topics
    written = {t: sum(end for (topic, _), end in ends.ends.items() if topic == t)
               for t in model.topics}
    facts_of_one = len(invocation("inv-ends", reports=2)) - 1
    assert written == {requests: 1, facts: facts_of_one}  # every record, the batch's last too
    assert sorted(ends.ends) == sorted((t, p) for t in model.topics for p in (0, 1))
    assert ends.cluster


async def test_the_reader_waits_for_the_runner_to_fold_what_was_written(
        kafka_bootstrap: str, model: ReadModel, engine: AsyncEngine) -> None:
    await _write_invocation(kafka_bootstrap, model, "inv-folded")
    runner = ProjectionRunner(engine, model, kafka_bootstrap)
    await runner.start()
    try:
        # the bound only stops a hang: whenever the runner folds, the wait ends then
        assert await caught_up(engine, model, kafka_bootstrap, WAIT)
        row = await _row(engine, "inv-folded")  # read right after: there, and whole
        assert row is not None and row["status"] == "completed"
    finally:
        await runner.stop()


async def test_with_nobody_folding_the_bound_passes_and_nothing_is_read(
        kafka_bootstrap: str, model: ReadModel, engine: AsyncEngine) -> None:
    await _write_invocation(kafka_bootstrap, model, "inv-unfolded")
    assert not await caught_up(engine, model, kafka_bootstrap, 0.5)  # `up` stopped
    assert await _row(engine, "inv-unfolded") is None


async def test_a_read_model_of_another_log_is_not_waited_for(
        kafka_bootstrap: str, model: ReadModel, engine: AsyncEngine) -> None:
    await _write_invocation(kafka_bootstrap, model, "inv-elsewhere")
    await record_cluster(engine, [model.name], "a-cluster-that-is-not-this-one")
    # a bound far past the test's: waiting for it would fail the test, not slow it
    assert not await asyncio.wait_for(caught_up(engine, model, kafka_bootstrap, 100 * WAIT),
                                      WAIT)


async def test_no_broker_to_ask_is_no_wait(model: ReadModel, engine: AsyncEngine) -> None:
    assert not await asyncio.wait_for(caught_up(engine, model, None, 100 * WAIT), WAIT)
