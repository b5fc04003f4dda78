"""The projection runner: feeds one read model from its topics, exactly once per event.

No consumer group: the runner assigns itself every partition of its topics and seeks
to the offsets stored in the database. Each batch (up to `batch_size` records) is one
transaction holding the rows, the applied event ids and the next offsets, so a crash
anywhere leaves either all of a batch or none of it. Offsets are written first and
only if they still hold the values this runner read (optimistic concurrency): a
second runner or a rebuild working on the same read model makes one of them back off
and re-read its position instead of applying a batch twice.

A runner can feed several read models (a rebuild of all of them does): each record is
then fetched and decoded once; every model keeps its own offsets in the same
transaction, and a model already past a record skips it. A record is identified by
its log position: the stored offsets are the de-duplication. Models that cannot tell
a repeated event (same id, another position) from a new one by their own rows
(`ReadModel.deduplicates` false: registry, circuits) also get their applied event ids
kept; the invocations and audit models need no such row per event.

Every model computes its changes before the first write (`ReadModel.prepare`), so the
transaction holds the database's write lock only while rows are written.

A read model never silently follows another log than the one its rows come from
(`projections.log_identity`): at open, whenever its position is out of the log's
range, and every `verify_seconds` while it runs, the runner checks that the log
still holds the record it applied last at that offset (and is the same cluster's).
The periodic check runs beside the folding (a check takes a few broker round trips,
which would otherwise show in every read model's lag); only a check that finds a
mismatch stops the folding, to check again and act. When the log does not hold
what a model applied, the runner rebuilds the model from the log (`on_divergence=
"rebuild"`) or refuses to go on (`"refuse"`, and always for another cluster's log),
loudly either way: `failure` / `rebuilding` say why.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError, OffsetOutOfRangeError
from sqlalchemy import (
    BigInteger,
    Integer,
    String,
    and_,
    bindparam,
    case,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from contracts.fact_signature import FactVerifier
from contracts.kafka_binding import UndecodableRecord, decode
from contracts.kafka_clients import close_quietly
from projections.log_identity import (
    IdentityCheck,
    LogIdentity,
    ProjectionDiverged,
    record_cluster,
    record_fingerprint,
    stored_clusters,
)
from projections.store import Changes, ReadModel, Record, chunks
from projections.tables import projection_applied, projection_offsets

log = structlog.get_logger(__name__)

BATCH_SIZE = 500
RETRY_SECONDS = (0.1, 0.5, 1.0, 2.0, 5.0)
VERIFY_SECONDS = 5.0
OnDivergence = Literal["rebuild", "refuse"]
FETCH_OPTIONS = frozenset({"fetch_max_wait_ms", "fetch_max_bytes", "max_partition_fetch_bytes"})
"""Consumer options a runner takes from its caller (a rebuild fetches larger batches)."""
LAG_SAMPLES = 100_000
"""Most recent per-record lags a runner keeps (seconds from a record's log timestamp to
the commit of the batch that applied it)."""


class ArchivedLog(Protocol):
    """An archive of the log holding records its broker no longer has (retention)."""

    def retained_from(self, topic: str, partition: int) -> int:
        """First offset the broker holds; earlier records are only in the archive."""
        ...

    def read(self, topic: str, partition: int, start: int, end: int,
             limit: int) -> Sequence[Any]:
        """Up to `limit` archived records (offset, key, value, headers) in [start, end)."""
        ...

    def record_at(self, topic: str, partition: int, offset: int) -> Any | None:
        """The archived record at `offset`, if any."""
        ...


class WriteTurn:
    """Turns at writing among processes that share one SQLite file (the workers of a
    rebuild): a worker takes it just before its first write of a batch and gives it
    back once the batch is committed or rolled back. SQLite would serialise the
    writers anyway, but a writer that finds the file locked sleeps in growing steps
    (up to 100 ms) before it looks again; a lock wakes the next one at once."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock  # a multiprocessing lock, shared by the workers
        self._held = False

    async def acquire(self) -> None:
        if not self._lock.acquire(block=False):
            await asyncio.to_thread(self._lock.acquire)
        self._held = True

    def release(self) -> None:
        """Give the turn back if this process holds it (idempotent)."""
        if self._held:
            self._held = False
            self._lock.release()


