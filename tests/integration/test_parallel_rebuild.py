"""A parallel rebuild, a sequential rebuild and the incremental read models hold the very
same rows (audit hash chains included), on SQLite and PostgreSQL, real broker."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts import topics
from contracts.envelope import Envelope
from contracts.events import InvokeCancelRequested
from contracts.kafka_binding import encode
from projections.audit import AuditModel, verify_audit
from projections.catalog import read_models
from projections.rebuild import rebuild_together, reset
from projections.runner import ProjectionRunner
from projections.store import ReadModel
from projections.tables import audit_log, invocations
from tests.projection_db import *  # noqa: F403 - fixtures
from tests.projection_db import run_to_end, snapshot
from tests.projection_events import (
    at,
    captoken,
    circuit,
    definition_log,
    envelope,
    invocation,
    published,
)
from toolexec.embedded_broker import ensure_topics

pytestmark = [pytest.mark.integration]

PARTITIONS = 4


def _models(prefix: str) -> list[ReadModel]:
    out: list[ReadModel] = []
    for model in read_models().values():
        renamed = tuple(f"{prefix}.{t}" for t in model.topics)
        out.append(AuditModel(renamed) if isinstance(model, AuditModel)
                   else dataclasses.replace(model, topics=renamed))  # type: ignore[type-var]
    return out


def _log(seed: int) -> list[Envelope]:
    """Publications, MCP tool definitions (pins, drifts, approvals), breakers and 60
    invocations of every outcome, with cancels (some
    after the end) and redelivered events, interleaved."""
    chooser = random.Random(seed)
    events = [published("grep", "1.0.0", tags=["text"]), published("curl", "2.0.0"),
              circuit("api.example", "closed", "open", failures=5, when=at(1)),
              *definition_log("files_mcp"), *definition_log("git_mcp", "log", start=2)]
    for n in range(60):
        one = invocation(f"inv-{seed}-{n}", chooser.choice(["grep", "curl"]),
                         outcome=chooser.choice(["completed", "failed", "denied"]),
                         start=n / 4, token=captoken("ann", f"j{n}") if n % 4 == 0 else None)
        if chooser.random() < 0.3:
            one.append(envelope(InvokeCancelRequested(invocation_id=f"inv-{seed}-{n}"),
                                f"inv-{seed}-{n}", when=at(n / 4 + chooser.choice((0.02, 30))),
                                id=f"cancel-{seed}-{n}"))
        if chooser.random() < 0.2:
            one.append(one[chooser.randrange(len(one))])  # delivered twice
        events += one
    return events


async def _produce(bootstrap: str, prefix: str, events: Sequence[Envelope]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for event in events:
            record = encode(event)
            await producer.send(f"{prefix}.{topics.TOPIC_OF_TYPE[event.type]}", record.value,
                                key=record.key, headers=record.headers)
        await producer.send(f"{prefix}.{topics.INVOCATIONS}", b"not a cloudevent", key=b"x")
        await producer.flush()
    finally:
        await producer.stop()


async def _topics(bootstrap: str, requests_partitions: int) -> str:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    await ensure_topics(bootstrap, {
        f"{prefix}.{t}": {topics.INVOCATIONS: PARTITIONS,
                          topics.REQUESTS: requests_partitions}.get(t, 1)
        for t in topics.ALL_TOPICS})
    return prefix


async def _incremental(engine: AsyncEngine, bootstrap: str, models: list[ReadModel],
                       batch_size: int) -> None:
    await run_to_end(ProjectionRunner(engine, models, bootstrap, batch_size=batch_size))


async def _snapshots(engine: AsyncEngine, models: list[ReadModel]) -> dict[str, object]:
    return {m.name: await snapshot(engine, m) for m in models}


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), batch_size=st.integers(1, 60), workers=st.integers(2, 4))
async def test_parallel_and_sequential_rebuilds_equal_the_incremental_models(
        engine: AsyncEngine, kafka_bootstrap: str, seed: int, batch_size: int,
        workers: int) -> None:
    prefix = await _topics(kafka_bootstrap, PARTITIONS)
    await _produce(kafka_bootstrap, prefix, _log(seed))
    models = _models(prefix)
    for model in models:  # the database is shared by the examples
        await reset(engine, model)
    await _incremental(engine, kafka_bootstrap, models, batch_size=batch_size)
    incremental = await _snapshots(engine, models)
    assert len(incremental["invocations"]["invocations"]) == 60  # type: ignore[index]
    assert len(incremental["definitions"]["tool_definitions"]) == 2  # type: ignore[index]

    sequential = await rebuild_together(engine, models, kafka_bootstrap, workers=1)
    assert await _snapshots(engine, models) == incremental
    parallel = await rebuild_together(engine, models, kafka_bootstrap, workers=workers)
    assert await _snapshots(engine, models) == incremental
    assert {r.workers for r in parallel} == {workers}
    assert [(r.records, r.applied, r.undecodable, r.duplicates) for r in parallel] == [
        (r.records, r.applied, r.undecodable, r.duplicates) for r in sequential]
    audit = next(r for r in parallel if r.name == "audit")
    assert audit.undecodable == 1
    async with engine.connect() as conn:
        assert (await verify_audit(conn)).ok


async def test_a_rebuilt_model_is_continued_by_the_runner(
        engine: AsyncEngine, kafka_bootstrap: str) -> None:
    prefix = await _topics(kafka_bootstrap, PARTITIONS)
    log = _log(3)
    await _produce(kafka_bootstrap, prefix, log[:150])
    models = _models(prefix)
    await rebuild_together(engine, models, kafka_bootstrap, workers=2)
    await _produce(kafka_bootstrap, prefix, log[150:])
    await _incremental(engine, kafka_bootstrap, models, batch_size=25)
    continued = await _snapshots(engine, models)
    await rebuild_together(engine, models, kafka_bootstrap, workers=1)
    assert await _snapshots(engine, models) == continued
    async with engine.connect() as conn:
        assert (await verify_audit(conn)).ok
        indexes = {i.name for t in (audit_log, invocations) for i in t.indexes}
        rows = (await conn.execute(select(invocations.c.invocation_id))).all()
    assert len(rows) == 60 and indexes  # secondary indexes are back after the rebuild


async def test_requests_in_other_partitions_than_their_facts_fall_back_to_one_process(
        engine: AsyncEngine, kafka_bootstrap: str) -> None:
    prefix = await _topics(kafka_bootstrap, 1)  # every request in one partition
    await _produce(kafka_bootstrap, prefix, _log(4))
    models = _models(prefix)
    await _incremental(engine, kafka_bootstrap, models, batch_size=50)
    incremental = await _snapshots(engine, models)
    reports = await rebuild_together(engine, models, kafka_bootstrap, workers=2)
    assert await _snapshots(engine, models) == incremental
    assert reports[0].workers == 1


async def test_a_failing_worker_stops_the_rebuild_and_says_why(kafka_bootstrap: str,
                                                               tmp_path: Path) -> None:
    from projections.rebuild_workers import RebuildShare, WorkerFailed, run_workers

    shares = [RebuildShare(index=i, database_url=f"sqlite:///{tmp_path}/missing/{i}.db",
                           bootstrap=kafka_bootstrap, models=(("no-such-model", ("t",)),),
                           partitions=(("t", i),), ends=((("t", i), 1),))
              for i in range(2)]
    with pytest.raises(WorkerFailed) as failure:
        await asyncio.wait_for(run_workers(shares), 120)
    assert failure.value.kind == "KeyError" and "no-such-model" in str(failure.value)


def test_the_fork_server_started_early_is_the_one_the_workers_come_from() -> None:
    import multiprocessing
    import time
    from multiprocessing import forkserver

    from projections import rebuild_workers

    rebuild_workers.start_fork_server()
    server = forkserver._forkserver  # type: ignore[attr-defined]
    deadline = time.monotonic() + 120
    while server._forkserver_pid is None:  # started in the background
        assert time.monotonic() < deadline, "the fork server never started"
        time.sleep(0.05)
    started = server._forkserver_pid
    process = rebuild_workers._context().Process(target=int)
    process.start()
    process.join(60)
    assert process.exitcode == 0
    assert server._forkserver_pid == started and multiprocessing.active_children() == []
