"""Projection runners against a real broker and real databases (SQLite, PostgreSQL)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Sequence

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import delete, event, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from contracts import topics
from contracts.envelope import Envelope
from contracts.events import InvokeCancelRequested
from contracts.kafka_binding import encode
from projections.approvals import PENDING, approvals_model
from projections.audit import AuditModel, AuditQuery, audit_records, verify_audit
from projections.catalog import read_models
from projections.database import migrate
from projections.invocations import invocations_model
from projections.queries import invocation_status, list_circuits, search_tools, show_tool
from projections.rebuild import rebuild
from projections.runner import OffsetConflict, ProjectionRunner, stored_offsets
from projections.search import migration_managed
from projections.store import AggregateModel, Changes, ReadModel, Record, Rows, apply
from projections.tables import (
    approvals,
    audit_log,
    invocations,
    metadata,
    projection_offsets,
    registry_versions,
)
from tests.projection_db import *  # noqa: F403 - fixtures
from tests.projection_db import run_to_end, snapshot, step_to_end
from tests.projection_events import (
    at,
    captoken,
    circuit,
    envelope,
    invocation,
    lifecycle,
    published,
)
from tests.waiting import WAIT
from toolexec.embedded_broker import ensure_topics

pytestmark = [pytest.mark.integration]

INVOCATIONS = 40


def _models(prefix: str) -> dict[str, ReadModel]:
    """Every read model, reading `prefix`-named copies of the toolexec topics."""
    out: dict[str, ReadModel] = {}
    for name, model in read_models().items():
        if isinstance(model, AuditModel):
            out[name] = AuditModel(tuple(f"{prefix}.{t}" for t in model.topics))
        else:
            out[name] = dataclasses.replace(model, topics=tuple(f"{prefix}.{t}"
                                                                for t in model.topics))
    return out


def _log() -> list[Envelope]:
    events = [published("grep", "1.0.0", tags=["text"], description="Find lines"),
              published("grep", "1.1.0", tags=["text", "search"], description="Find lines"),
              published("curl", "2.0.0", description="Fetch a URL"),
              lifecycle("grep", "deprecated", "1.1.0", when=at(5)),
              circuit("api.example", "closed", "open", failures=5, when=at(1)),
              circuit("api.example", "open", "half_open", when=at(31)),
              circuit("db.example", "closed", "open", failures=3, when=at(2))]
    outcomes = ("completed", "failed", "denied", "completed")
    for n in range(INVOCATIONS):
        events += invocation(f"inv-{n:03}", "grep" if n % 2 else "curl",
                             outcome=outcomes[n % 4], start=n,
                             token=captoken("carol", f"j{n}") if n % 5 == 0 else None)
    return events


@pytest.fixture
async def log_prefix(kafka_bootstrap: str) -> str:
    """Fresh copies of the toolexec topics holding `_log()`, a duplicate and a bad record."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    partitions = {f"{prefix}.{t}": (4 if t == topics.INVOCATIONS else 1)
                  for t in topics.ALL_TOPICS}
    await ensure_topics(kafka_bootstrap, partitions)
    events = _log()
    await _produce(kafka_bootstrap, prefix, [*events, events[10]])  # one redelivery
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(f"{prefix}.{topics.INVOCATIONS}", b"not a cloudevent",
                                     key=b"inv-000")
    finally:
        await producer.stop()
    return prefix