class OffsetConflict(Exception):
    """The stored offsets moved under this runner (another runner, or a rebuild)."""


@dataclass
class RunnerStats:
    """Counters since the runner opened."""

    records: int = 0
    applied: int = 0
    duplicates: int = 0
    undecodable: int = 0
    untrusted: int = 0
    """Records of a signed topic whose signature did not verify (kept out of state)."""
    batches: int = 0
    lags: deque[float] = field(default_factory=lambda: deque(maxlen=LAG_SAMPLES))
    """Seconds from each record's log timestamp to its batch's commit (recent ones)."""


class Pacer(Protocol):
    """Sets the runner's fetch wait: short while records flow, long when idle (a
    `consumers.runtime.fetch_pacing.FetchPacer`, wired by the composition root)."""

    def attach(self, consumer: Any) -> None: ...

    def busy(self) -> None: ...

    def update(self) -> None: ...


class ProjectionRunner:
    """Consumes the topics of one read model (or several: each record is then fetched
    and decoded once for all of them) into `engine`; `start()` runs it in the
    background. Every model keeps its own offsets and applied ids, written in the
    batch's one transaction. With `partitions`, only those (topic, partition) pairs
    of the models' topics are read (a worker of a parallel rebuild). Without
    `check_log`, the log's identity is not checked: a rebuild that has just reset the
    models (and recorded the log it folds) runs so. With `verifier`, every record of
    `signed_topics` (the pipeline's facts) carries its signature verdict to the models:
    one that does not verify becomes no state (counted in `stats.untrusted`, logged
    with E3804) but is kept in the audit trail, marked. With `fold_interval`, a runner
    that has folded all it knows of folds again at most that often unless a reader
    waits to catch up (records of several bursts share one batch)."""

    def __init__(self, engine: AsyncEngine, model: ReadModel | Sequence[ReadModel],
                 bootstrap: str, *, consumer_options: Mapping[str, Any] | None = None,
                 batch_size: int = BATCH_SIZE, poll_ms: int = 100,
                 pacer: Pacer | None = None,
                 on_divergence: OnDivergence = "rebuild",
                 verify_seconds: float = VERIFY_SECONDS,
                 client_options: Mapping[str, Any] | None = None,
                 archive: ArchivedLog | None = None,
                 partitions: Collection[tuple[str, int]] | None = None,
                 check_log: bool = True,
                 verifier: FactVerifier | None = None,
                 signed_topics: Collection[str] = (),
                 write_turn: WriteTurn | None = None,
                 fold_interval: float = 0.0) -> None:
        self.engine = engine
        self.models: tuple[ReadModel, ...] = (
            tuple(model) if isinstance(model, Sequence) else (model,))
        self.model = self.models[0]
        self.stats = RunnerStats()
        self.model_stats = {m.name: RunnerStats() for m in self.models}
        self._bootstrap = bootstrap
        self._options = {"fetch_max_wait_ms": 100, **{
            k: v for k, v in (consumer_options or {}).items() if k in FETCH_OPTIONS}}
        self._batch_size = batch_size
        self._poll_ms = poll_ms
        self._pacer = pacer
        self._only = None if partitions is None else frozenset(partitions)
        self._consumer: AIOKafkaConsumer | None = None
        self._partitions: list[TopicPartition] = []
        self._positions: dict[tuple[str, TopicPartition], int | None] = {}
        self._passed: dict[TopicPartition, int] = {}
        self._offset_updates: dict[int, Any] = {}
        self._moved = asyncio.Condition()
        self._reader_waits = asyncio.Event()
        self._fold_interval = fold_interval
        self._waiters = 0
        self._last_fold = float("-inf")
        self.pausing = False
        """True while the runner, caught up, waits out its fold interval."""
        self._task: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None
        self.rebuilding: str | None = None
        """Why the runner is rebuilding its models from the log (None when it is not)."""
        self.rebuilds = 0
        self._on_divergence = on_divergence
        self._verify_seconds = verify_seconds
        self._client_options = dict(client_options or {})
        self._archive = archive
        self._identity = LogIdentity(bootstrap, self._client_options, archive=archive)
        self._check_log = check_log
        self._verifier = verifier
        self._signed_topics = frozenset(signed_topics) if verifier is not None else frozenset()
        self._verified_at = 0.0
        self._checking: asyncio.Task[IdentityCheck] | None = None
        """The periodic log identity check running beside the folding, if any."""
        self._write_turn = write_turn

    @property
    def name(self) -> str:
        return "+".join(m.name for m in self.models)

    # -- lifecycle --------------------------------------------------------------------
    async def open(self) -> None:
        """Connect, assign every partition of the models' topics, seek to stored offsets."""
        # No automatic reset: a position out of the log's range is a question for the
        # log identity check, not a reason to start over silently.
        consumer = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, group_id=None,
                                    enable_auto_commit=False, auto_offset_reset="none",
                                    **self._options, **self._client_options)
        await consumer.start()
        self._consumer = consumer
        if self._pacer is not None:
            self._pacer.attach(consumer)
        known = await consumer.topics()
        wanted = {topic for m in self.models for topic in m.topics}
        self._partitions = sorted(
            (TopicPartition(topic, p) for topic in wanted if topic in known
             for p in consumer.partitions_for_topic(topic) or ()
             if self._only is None or (topic, p) in self._only),
            key=lambda tp: (tp.topic, tp.partition))
        consumer.assign(self._partitions)
        await self._seek_to_stored()
        if self._check_log:
            await self.verify_log()

    async def close(self) -> None:
        await self._stop_checking()
        if self._consumer is not None:
            await close_quietly(self._consumer.stop())
            self._consumer = None
        await self._identity.close()

    async def start(self) -> None:
        """Open and run in the background until `stop()`. A read model refused (another
        log) does not follow its log until a check passes again (after `toolexec
        projections rebuild`, say): `failure` says why meanwhile."""
        try:
            await self.open()
        except ProjectionDiverged as refused:
            self.failure = refused
        self._task = asyncio.create_task(self._run(), name=f"projection-{self.name}")

    @property
    def state(self) -> str:
        """"running", or why the runner is not simply following its log."""
        if self.failure is not None:
            if isinstance(self.failure, ProjectionDiverged):
                return f"diverged: {self.failure}"
            return f"failed: {type(self.failure).__name__}"
        if self.rebuilding is not None:
            return f"rebuilding: {self.rebuilding}"
        return "running"

    # -- log identity -----------------------------------------------------------------
    async def verify_log(self) -> None:
        """Check that the log still holds what the models applied; rebuild the models
        that diverged, or raise `ProjectionDiverged` (see the module docstring)."""
        await self._stop_checking()  # one check at a time: they share a connection
        self._verified_at = time.monotonic()
        checked = await self._identity.check(self.engine, self.models, self._partitions)
        divergences = checked.divergences
        if not divergences:
            if checked.stale:
                await record_cluster(self.engine, checked.stale, checked.cluster)
            return
        refuse = self._on_divergence == "refuse" or any(d.foreign for d in divergences)
        for divergence in divergences:
            log.error("projection.diverged", projection=divergence.model,
                      reason=divergence.reason, foreign=divergence.foreign,
                      action="refuse" if refuse else "rebuild")
        reason = "; ".join(f"{d.model}: {d.reason}" for d in divergences)
        if refuse:
            raise ProjectionDiverged(reason)
        from projections.rebuild import reset  # rebuild builds on the runner

        names = {d.model for d in divergences}
        for model in self.models:
            if model.name in names:
                await reset(self.engine, model)
        self.rebuilding = reason
        self.rebuilds += 1
        await self._remember_cluster()
        await self._seek_to_stored()

    async def _remember_cluster(self) -> None:
        cluster = await self._identity.cluster_id()
        stored = await stored_clusters(self.engine, [m.name for m in self.models])
        stale = [m.name for m in self.models if stored.get(m.name) != cluster]
        if stale:
            await record_cluster(self.engine, stale, cluster)

    def _check_beside(self) -> None:
        """Start the periodic check beside the folding, when one is due."""
        if self._checking is None and \
                time.monotonic() - self._verified_at >= self._verify_seconds:
            self._verified_at = time.monotonic()
            self._checking = asyncio.create_task(
                self._identity.check(self.engine, self.models, self._partitions),
                name=f"projection-{self.name}-log-check")

    async def _act_on_check(self) -> None:
        """Once the check beside the folding is done: nothing to do when the log is the
        one the models follow; otherwise stop folding, check again and act
        (`verify_log`). A check that could not reach the broker or the database is
        simply made again at the next period."""
        task = self._checking
        if task is None or not task.done():
            return
        self._checking = None
        try:
            checked = task.result()
        except (KafkaError, DBAPIError, OSError) as error:
            log.info("projection.check_deferred", projection=self.name,
                     error=str(error)[:300] or type(error).__name__)
            return
        if checked.divergences:
            await self.verify_log()
        elif checked.stale:
            await record_cluster(self.engine, checked.stale, checked.cluster)

    async def _stop_checking(self) -> None:
        task, self._checking = self._checking, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def stop(self) -> None:
        """Stop the loop (a batch in flight is rolled back) and disconnect."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.close()

    async def _wait_until_followable(self) -> None:
        """While refused: check again every `verify_seconds` until the log is one the
        models may follow (a rebuild elsewhere reset them, or the broker came back)."""
        while isinstance(self.failure, ProjectionDiverged):
            await asyncio.sleep(self._verify_seconds)
            try:
                await self.verify_log()
            except ProjectionDiverged as still:
                self.failure = still
                continue
            except KafkaError:
                continue
            self.failure = None
            log.warning("projection.following", projection=self.name)
            await self._seek_to_stored()

    async def _run(self) -> None:
        failures = 0
        out_of_range = False
        while True:
            await self._wait_until_followable()
            try:
                if self._check_log and out_of_range:
                    await self.verify_log()
                    await self._seek_to_stored()
                    out_of_range = False
                elif self._check_log:
                    await self._act_on_check()
                    self._check_beside()
                if not await self.step() and self.rebuilding is not None:
                    log.warning("projection.rebuilt", projection=self.name,
                                reason=self.rebuilding, records=self.stats.records)
                    self.rebuilding = None
                if failures:
                    log.info("projection.resumed", projection=self.name, after=failures)
                failures = 0
            except OffsetOutOfRangeError as error:
                log.warning("projection.out_of_range", projection=self.name, error=str(error))
                out_of_range = True
                await asyncio.sleep(RETRY_SECONDS[0])
            except ProjectionDiverged as refused:
                self.failure = refused
            except (OffsetConflict, DBAPIError, KafkaError) as error:
                # Transient or concurrent: back off, re-read the stored position, go on.
                # Logged once per streak: a broker away for a minute is one line, not 60.
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                if not failures:
                    log.warning("projection.retry", projection=self.name,
                                error=str(error)[:300] or type(error).__name__)
                failures += 1
                await self._back_off(delay)
                await self._seek_to_stored()
            except Exception as error:
                self.failure = error
                log.exception("projection.failed", projection=self.name)
                raise

    async def _back_off(self, delay: float) -> None:
        """Wait `delay` before trying again, or less once a reader waits to catch up: the
        broker may be back by then, and a reader must not wait out a backoff meant to
        spare a broker that is away (read-your-writes right after a broker restart)."""
        self._reader_waits.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._reader_waits.wait()

    # -- one batch --------------------------------------------------------------------
    async def step(self) -> int:
        """Fetch one batch and apply it in one transaction; returns records consumed."""
        assert self._consumer is not None, "runner not open"
        batch = await self._backfill()
        backfilled = bool(batch)
        if not backfilled:
            await self._pause_between_folds()
            fetched = await self._consumer.getmany(timeout_ms=self._poll_ms,
                                                   max_records=self._batch_size)
            if self._pacer is not None:
                if any(fetched.values()):
                    self._pacer.busy()
                else:
                    self._pacer.update()
            batch = [(tp, fetched[tp])
                     for tp in sorted(fetched, key=lambda t: (t.topic, t.partition))
                     if fetched[tp]]
            await self._note_gaps_passed({tp for tp, _ in batch})
        if not batch:
            return 0
        turn = self._write_turn
        try:
            async with self.engine.begin() as conn:
                moved, counted, kept = await self._apply(conn, batch, turn)
        except BaseException:
            if turn is not None:
                turn.release()
            await self._seek_to_stored()
            raise
        if turn is not None:
            turn.release()
        self._last_fold = time.monotonic()
        committed = time.time()
        async with self._moved:
            self._positions.update(moved)
            self._moved.notify_all()
        self._remember(kept)
        if backfilled:  # the broker's copy of these partitions begins later
            for tp, _ in batch:
                self._consumer.seek(tp, self._position(tp) or 0)
        for name, delta in counted.items():  # counted only once committed
            _add(self.model_stats[name], delta)
            self.stats.applied += delta.applied
            self.stats.duplicates += delta.duplicates
        count = sum(len(records) for _, records in batch)
        self.stats.records += count
        self.stats.batches += 1
        self.stats.lags.extend(committed - r.timestamp / 1000 for _, records in batch
                               for r in records if r.timestamp is not None and r.timestamp > 0)
        return count

    async def _pause_between_folds(self) -> None:
        """With a fold interval, a runner that has folded all the log it knows of waits
        until the interval has passed since its last fold, or until a reader waits to
        catch up. A batch has a fixed cost (one transaction over every model, with their
        offsets) that a burst of a few facts would pay alone; records arriving meanwhile
        are folded together in the next batch. A runner behind the log never pauses."""
        if self._waiters or self._behind():
            return
        pause = self._last_fold + self._fold_interval - time.monotonic()
        if pause <= 0:
            return
        self._reader_waits.clear()
        self.pausing = True
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._reader_waits.wait()
        finally:
            self.pausing = False

    def _behind(self) -> bool:
        """True when a fetch answered since has shown records past what is folded."""
        for tp in self._partitions:
            highwater = self._highwater(tp)
            if highwater is None or highwater > self._read_up_to(tp):  # None: not yet fetched
                return True
        return False

    async def _note_gaps_passed(self, with_records: set[TopicPartition]) -> None:
        """A partition whose consumer moved over offsets that hold no record (a gap left
        by a broker that died, or by retention) is that far read, though no row moved."""
        assert self._consumer is not None
        moved = False
        for tp in self._partitions:
            if tp in with_records or self._highwater(tp) is None:
                continue
            position = await self._consumer.position(tp)
            if position > self._read_up_to(tp):
                self._passed[tp] = position
                moved = True
        if moved:
            async with self._moved:
                self._moved.notify_all()

    async def _backfill(self) -> list[tuple[TopicPartition, list[Any]]]:
        """Records before the broker's retained part, from the archive (if any)."""
        if self._archive is None:
            return []
        batch = []
        for tp in self._partitions:
            position = self._position(tp) or 0
            retained = self._archive.retained_from(tp.topic, tp.partition)
            if position < retained:
                records = await asyncio.to_thread(self._archive.read, tp.topic, tp.partition,
                                                  position, retained, self._batch_size)
                if records:
                    batch.append((tp, list(records)))
        return batch

    def _remember(self, kept: Sequence[tuple[ReadModel, Callable[[], None]]]) -> None:
        """Once a batch is committed, let each model remember the rows it wrote, if
        every partition of its topics has a stored position: from then on each batch
        checks all of them (`_write_offsets`), so no other writer can change the
        model's rows without this runner's next batch rolling back and `_seek_to_stored`
        making the models forget. A model whose rows each belong to one place
        (`place_rows`: the audit trail's chain heads) needs only the places it wrote to
        have one, which they do once committed: a place that never had a record (an
        empty dead-letter partition) does not keep it from remembering."""
        for model, remember in kept:
            if getattr(model, "place_rows", False) or all(
                    self._positions.get((model.name, tp)) is not None
                    for tp in self._partitions if tp.topic in model.topics):
                remember()

    def _forget(self) -> None:
        for model in self.models:
            forget = getattr(model, "forget", None)
            if forget is not None:
                forget()

    async def _apply(self, conn: AsyncConnection,
                     batch: Sequence[tuple[TopicPartition, list[ConsumerRecord]]],
                     turn: WriteTurn | None = None
                     ) -> tuple[dict[tuple[str, TopicPartition], int], dict[str, RunnerStats],
                                list[tuple[ReadModel, Callable[[], None]]]]:
        """Apply `batch` to every model; returns the models' new positions, what each
        applied and what each keeps once the batch is committed. Every model prepares
        its changes first; then (after taking `turn`, which the caller releases)
        offsets, applied ids and rows are written."""
        decoded = {tp: self._decoded(tp, records) for tp, records in batch}
        moved: dict[tuple[str, TopicPartition], int] = {}
        counted: dict[str, RunnerStats] = {}
        planned: list[tuple[ReadModel, dict[TopicPartition, int], dict[TopicPartition, str],
                            list[Record], Changes]] = []
        for model in self.models:
            ends: dict[TopicPartition, int] = {}
            prints: dict[TopicPartition, str] = {}
            mine: list[Record] = []
            delta = counted[model.name] = RunnerStats()
            for tp, records in batch:
                position = self._positions.get((model.name, tp)) or 0
                if tp.topic not in model.topics or records[-1].offset < position:
                    continue  # not this model's, or it has these already
                ends[tp] = records[-1].offset + 1
                prints[tp] = record_fingerprint(records[-1].key, records[-1].value)
                if records[0].offset >= position:  # the usual case: all of them are new
                    new, taken = decoded[tp], len(records)
                else:
                    new = [r for r in decoded[tp] if r.offset >= position]
                    taken = sum(1 for r in records if r.offset >= position)
                mine.extend(new)
                delta.records += taken
                delta.undecodable += taken - len(new)
            if not ends:
                continue
            fresh = mine if model.deduplicates else await self._unseen(conn, model.name, mine)
            changes = await model.prepare(conn, fresh) if fresh else Changes()
            planned.append((model, ends, prints, fresh, changes))
            delta.duplicates += len(mine) - len(fresh) + changes.duplicates
            delta.applied += len(fresh) - changes.duplicates
            delta.batches += 1
            moved.update({(model.name, tp): end for tp, end in ends.items()})
        if turn is not None:
            await turn.acquire()
        await self._write_offsets(conn, {model.name: ends for model, ends, _, _, _ in planned},
                                  {model.name: prints for model, _, prints, _, _ in planned})
        for model, _ends, _prints, fresh, changes in planned:
            if fresh and not model.deduplicates:
                await conn.execute(insert(projection_applied), [
                    {"consumer": model.name, "event_id": r.envelope.id} for r in fresh])
            more = await changes.write(conn)
            if more:  # repeats the model found only while writing
                counted[model.name].duplicates += more
                counted[model.name].applied -= more
        kept = [(model, changes.committed) for model, _, _, _, changes in planned
                if changes.committed is not None]
        return moved, counted, kept

    def _decoded(self, tp: TopicPartition, records: list[ConsumerRecord]) -> list[Record]:
        out = []
        topic, partition = tp.topic, tp.partition
        verdicts = self._verifier.verify_all(records) if topic in self._signed_topics \
            and self._verifier is not None else None
        for index, record in enumerate(records):
            try:
                envelope = decode(record.key, record.value, record.headers)
            except UndecodableRecord as bad:
                self.stats.undecodable += 1
                log.warning("projection.undecodable", projection=self.name, topic=tp.topic,
                            partition=tp.partition, offset=record.offset, code=bad.error.code,
                            reason=bad.error.message)
                continue
            verdict = None
            if verdicts is not None:
                verdict = verdicts[index].value
                if verdict != "valid":
                    self.stats.untrusted += 1
                    log.warning("projection.untrusted_fact", projection=self.name,
                                topic=tp.topic, partition=tp.partition, offset=record.offset,
                                type=envelope.type, verdict=verdict, code="E3804")
            out.append(Record(topic, partition, record.offset, envelope, verdict))
        return out

    @staticmethod
    async def _unseen(conn: AsyncConnection, name: str, records: list[Record]) -> list[Record]:
        ids = sorted({r.envelope.id for r in records})
        seen: set[str] = set()
        for chunk in chunks(ids):
            result = await conn.execute(select(projection_applied.c.event_id).where(and_(
                projection_applied.c.consumer == name,
                projection_applied.c.event_id.in_(chunk))))
            seen.update(result.scalars())
        fresh = []
        for record in records:
            if record.envelope.id in seen:
                continue
            seen.add(record.envelope.id)
            fresh.append(record)
        return fresh

    async def _write_offsets(self, conn: AsyncConnection,
                             ends: Mapping[str, Mapping[TopicPartition, int]],
                             prints: Mapping[str, Mapping[TopicPartition, str]]) -> None:
        """Move every model's offsets to `ends` (with the fingerprint of the record
        before each, for the log identity check) if they, and every other stored
        position this runner knows of, still hold what this runner read: one UPDATE
        for the positions it had, one INSERT for the first ones. Checking the places
        a batch does not move too is what lets the models remember their rows between
        batches (`_remember`): another writer of a model moves some place of it."""
        known = [(name, tp, expected, ends.get(name, {}).get(tp))
                 for (name, tp), expected in self._positions.items() if expected is not None]
        first = [{"consumer": name, "topic": tp.topic, "partition": tp.partition,
                  "next_offset": end, "last_record": prints[name].get(tp)}
                 for name, by_tp in ends.items()
                 for tp, end in by_tp.items() if self._positions.get((name, tp)) is None]
        if known:
            values: dict[str, Any] = {}
            for i, (name, tp, expected, end) in enumerate(known):
                moved = end is not None
                values.update({f"c{i}": name, f"t{i}": tp.topic, f"p{i}": tp.partition,
                               f"x{i}": expected, f"e{i}": end if moved else expected,
                               f"f{i}": prints[name].get(tp) if moved else None})
            result = await conn.execute(self._offsets_update(len(known)), values)
            if result.rowcount != len(known):
                raise OffsetConflict(f"offsets of {self.name} moved under this runner")
        if first:
            try:  # the whole transaction rolls back on a conflict: no savepoint needed
                await conn.execute(insert(projection_offsets), first)
            except IntegrityError as error:
                raise OffsetConflict(f"offsets of {self.name} appeared under it") from error

    def _offsets_update(self, count: int) -> Any:
        """The UPDATE holding `count` places (read model, partition) to their expected
        offsets and moving them: the i-th place's consumer, topic, partition, expected
        offset, new offset and fingerprint are the parameters `c<i>`, `t<i>`, `p<i>`,
        `x<i>`, `e<i>`, `f<i>` (a place the batch does not move: its expected offset
        again and no fingerprint, which keeps the stored one). Built once per count and
        kept: building the expression anew for every batch had been a fifth of the live
        runner's CPU, and the same statement object reuses its compiled form; every
        place known in each batch, the count rarely changes."""
        statement = self._offset_updates.get(count)
        if statement is not None:
            return statement
        table = projection_offsets
        places = [and_(table.c.consumer == bindparam(f"c{i}", type_=String),
                       table.c.topic == bindparam(f"t{i}", type_=String),
                       table.c.partition == bindparam(f"p{i}", type_=Integer))
                  for i in range(count)]
        statement = update(table).where(or_(*(
            and_(place, table.c.next_offset == bindparam(f"x{i}", type_=BigInteger))
            for i, place in enumerate(places)))).values(
                next_offset=case(*((place, bindparam(f"e{i}", type_=BigInteger))
                                   for i, place in enumerate(places))),
                last_record=case(*((place, func.coalesce(bindparam(f"f{i}", type_=String),
                                                         table.c.last_record))
                                   for i, place in enumerate(places))))
        self._offset_updates[count] = statement
        return statement

    async def _seek_to_stored(self) -> None:
        """Re-read every model's stored positions; seek each partition to the lowest."""
        assert self._consumer is not None
        self._forget()  # whatever made the runner re-read may have changed the rows too
        stored = {m.name: await stored_offsets(self.engine, m.name) for m in self.models}
        self._passed.clear()
        async with self._moved:
            for tp in self._partitions:
                for model in self.models:
                    if tp.topic in model.topics:
                        self._positions[(model.name, tp)] = stored[model.name].get(
                            (tp.topic, tp.partition))
                position = self._position(tp)
                if position is None:
                    await self._consumer.seek_to_beginning(tp)
                else:
                    self._consumer.seek(tp, position)
            self._moved.notify_all()

    def _position(self, tp: TopicPartition) -> int | None:
        """The lowest stored position of the models reading `tp` (None: from the start)."""
        positions = [self._positions.get((m.name, tp)) for m in self.models
                     if tp.topic in m.topics]
        if not positions or any(p is None for p in positions):
            return None
        return min(p for p in positions if p is not None)

    # -- progress ---------------------------------------------------------------------
    async def end_offsets(self) -> dict[TopicPartition, int]:
        """The log end of every assigned partition, now."""
        assert self._consumer is not None, "runner not open"
        return dict(await self._consumer.end_offsets(self._partitions)) if self._partitions else {}

    async def beginning_offsets(self) -> dict[TopicPartition, int]:
        assert self._consumer is not None, "runner not open"
        if not self._partitions:
            return {}
        return dict(await self._consumer.beginning_offsets(self._partitions))

    def _end(self, tp: TopicPartition, listed: int) -> int:
        # Tansu answers ListOffsets(latest) with the last batch's base offset + 1, short
        # of the true end when that batch holds several records; the high watermark of
        # fetch responses is right, and arrives with the batch that holds the last record.
        return max(listed, self._highwater(tp) or 0)

    def _highwater(self, tp: TopicPartition) -> int | None:
        return self._consumer.highwater(tp) if self._consumer is not None else None

    def reached(self, ends: Mapping[TopicPartition, int]) -> bool:
        """True when every partition's stored position is at or past `ends`, and past
        the high watermark of a fetch answered since the runner last sought."""
        return all(self._highwater(tp) is not None
                   and self._read_up_to(tp) >= self._end(tp, end)
                   for tp, end in ends.items())

    def _read_up_to(self, tp: TopicPartition) -> int:
        return max(self._position(tp) or 0, self._passed.get(tp, 0))

    def remaining(self, ends: Mapping[TopicPartition, int]) -> int:
        """Records between the stored positions and `ends` (as far as known now)."""
        return sum(max(self._end(tp, end) - self._read_up_to(tp), 0)
                   for tp, end in ends.items())

    async def wait_caught_up(self, timeout: float = 10.0) -> bool:
        """Wait (bounded) until the rows include every record in the log right now."""
        if self._pacer is not None:
            self._pacer.busy()
        self._reader_waits.set()
        return await self.wait_caught_up_to(await self.end_offsets(), timeout)

    async def wait_caught_up_to(self, ends: Mapping[TopicPartition, int],
                                timeout: float = 10.0) -> bool:
        """Wait (bounded) until the rows include every record before `ends`."""
        self._reader_waits.set()  # a runner backing off or pausing between folds goes on now
        self._waiters += 1
        try:
            async with asyncio.timeout(timeout), self._moved:
                await self._moved.wait_for(lambda: self.reached(ends) or self.failure is not None)
        except TimeoutError:
            return False
        finally:
            self._waiters -= 1
        return self.failure is None


def _add(total: RunnerStats, delta: RunnerStats) -> None:
    total.records += delta.records
    total.applied += delta.applied
    total.duplicates += delta.duplicates
    total.undecodable += delta.undecodable
    total.batches += delta.batches
    total.lags.extend(delta.lags)


async def stored_offsets(engine: AsyncEngine, consumer: str) -> dict[tuple[str, int], int]:
    """Next offsets stored for `consumer`, by (topic, partition)."""
    table = projection_offsets
    async with engine.connect() as conn:
        result = await conn.execute(select(table.c.topic, table.c.partition, table.c.next_offset)
                                    .where(table.c.consumer == consumer))
        return {(r.topic, r.partition): r.next_offset for r in result}
