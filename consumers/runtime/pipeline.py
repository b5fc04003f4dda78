"""The pipeline's consumer group on `toolexec.requests`: it owns each invocation end
to end, where its request lands.

One consumer reads the requests of the partitions this process owns, in batches,
straight from aiokafka (no per-record framework work); each request runs in process
(consumers.runtime.runs, consumers.runtime.invocation) and its facts go to the same partition of
`toolexec.invocations`. Cancels and approvers' decisions are applied at once. Offsets
are committed up to the first unfinished request (consumers.runtime.partition_progress), a few
times a second: a request waiting for an approver holds its partition's commit back
until it ends, so after a restart the requests behind it are read again (those that
ended are skipped, by their facts).

When a partition is assigned (start, rebalance) it is paused until its requests'
state is read back from the log (consumers.runtime.recovery): finished requests are skipped,
the others resume from their last fact. A producer in this process (the HTTP gateway,
the MCP server, an embedded `toolexec run`) hands its acknowledged request over in
memory (`expect` + `hand_over`) and gets the terminal event back in memory; the copy
the consumer reads later is recognised by its offset and skipped.

Bad input never stops the consumer: undecodable records and records that are not
commands are dead-lettered, and the consumer moves on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import ConsumerStoppedError, IllegalStateError, KafkaError
from aiokafka.partitioner import DefaultPartitioner

from consumers.runtime.deadletter import DeadLetters
from consumers.runtime.delivery import DeliveringFactLog
from consumers.runtime.fact_log import PartitionFactLog
from consumers.runtime.fetch_pacing import FetchPacer
from consumers.runtime.invocation import InvocationDeps
from consumers.runtime.invocation_facts import InvocationFacts
from consumers.runtime.partition_progress import PartitionProgress
from consumers.runtime.recovery import LogReader
from consumers.runtime.runs import InvocationRuns, Listener, RecordRef
from contracts import topics
from contracts.envelope import Envelope
from contracts.errors import ErrorInfo
from contracts.fact_signature import FactSigner, FactVerifier
from contracts.kafka_binding import UndecodableRecord, decode, encode, header_type
from contracts.kafka_clients import close_quietly

log = structlog.get_logger(__name__)

REQUESTED = "tool.invoke.requested"
CANCEL_REQUESTED = "tool.invoke.cancel.requested"
APPROVAL_DECIDED = "tool.approval.decided"
POLL_MS = 200
MAX_RECORDS = 500
COMMIT_INTERVAL = 0.05
RECOVERY_RETRY_SECONDS = 1.0
STOP_GRACE_SECONDS = 10.0


class PartitionCountMismatch(RuntimeError):
    """The requests and invocations topics have different partition counts."""


class Pipeline:
    """The consumer group that runs every invocation whose request it reads."""

    def __init__(self, bootstrap: str, producer: AIOKafkaProducer, deps: InvocationDeps,
                 dead_letters: DeadLetters, *, signer: FactSigner, verifier: FactVerifier,
                 group: str,
                 consumer_options: Mapping[str, Any] | None = None,
                 client_options: Mapping[str, Any] | None = None,
                 pacer: FetchPacer | None = None, max_in_flight: int = 32,
                 observe: Listener | None = None) -> None:
        self.group = group
        self._signer = signer
        self._verifier = verifier
        self._bootstrap = bootstrap
        self._producer = producer
        self._dead_letters = dead_letters
        self._options = {k: v for k, v in (consumer_options or {}).items()
                         if k != "fetch_max_wait_ms"}
        self._client_options = dict(client_options or {})
        """Connection options (security) of both consumers."""
        self._pacer = pacer or FetchPacer(5, 500)
        self._read_wait_ms: int = (consumer_options or {}).get(
            "fetch_max_wait_ms", self._pacer.short_ms)
        """Fetch wait of the recovery reader, which reads partitions to their end and
        learns it is there from an empty answer: short, whatever the pacer's waits."""
        self._max_in_flight = max_in_flight
        self._observe = observe
        self.runs = InvocationRuns(deps, dead_letters, consumer=f"{group}/invocation",
                                   max_in_flight=max_in_flight, observe=observe)
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: LogReader | None = None
        self._reader_consumer: AIOKafkaConsumer | None = None
        self._progress: dict[int, PartitionProgress] = {}
        self._recovered: dict[int, _RecoveredFacts] = {}
        self._recovering: dict[int, asyncio.Task[None]] = {}
        self._committed: dict[int, int] = {}
        self._commit_task: asyncio.Task[None] | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._partitions: list[int] = []
        self._partitioner = DefaultPartitioner()
        self._broker_error: str | None = None
        self.ready = asyncio.Event()
        """Set once every partition first assigned is recovered."""

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Join the group; recovery and consumption go on in the background."""
        self._reader_consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap, group_id=None, enable_auto_commit=False,
            fetch_max_wait_ms=self._read_wait_ms, **self._client_options)
        await self._reader_consumer.start()
        self._reader = LogReader(self._reader_consumer, self._verifier)
        self._partitions = self._check_partitions(self._reader_consumer)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap, group_id=self.group, enable_auto_commit=False,
            auto_offset_reset="earliest", fetch_max_wait_ms=self._pacer.long_ms,
            **self._options, **self._client_options)
        consumer.subscribe([topics.REQUESTS], listener=_Rebalance(self))
        self._consumer = consumer  # the listener runs within start()
        self._pacer.attach(consumer)
        await consumer.start()
        self._loop_task = asyncio.create_task(self._consume(), name=f"pipeline-{self.group}")

    async def stop(self) -> None:
        """Stop reading, let the runs in flight end (bounded), commit, leave the group."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None
        await self._end_recoveries()
        try:
            async with asyncio.timeout(STOP_GRACE_SECONDS):
                await self.runs.drain()
        except TimeoutError:
            log.warning("pipeline.stop_with_work_in_flight", active=self.runs.active)
        await self._commit()
        if self._consumer is not None:
            await close_quietly(self._consumer.stop())
            self._consumer = None
        await self._end_recoveries()  # any that a rebalance started meanwhile
        if self._reader_consumer is not None:
            await close_quietly(self._reader_consumer.stop())
            self._reader_consumer = None

    async def _end_recoveries(self) -> None:
        """Cancel the partitions' recoveries and wait for them to end: one left running
        would meet the stopped consumer and fail with nobody to hear it."""
        tasks = list(self._recovering.values())
        self._recovering.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def running(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    def _check_partitions(self, consumer: AIOKafkaConsumer) -> list[int]:
        requests = sorted(consumer.partitions_for_topic(topics.REQUESTS) or ())
        facts = sorted(consumer.partitions_for_topic(topics.INVOCATIONS) or ())
        if not requests or requests != facts:
            raise PartitionCountMismatch(
                f"{topics.REQUESTS} has partitions {requests} and {topics.INVOCATIONS} "
                f"{facts}: the facts of an invocation go to its request's partition, so "
                "both topics need the same partition count")
        return requests

    # -- local producers --------------------------------------------------------------

    def partition_of(self, invocation_id: str) -> int:
        """The requests partition of `invocation_id` (the default partitioner's)."""
        return self._partitioner(invocation_id.encode(), self._partitions, self._partitions)

    def owns(self, partition: int) -> bool:
        """Whether requests of `partition` run here now (assigned and recovered)."""
        progress = self._progress.get(partition)
        return progress is not None and progress.owned

    def expect(self, invocation_id: str, listener: Listener | None = None
               ) -> asyncio.Future[Envelope]:
        """A future of the terminal event, for a local producer about to send the
        request of `invocation_id` to a partition `owns` says is here."""
        return self.runs.expect(invocation_id, listener)

    def forget(self, invocation_id: str) -> None:
        """The expected request could not be delivered."""
        self.runs.forget(invocation_id)

    def hand_over(self, request: Envelope, partition: int, offset: int) -> None:
        """Run the acknowledged request at (`partition`, `offset`) now. If the partition
        moved to another owner in between, it runs here anyway: execution claims keep
        the tool from running twice, and the facts keep their ids."""
        progress = self._progress.get(partition)
        if progress is None:
            progress = PartitionProgress(partition, next_read=0, high_water=0)
            progress.owned = False
        progress.hand_over(offset)
        record = encode(request)
        self._start(request, progress, RecordRef(topics.REQUESTS, partition, offset, record.key,
                                                 record.value, record.headers),
                    InvocationFacts(), handed_over=True)

    def cancel(self, invocation_id: str, reason: str | None) -> None:
        """Apply a local producer's acknowledged cancel now (its copy read from the
        log later changes nothing more): a run handed over in memory does not keep
        the consumer on its short fetch wait, so the copy may be read only later."""
        self.runs.cancel(invocation_id, reason)

    # -- consuming --------------------------------------------------------------------

    async def _consume(self) -> None:
        assert self._consumer is not None
        consumer = self._consumer
        while True:
            try:
                fetched = await consumer.getmany(timeout_ms=POLL_MS, max_records=MAX_RECORDS)
            except ConsumerStoppedError:
                return
            except KafkaError as exc:
                self._broker_state(repr(exc))
                await asyncio.sleep(RECOVERY_RETRY_SECONDS)
                continue
            self._broker_state(None)
            news = False
            for tp, records in fetched.items():
                progress = self._progress.get(tp.partition)
                if progress is None:
                    if tp.partition in self._recovering:  # read again once recovered
                        consumer.seek(tp, records[0].offset)
                    continue  # else revoked meanwhile: its new owner reads them
                for record in records:
                    news = self._on_record(progress, record) or news
                self._forget_recovered(progress)
            if news or self.runs.active_from_log:
                self._pacer.busy()
            else:
                self._pacer.update()
            if fetched:
                self._commit_soon()
            await self.runs.wait_below(self._max_in_flight * 4)

    def _on_record(self, progress: PartitionProgress, record: Any) -> bool:
        """Act on one record; False when it was only the log's copy of a request
        handed over here (news from the log keep the consumer on its short wait)."""
        kind = header_type(record.headers)
        offset = record.offset
        if kind == REQUESTED:
            if progress.take(offset):
                self._on_request(progress, record)
                return True
            return False
        progress.skip(offset)
        try:
            event = decode(record.key, record.value, record.headers)
        except UndecodableRecord as bad:
            self._dead_letter(record, bad.error)
            return True
        if event.type == CANCEL_REQUESTED:
            self.runs.cancel(event.data.invocation_id, event.data.reason)
        elif event.type == APPROVAL_DECIDED:
            refused = self.runs.decide(event)
            if refused is not None:  # could never count: kept nowhere, on record here
                self._dead_letter(record, refused)
        else:
            self._dead_letter(record, ErrorInfo(
                code="E3004", message=f"{event.type} is not a command; producers may write "
                f"only {sorted(topics.COMMAND_TYPES)} to {topics.REQUESTS}",
                details={"type": event.type}))
        return True

    def _on_request(self, progress: PartitionProgress, record: Any) -> None:
        offset = record.offset
        try:
            request = decode(record.key, record.value, record.headers)
        except UndecodableRecord as bad:
            self._dead_letter(record, bad.error)
            progress.finish(offset)
            return
        invocation_id = request.data.invocation_id
        run = self.runs.running(invocation_id)
        if run is not None and run.task is not None:  # handed over, or a repeated request
            run.when_done(self._finisher(progress, offset))
            return
        if self.runs.finished_recently(invocation_id):
            progress.finish(offset)
            return
        recovered = self._recovered.get(progress.partition)
        facts = (recovered.facts.pop(invocation_id, None) if recovered is not None
                 else None) or InvocationFacts()
        if facts.terminal is not None:
            progress.finish(offset)
            return
        self._start(request, progress, RecordRef(topics.REQUESTS, progress.partition, offset,
                                                 record.key, record.value, record.headers),
                    facts)

    def _start(self, request: Envelope, progress: PartitionProgress, source: RecordRef,
               facts: InvocationFacts, *, handed_over: bool = False) -> None:
        """Run `request`, read from (or handed over at) `source`. Only a request read
        from the log keeps the consumer on its short fetch wait: more may follow it
        there, while a local producer's requests and cancels need no fetch at all."""
        offset = source.offset
        fact_log = DeliveringFactLog(PartitionFactLog(self._producer, progress, self._signer,
                                                      observe=self._observe))
        self.runs.start(request, fact_log, facts, source, self._finisher(progress, offset),
                        handed_over=handed_over)
        if not handed_over:
            self._pacer.busy()

    def _finisher(self, progress: PartitionProgress, offset: int) -> Callable[[], None]:
        def finish() -> None:
            progress.finish(offset)
            self._commit_soon()
        return finish

    def _dead_letter(self, record: Any, error: ErrorInfo) -> None:
        task = asyncio.create_task(self._dead_letters.record(
            record, error, consumer=self.group, attempts=1))
        task.add_done_callback(_log_failure)

    def _forget_recovered(self, progress: PartitionProgress) -> None:
        """Drop the facts read back at assignment once every request that was on the
        log then has been read."""
        recovered = self._recovered.get(progress.partition)
        if recovered is not None and (progress.next_read >= recovered.requests_end
                                      or not recovered.facts):
            del self._recovered[progress.partition]

    def _broker_state(self, error: str | None) -> None:
        """Log broker trouble once per change of state, not once per retry."""
        if error is None and self._broker_error is not None:
            log.info("pipeline.broker_back")
        elif error is not None and self._broker_error is None:
            log.warning("pipeline.broker_unavailable", error=error)
        self._broker_error = error

    # -- commits ----------------------------------------------------------------------

    def _commit_soon(self) -> None:
        if self._commit_task is None or self._commit_task.done():
            self._commit_task = asyncio.create_task(self._commit_later())

    async def _commit_later(self) -> None:
        await asyncio.sleep(COMMIT_INTERVAL)
        await self._commit()

    async def _commit(self, partitions: set[int] | None = None) -> None:
        """Commit, per owned partition, the position below which every request is
        finished, when it moved."""
        if self._consumer is None:
            return
        offsets = {}
        for partition, progress in self._progress.items():
            if partitions is not None and partition not in partitions:
                continue
            position = progress.low_water
            if progress.owned and position > self._committed.get(partition, -1):
                offsets[TopicPartition(topics.REQUESTS, partition)] = position
        if not offsets:
            return
        try:
            await self._consumer.commit(offsets)
        except Exception as exc:  # moved in a rebalance, or the broker away: later
            log.info("pipeline.commit_deferred", partitions=len(offsets), error=repr(exc))
            return
        for tp, position in offsets.items():
            self._committed[tp.partition] = position

    # -- assignment -------------------------------------------------------------------

    def _assigned(self, assigned: set[TopicPartition]) -> None:
        assert self._consumer is not None
        mine = {tp for tp in assigned if tp.topic == topics.REQUESTS}
        if mine:
            self._consumer.pause(*mine)
        for tp in mine:
            self._recovering[tp.partition] = asyncio.create_task(
                self._recover(tp), name=f"recover-{tp.partition}")
        if not mine:
            self.ready.set()

    async def _revoked(self, revoked: set[TopicPartition]) -> None:
        partitions = {tp.partition for tp in revoked if tp.topic == topics.REQUESTS}
        for partition in partitions:
            task = self._recovering.pop(partition, None)
            if task is not None:
                task.cancel()
        await self._commit(partitions)
        self.runs.stop_waiting(partitions)
        for partition in partitions:
            progress = self._progress.pop(partition, None)
            if progress is not None:
                progress.owned = False
            self._recovered.pop(partition, None)
            self._committed.pop(partition, None)

    async def _recover(self, tp: TopicPartition) -> None:
        """Read the partition's state back from the log, then let it be consumed."""
        assert self._consumer is not None and self._reader is not None
        while True:
            try:
                recovered = await self._reader.recover(
                    TopicPartition(topics.INVOCATIONS, tp.partition))
                requests_end = await self._reader.end_offset(tp)
                position = await self._consumer.position(tp)
                break
            except (KafkaError, TimeoutError) as exc:
                log.warning("pipeline.recovery_retrying", partition=tp.partition,
                            error=repr(exc))
                await asyncio.sleep(RECOVERY_RETRY_SECONDS)
        progress = PartitionProgress(
            tp.partition, next_read=max(position, recovered.resume_below),
            high_water=recovered.end, resume_below=recovered.resume_below)
        self._progress[tp.partition] = progress
        self._committed[tp.partition] = position
        if recovered.facts:
            self._recovered[tp.partition] = _RecoveredFacts(recovered.facts, requests_end)
        self._recovering.pop(tp.partition, None)
        with contextlib.suppress(IllegalStateError):
            self._consumer.resume(tp)
        if not self._recovering:
            self.ready.set()


@dataclass
class _RecoveredFacts:
    """Facts read back at assignment, by invocation id, kept until the consumer has
    read every request that was on the log then (`requests_end`)."""

    facts: dict[str, InvocationFacts]
    requests_end: int


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._pipeline._revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._pipeline._assigned(assigned)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("pipeline.deadletter_failed", error=repr(task.exception()))