async def _produce(bootstrap: str, prefix: str, events: Sequence[Envelope]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for event in events:
            record = encode(event)
            await producer.send(f"{prefix}.{topics.TOPIC_OF_TYPE[event.type]}", record.value,
                                key=record.key, headers=record.headers)
        await producer.flush()
    finally:
        await producer.stop()


async def test_incremental_runners_equal_a_rebuild_row_by_row(
        engine: AsyncEngine, kafka_bootstrap: str, log_prefix: str) -> None:
    models = _models(log_prefix)
    runners = [ProjectionRunner(engine, m, kafka_bootstrap, batch_size=37)
               for m in models.values()]
    for runner in runners:
        await runner.start()
    try:
        assert all([await r.wait_caught_up(WAIT) for r in runners])
    finally:
        for runner in runners:
            await runner.stop()
    incremental = {name: await snapshot(engine, m) for name, m in models.items()}
    assert len(incremental["invocations"]["invocations"]) == INVOCATIONS
    assert runners[1].stats.duplicates == 1 and runners[1].stats.undecodable == 1
    for name, model in models.items():
        report = await rebuild(engine, model, kafka_bootstrap)
        assert report.records > 0
        assert await snapshot(engine, model) == incremental[name], name


async def test_one_runner_of_every_model_equals_a_rebuild_of_each_even_from_uneven_starts(
        engine: AsyncEngine, kafka_bootstrap: str, log_prefix: str) -> None:
    models = _models(log_prefix)
    ahead = ProjectionRunner(engine, models["audit"], kafka_bootstrap, batch_size=37)
    await ahead.open()
    try:
        for _ in range(3):  # the audit trail starts some batches ahead of the others
            await ahead.step()
    finally:
        await ahead.close()
    await run_to_end(ProjectionRunner(engine, list(models.values()), kafka_bootstrap,
                                       batch_size=37))
    together = {name: await snapshot(engine, m) for name, m in models.items()}
    assert len(together["invocations"]["invocations"]) == INVOCATIONS
    for name, model in models.items():
        await rebuild(engine, model, kafka_bootstrap)
        assert await snapshot(engine, model) == together[name], name


async def test_a_runner_behind_the_log_folds_on_without_its_fold_interval(
        engine: AsyncEngine, kafka_bootstrap: str, log_prefix: str) -> None:
    models = _models(log_prefix)
    runner = ProjectionRunner(engine, list(models.values()), kafka_bootstrap, batch_size=37,
                              fold_interval=3600)
    await run_to_end(runner)  # each step would pause an hour if a runner behind paused
    assert runner.stats.batches > 1
    assert len((await snapshot(engine, models["invocations"]))["invocations"]) == INVOCATIONS


async def test_a_reader_waiting_ends_a_runner_s_pause_between_folds(
        engine: AsyncEngine, kafka_bootstrap: str, log_prefix: str) -> None:
    models = _models(log_prefix)
    runner = ProjectionRunner(engine, list(models.values()), kafka_bootstrap,
                              fold_interval=3600)
    await runner.start()
    try:
        assert await runner.wait_caught_up(WAIT)
        async with asyncio.timeout(WAIT):
            while not runner.pausing:
                await asyncio.sleep(0.05)
        await _produce(kafka_bootstrap, log_prefix, invocation("late-1", "grep", start=90))
        assert await runner.wait_caught_up(WAIT)  # not an hour: the wait ends the pause
    finally:
        await runner.stop()
    async with engine.connect() as conn:
        assert await invocation_status(conn, "late-1") is not None


async def test_offsets_move_only_while_they_hold_what_the_runner_read(
        engine: AsyncEngine) -> None:
    """A batch moves its offsets only if every one still holds what this runner read
    (another runner or a rebuild moved them otherwise): a stale place makes the whole
    batch roll back, the places the runner read right included."""
    models = read_models()
    runner = ProjectionRunner(engine, [models["invocations"], models["audit"]], "127.0.0.1:9")
    a0, a1 = TopicPartition("a", 0), TopicPartition("a", 1)

    async def write(ends: dict[str, dict[TopicPartition, int]]) -> None:
        prints = {name: {tp: f"print-{end}" for tp, end in by_tp.items()}
                  for name, by_tp in ends.items()}
        async with engine.begin() as conn:
            await runner._write_offsets(conn, ends, prints)
        runner._positions.update({(name, tp): end for name, by_tp in ends.items()
                                  for tp, end in by_tp.items()})

    await write({"invocations": {a0: 5, a1: 7}, "audit": {a0: 5}})  # first positions
    for end in (9, 12):  # the same places again: the statement is reused
        await write({"invocations": {a0: end, a1: end + 1}, "audit": {a0: end}})
    await write({"invocations": {a1: 20}})  # fewer places
    assert await stored_offsets(engine, "invocations") == {("a", 0): 12, ("a", 1): 20}
    assert await stored_offsets(engine, "audit") == {("a", 0): 12}

    runner._positions[("audit", a0)] = 11  # what another runner had moved it from
    with pytest.raises(OffsetConflict):
        await write({"invocations": {a0: 30, a1: 31}, "audit": {a0: 30}})
    assert await stored_offsets(engine, "invocations") == {("a", 0): 12, ("a", 1): 20}
    assert await stored_offsets(engine, "audit") == {("a", 0): 12}
    async with engine.connect() as conn:
        prints = set((await conn.execute(select(projection_offsets.c.last_record))).scalars())
    assert prints == {"print-12", "print-20"}


async def test_a_runner_forgets_the_rows_it_remembers_once_another_writer_moved_its_model(
        engine: AsyncEngine, kafka_bootstrap: str, log_prefix: str) -> None:
    """A live model remembers the rows it committed and reads nothing for its next batch;
    a second writer of the model moves one of its places (here one the next batch does
    not move): that batch rolls back, the runner forgets, and the rows the other
    writer left are folded on, not overwritten with what the runner remembered."""
    model = _models(log_prefix)["invocations"]
    assert isinstance(model, AggregateModel) and model.memory is not None
    runner = ProjectionRunner(engine, model, kafka_bootstrap, batch_size=37)
    await runner.open()
    try:
        await step_to_end(runner, WAIT)  # every place has a position now
        target = "inv-001"
        first = envelope(InvokeCancelRequested(invocation_id=target), target, when=at(98))
        await _produce(kafka_bootstrap, log_prefix, [first])
        await step_to_end(runner, WAIT)
        assert target in model.memory.states
        facts = f"{log_prefix}.{topics.INVOCATIONS}"
        moved = max(p for t, p in await stored_offsets(engine, model.name) if t == facts)
        async with engine.begin() as conn:  # the other writer: a row and a place
            await conn.execute(update(invocations)
                               .where(invocations.c.invocation_id == target)
                               .values(callback_url="https://elsewhere.example/"))
            await conn.execute(update(projection_offsets).where(
                projection_offsets.c.consumer == model.name,
                projection_offsets.c.topic == facts,
                projection_offsets.c.partition == moved).values(
                    next_offset=projection_offsets.c.next_offset - 1))
        cancel = envelope(InvokeCancelRequested(invocation_id=target), target, when=at(99))
        await _produce(kafka_bootstrap, log_prefix, [cancel])
        with pytest.raises(OffsetConflict):
            async with asyncio.timeout(WAIT):
                while not await runner.step():  # until the cancel is fetched
                    pass
        assert not model.memory.states
        await step_to_end(runner, WAIT)
    finally:
        await runner.close()
    async with engine.connect() as conn:
        row = (await conn.execute(select(invocations).where(
            invocations.c.invocation_id == target))).mappings().one()
    assert row["callback_url"] == "https://elsewhere.example/" and row["cancel_requested"]


async def test_the_audit_trail_forgets_its_chain_heads_once_another_writer_moved_them(
        engine: AsyncEngine, kafka_bootstrap: str, log_prefix: str) -> None:
    """The live audit model remembers the chain heads it committed and reads none back;
    a second runner of the trail appends a record (moving a head and a place): the
    first runner's next batch rolls back, it forgets the heads, and the records after
    chain on the other runner's head, so the trail still verifies."""
    model = _models(log_prefix)["audit"]
    assert isinstance(model, AuditModel)
    runner = ProjectionRunner(engine, model, kafka_bootstrap, batch_size=37)
    await runner.open()
    try:
        await step_to_end(runner, WAIT)
        target = "inv-002"
        cancel = [envelope(InvokeCancelRequested(invocation_id=target), target, when=at(t))
                  for t in (97, 98, 99)]
        await _produce(kafka_bootstrap, log_prefix, cancel[:1])
        await step_to_end(runner, WAIT)  # every place has a position: heads remembered
        requests = (f"{log_prefix}.{topics.REQUESTS}", 0)
        assert model.remembered_head(*requests) is not None
        await _produce(kafka_bootstrap, log_prefix, cancel[1:2])
        await run_to_end(ProjectionRunner(engine, _models(log_prefix)["audit"],
                                           kafka_bootstrap))  # the other writer
        with pytest.raises(OffsetConflict):
            async with asyncio.timeout(WAIT):
                while not await runner.step():  # until the second cancel is fetched
                    pass
        assert model.remembered_head(*requests) is None
        await step_to_end(runner, WAIT)
        await _produce(kafka_bootstrap, log_prefix, cancel[2:])
        await step_to_end(runner, WAIT)
    finally:
        await runner.close()
    async with engine.connect() as conn:
        verified = await verify_audit(conn)
        types = (await conn.execute(select(func.count()).select_from(audit_log).where(
            audit_log.c.type == "tool.invoke.cancel.requested"))).scalar_one()
    assert verified.ok, verified.broken
    assert types == 3


async def test_a_live_model_writes_changed_rows_and_removes_dropped_ones(
        engine: AsyncEngine) -> None:
    """The live write path: new and changed rows upserted, rows a fold dropped deleted,
    whether the aggregate's rows were read from the store or remembered."""
    wanted: dict[str, list[dict[str, object]]] = {}
    versions = {v: _version_row("grep", v) for v in ("1.0.0", "1.1.0", "2.0.0")}
    model = AggregateModel(name="toy", topics=("toy",), tables=(registry_versions,),
                           key_column="tool_id", aggregate_of=lambda _e: "grep",
                           fold=lambda _rows, e: {registry_versions.name: wanted[e.id]})
    steps = [[versions["1.0.0"], versions["1.1.0"]],
             [versions["1.0.0"], {**versions["1.1.0"], "lifecycle": "deprecated"},
              versions["2.0.0"]],
             [versions["2.0.0"]],
             []]
    for n, rows in enumerate(steps):
        event = published("grep", f"9.9.{n}")
        wanted[event.id] = rows
        remembered = dict(model.memory.states) if model.memory is not None else {}
        async with engine.begin() as conn:
            changes = await model.prepare(conn, [Record("toy", 0, n, event)])
            await changes.write(conn)
        assert changes.committed is not None
        if n % 2:  # every other batch starts from what the store holds
            model.forget()
        else:
            changes.committed()
        async with engine.connect() as conn:
            stored = (await conn.execute(select(registry_versions)
                                         .order_by(registry_versions.c.version))).mappings()
            assert [dict(r) for r in stored] == rows, (n, remembered.keys())


async def test_the_live_approvals_model_reads_no_row_of_an_invocation_no_approver_saw(
        engine: AsyncEngine) -> None:
    """The approvals model keeps the pending approvals (the SQL of `PENDING.keys` and
    `is_open` agree) and never reads the row of an invocation that did not wait for an
    approver; its rows are the whole fold's, whether it remembered or re-read them."""
    model = approvals_model()
    log = [*invocation("inv-a", approval="approve"), *invocation("inv-b"),
           *invocation("inv-c", approval="deny", start=1),
           *invocation("inv-d", approval="approve", start=2)[:-3]]  # still pending
    read: list[object] = []

    def note(_conn: object, _cursor: object, statement: str, params: object,
             *_rest: object) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "approvals" in statement:
            read.append(params)

    event.listen(engine.sync_engine, "before_cursor_execute", note)
    try:
        for n, start in enumerate(range(0, len(log), 3)):
            records = [Record(topics.INVOCATIONS, 0, start + i, e)
                       for i, e in enumerate(log[start:start + 3])]
            async with engine.begin() as conn:
                changes = await model.prepare(conn, records)
                await changes.write(conn)
            if n % 3 == 2:  # now and then the next batch starts from the store
                model.forget()
            elif changes.committed is not None:
                changes.committed()
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", note)
    assert read and not any("inv-b" in str(params) for params in read)
    reference: dict[str, Rows] = {}
    for e in log:
        if (key := model.aggregate_of(e)) is not None:
            reference.setdefault(key, {approvals.name: []})
            model.fold_all(reference, [(key, e)])
    async with engine.connect() as conn:
        stored = {row["invocation_id"]: dict(row) for row in
                  (await conn.execute(select(approvals))).mappings()}
        pending = set((await conn.execute(PENDING.keys)).scalars())
    assert stored == {key: rows[approvals.name][0] for key, rows in reference.items()
                      if rows[approvals.name]}
    assert set(stored) == {"inv-a", "inv-c", "inv-d"}
    assert pending == {key for key, rows in reference.items() if PENDING.is_open(rows)} == {
        "inv-d"}


async def test_an_unknown_invocation_is_folded_as_new_and_again_if_its_row_was_there(
        engine: AsyncEngine) -> None:
    """A batch of an invocation neither remembered nor read folds it as new and inserts
    its row only where there is none; an invocation whose row was there (a fact folded
    before, forgotten since, and repeated) is read and folded again: the rows are the
    whole fold's and the repeats are counted as such."""
    model = invocations_model()
    x, y = invocation("inv-x"), invocation("inv-y", start=1)
    batches = [x[:3], [x[2], *x[3:5], y[0]], [*y[1:], x[4], *x[5:]]]
    duplicates = []
    for n, batch in enumerate(batches):
        records = [Record(topics.INVOCATIONS, 0, 10 * n + i, e) for i, e in enumerate(batch)]
        async with engine.begin() as conn:
            duplicates.append(await apply(model, conn, records))
        model.forget()  # every batch from the store: nothing remembered
    reference: dict[str, Rows] = {}
    for e in [*x, *y]:
        if (key := model.aggregate_of(e)) is not None:
            reference.setdefault(key, model.empty_rows())
            model.fold_all(reference, [(key, e)])
    async with engine.connect() as conn:
        stored = {row["invocation_id"]: dict(row) for row in
                  (await conn.execute(select(invocations))).mappings()}
    assert stored == {key: rows[invocations.name][0] for key, rows in reference.items()}
    assert duplicates == [0, 1, 1]


def _version_row(tool_id: str, version: str) -> dict[str, object]:
    return {"tool_id": tool_id, "version": version, "tool_type": "script",
            "executor": "python_runtime", "executor_pin": None, "integrity": "sha256:00",
            "lifecycle": "active", "lifecycle_reason": None, "replacement_tool_id": None,
            "description": "Find lines", "manifest": {"tool_id": tool_id, "tags": ["a"]},
            "files": [], "published_at": "2026-01-01T12:00:00Z", "published_by": None,
            "source": None, "event_id": f"e-{version}", "publisher_signature": None}


async def test_read_side_queries_answer_from_the_tables(
        engine: AsyncEngine, kafka_bootstrap: str, log_prefix: str) -> None:
    for model in _models(log_prefix).values():
        await run_to_end(ProjectionRunner(engine, model, kafka_bootstrap))
    async with engine.connect() as conn:
        assert [t["tool_id"] for t in await search_tools(conn, "LINES find")] == ["grep"]
        grep = await show_tool(conn, "grep")
        assert grep is not None and grep["current_version"] == "1.0.0"
        assert [(v["version"], v["lifecycle"]) for v in grep["versions"]] == [
            ("1.0.0", "active"), ("1.1.0", "deprecated")]
        status = await invocation_status(conn, "inv-002")
        assert status is not None and (status["status"], status["error_code"]) == (
            "failed", "E3204")
        assert [c["state"] for c in await list_circuits(conn)] == ["half_open", "open"]


class _Crash(Exception):
    pass


@dataclasses.dataclass
class _CrashAfter:
    """Wraps a read model; raises inside the transaction once `limit` records went in."""

    inner: ReadModel
    limit: int
    seen: int = 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    async def prepare(self, conn: AsyncConnection, records: Sequence[Record]) -> Changes:
        changes = await self.inner.prepare(conn, records)

        async def write(target: AsyncConnection) -> None:
            await changes.write(target)
            self.seen += len(records)
            if self.seen >= self.limit:
                raise _Crash(f"killed after {self.seen} records")

        return Changes(write, changes.duplicates)


@pytest.mark.parametrize(("name", "limit", "batch"),
                         [("invocations", 60, 25), ("audit", 60, 25), ("registry", 2, 1)])
async def test_runner_killed_mid_batch_resumes_without_duplicate_or_gap(
        engine: AsyncEngine, kafka_bootstrap: str, log_prefix: str, name: str, limit: int,
        batch: int) -> None:
    model = _models(log_prefix)[name]
    crashing = ProjectionRunner(engine, _CrashAfter(model, limit=limit), kafka_bootstrap,  # type: ignore[arg-type]
                                batch_size=batch)
    await crashing.open()
    with pytest.raises(_Crash):
        async with asyncio.timeout(WAIT):
            while True:
                await crashing.step()
    await crashing.close()
    await run_to_end(ProjectionRunner(engine, model, kafka_bootstrap, batch_size=batch))
    resumed = await snapshot(engine, model)
    await rebuild(engine, model, kafka_bootstrap)
    rebuilt = await snapshot(engine, model)
    for table in resumed:
        assert len(resumed[table]) == len(rebuilt[table]), (table, [r for r in resumed[table] if r not in rebuilt[table]][:3], [r for r in rebuilt[table] if r not in resumed[table]][:3])
    assert resumed == rebuilt
    if name == "audit":
        async with engine.connect() as conn:
            assert (await verify_audit(conn)).ok


async def test_runner_cancelled_inside_a_transaction_resumes_cleanly(
        engine: AsyncEngine, kafka_bootstrap: str, log_prefix: str) -> None:
    model = _models(log_prefix)["audit"]
    entered = asyncio.Event()

    class Hanging(_CrashAfter):
        async def prepare(self, conn: AsyncConnection, records: Sequence[Record]) -> Changes:
            changes = await self.inner.prepare(conn, records)

            async def write(target: AsyncConnection) -> None:
                await changes.write(target)
                self.seen += len(records)
                if self.seen >= self.limit:
                    entered.set()
                    await asyncio.Event().wait()

            return Changes(write, changes.duplicates)

    runner = ProjectionRunner(engine, Hanging(model, limit=30), kafka_bootstrap,  # type: ignore[arg-type]
                              batch_size=20)
    await runner.start()
    await asyncio.wait_for(entered.wait(), WAIT)
    await runner.stop()
    await run_to_end(ProjectionRunner(engine, model, kafka_bootstrap, batch_size=20))
    async with engine.connect() as conn:
        rows = (await conn.execute(select(func.count()).select_from(audit_log))).scalar_one()
        assert (await verify_audit(conn)).ok
    # every decodable record exactly once: the redelivered event is a record of its own
    assert rows == len(_log()) + 1


async def test_audit_verify_names_the_modified_record(
        engine: AsyncEngine, kafka_bootstrap: str, log_prefix: str) -> None:
    await run_to_end(ProjectionRunner(engine, _models(log_prefix)["audit"], kafka_bootstrap))
    topic = f"{log_prefix}.{topics.REGISTRY}"
    async with engine.connect() as conn:
        assert (await verify_audit(conn)).ok
    async with engine.begin() as conn:
        await conn.execute(update(audit_log).where(
            (audit_log.c.topic == topic) & (audit_log.c.offset == 2)
        ).values(document=audit_log.c.document + " "))
    async with engine.connect() as conn:
        assert (await verify_audit(conn)).ok  # whitespace is not content
    async with engine.begin() as conn:
        await conn.execute(update(audit_log).where(
            (audit_log.c.topic == topic) & (audit_log.c.offset == 2)
        ).values(document=func.replace(audit_log.c.document, "Fetch", "Fetched")))
    async with engine.connect() as conn:
        result = await verify_audit(conn)
    assert not result.ok and result.broken is not None
    assert (result.broken.topic, result.broken.offset) == (topic, 2)
    assert "modified" in result.broken.reason


@pytest.mark.parametrize("offset", [1, 3])
async def test_audit_verify_detects_a_deleted_record(
        engine: AsyncEngine, kafka_bootstrap: str, log_prefix: str, offset: int) -> None:
    await run_to_end(ProjectionRunner(engine, _models(log_prefix)["audit"], kafka_bootstrap))
    topic = f"{log_prefix}.{topics.REGISTRY}"  # offsets 0..3: the last one is the head
    async with engine.begin() as conn:
        await conn.execute(delete(audit_log).where(
            (audit_log.c.topic == topic) & (audit_log.c.offset == offset)))
    async with engine.connect() as conn:
        result = await verify_audit(conn)
    assert not result.ok and result.broken is not None and result.broken.topic == topic


async def test_audit_replay_filters_in_log_order(
        engine: AsyncEngine, kafka_bootstrap: str, log_prefix: str) -> None:
    await run_to_end(ProjectionRunner(engine, _models(log_prefix)["audit"], kafka_bootstrap))
    async with engine.connect() as conn:
        one = [r async for r in audit_records(conn, AuditQuery(invocation_id="inv-005"))]
        assert [r["type"] for r in one] == [
            "tool.invoke.requested", "tool.chain.resolved", "tool.permission.decided",
            "tool.execution.started", "tool.execution.finished", "tool.invoke.failed"]
        assert one[0]["event"]["capsubject"] == "carol"
        assert "captoken" not in one[0]["document"]
        done = [r async for r in audit_records(conn, AuditQuery(type="tool.invoke.completed",
                                                                tool_id="curl"))]
        assert len(done) == INVOCATIONS // 4
        window = [r async for r in audit_records(conn, AuditQuery(since=at(10), until=at(12)))]
        assert {r["invocation_id"] for r in window} == {"inv-010", "inv-011", None} - {None}


async def test_migrations_match_the_tables_and_run_twice(engine: AsyncEngine) -> None:
    await migrate(engine)
    async with engine.connect() as conn:
        diff = await conn.run_sync(
            lambda sync: compare_metadata(MigrationContext.configure(sync, opts={
                "include_name": lambda name, *_: not migration_managed(name)}), metadata))
        rows = (await conn.execute(select(func.count()).select_from(invocations))).scalar_one()
    assert diff == [] and rows == 0
