"""Archiving the embedded broker's log as it is written: records, topics, group commits.

One consumer outside any group follows every partition of every topic on the broker
(topics are discovered from its metadata, never listed here) from the archive's end,
and appends each fetched batch to the archive, made durable before it counts as
archived. Every `groups_seconds` the consumer groups' committed offsets are read
(ListGroups, then OffsetFetch naming the partitions: Tansu does not answer the
all-partitions form) and archived when they changed.

A record is archived once the fetch that returned it is written (and fsynced, with
the `always` policy): the loss window of a broker killed with SIGKILL is what it
acknowledged since the archiver's last fetch — at most about one fetch wait plus a
write and an fsync while it keeps up. The fetch wait is short while records flow and
for a few seconds after, long once the log is quiet (consumers.runtime.fetch_pacing): the
first records after a quiet spell may wait up to the long one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Mapping
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError, OffsetOutOfRangeError

from consumers.runtime.fetch_pacing import FetchPacer
from toolexec.log_archive import ArchivedRecord, LogArchive

log = structlog.get_logger(__name__)

MAX_RECORDS_PER_FETCH = 5000
INTERNAL_PREFIX = "__"
IDLE_SLOWDOWN = 10
"""How much less often group commits are looked at while nothing flows (topics are
looked for at the same pace always: records of a topic created during a quiet spell
must not wait for it to end)."""


class LogArchiver:
    """Follows the broker at `bootstrap` and appends what it reads to `archive`."""

    def __init__(self, archive: LogArchive, bootstrap: str, *, fetch_wait_ms: int = 5,
                 idle_wait_ms: int | None = None,
                 discover_seconds: float = 1.0, groups_seconds: float = 1.0,
                 client_options: Mapping[str, Any] | None = None) -> None:
        self.archive = archive
        self.bootstrap = bootstrap
        self.fetch_wait_ms = fetch_wait_ms
        self._pacer = FetchPacer(fetch_wait_ms, idle_wait_ms or fetch_wait_ms)
        self.discover_seconds = discover_seconds
        self.groups_seconds = groups_seconds
        self._options = dict(client_options or {})
        self._consumer: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._assigned: list[TopicPartition] = []
        self._topics: dict[str, int] = {}
        self._groups: dict[str, dict[tuple[str, int], int]] = {}
        self.observed_high: dict[tuple[str, int], int] = {}
        """Highest high watermark the broker reported per partition (from fetches)."""
        self.archived_records = 0
        """Records archived since `start()` (what this broker took since it started)."""
        self.last_archived_at = time.monotonic()
        self.failure: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._progress = asyncio.Condition()

    async def start(self) -> None:
        """Connect, discover the topics, seek every partition to the archive's end and
        start following in the background."""
        self._topics = self.archive.topics()
        self._groups = self.archive.groups()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
            auto_offset_reset="none", fetch_max_wait_ms=self.fetch_wait_ms, **self._options)
        await self._consumer.start()
        self._pacer.attach(self._consumer)
        self._admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, **self._options)
        await self._admin.start()
        await self._discover()
        self._task = asyncio.create_task(self._run(), name="log-archiver")

    async def stop(self) -> None:
        """Stop following (what was fetched is written) and disconnect."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._consumer is not None:
            await close_quietly(self._consumer.stop())
        if self._admin is not None:
            await close_quietly(self._admin.close())
        self._consumer = self._admin = None
        self.archive.sync()

    # -- the loop --------------------------------------------------------------------------
    async def _run(self) -> None:
        next_discovery = next_groups = time.monotonic()
        while True:
            try:
                now = time.monotonic()
                slower = 1 if self._pacer.wait_ms == self._pacer.short_ms else IDLE_SLOWDOWN
                if now >= next_discovery:  # never slowed: a new topic is archived at once
                    await self._discover()
                    next_discovery = now + self.discover_seconds
                if now >= next_groups:
                    await self.archive_groups()
                    next_groups = now + self.groups_seconds * slower
                await self.step()
            except asyncio.CancelledError:
                raise
            except OffsetOutOfRangeError as error:
                # The broker's log ends before the archive's: it is not the archived log
                # any more (the supervisor restores it).
                self.failure = error
                log.error("log_archiver.broker_behind_archive", error=str(error))
                return
            except KafkaError as error:  # the broker is away: the supervisor decides
                log.debug("log_archiver.kafka_error", error=repr(error))
                await asyncio.sleep(0.1)
            except Exception as error:
                self.failure = error
                log.exception("log_archiver.failed")
                raise

    async def step(self) -> int:
        """One fetch, written and synced; returns the records archived."""
        assert self._consumer is not None
        if not self._assigned:
            await asyncio.sleep(self.fetch_wait_ms / 1000)
            return 0
        fetched = await self._consumer.getmany(timeout_ms=max(self._pacer.wait_ms, 1) * 4,
                                               max_records=MAX_RECORDS_PER_FETCH)
        count = 0
        touched = []
        for tp, records in fetched.items():
            archive = self.archive.partition(tp.topic, tp.partition)
            fresh = [_archived(r) for r in records if r.offset >= archive.next_offset]
            if fresh:
                archive.append(fresh)  # type: ignore[arg-type]
                touched.append(archive)
                count += len(fresh)
        for archive in touched:
            archive.sync()
        for tp in self._assigned:
            high = self._consumer.highwater(tp)
            if high is not None:
                key = (tp.topic, tp.partition)
                self.observed_high[key] = max(self.observed_high.get(key, 0), high)
        self.archived_records += count
        if count:
            self.last_archived_at = time.monotonic()
            self._pacer.busy()
        else:
            self._pacer.update()
        async with self._progress:
            self._progress.notify_all()
        return count

    # -- discovery -------------------------------------------------------------------------
    async def _discover(self) -> None:
        """Follow every partition of every (non-internal) topic the broker has."""
        assert self._admin is not None and self._consumer is not None
        # One metadata request for every topic (it runs every second, idle or not).
        described = await self._admin.describe_topics()
        topics = {t["topic"]: len(t["partitions"]) for t in described
                  if not t["topic"].startswith(INTERNAL_PREFIX)
                  and t.get("error_code", 0) == 0 and t["partitions"]}
        merged = {**self._topics, **{t: max(n, self._topics.get(t, 0)) for t, n in topics.items()}}
        if merged != self._topics or not self.archive.topics():
            if set(merged) - set(self._topics):
                log.info("log_archiver.topics", new=sorted(set(merged) - set(self._topics)))
            self.archive.record_topics(merged)
            self._topics = merged
        wanted = sorted((TopicPartition(t, p) for t, n in topics.items() for p in range(n)),
                        key=lambda tp: (tp.topic, tp.partition))
        if wanted != self._assigned:
            self._consumer.assign(wanted)
            for tp in wanted:
                self._consumer.seek(tp, self.archive.partition(tp.topic, tp.partition).next_offset)
            self._assigned = wanted

    async def archive_groups(self) -> None:
        """Archive every consumer group's committed offsets when they changed."""
        assert self._admin is not None
        groups: dict[str, dict[tuple[str, int], int]] = dict(self._groups)
        listed = await self._admin.list_consumer_groups()
        for entry in listed:
            group = entry[0]
            offsets = await self._admin.list_consumer_group_offsets(
                group, partitions=list(self._assigned))
            committed = {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()
                         if meta is not None and meta.offset >= 0}
            if committed:
                groups[group] = {**groups.get(group, {}), **committed}
        if groups != self._groups:
            self.archive.record_groups(groups, now=time.time())
            self._groups = groups

    # -- progress --------------------------------------------------------------------------
    def lag(self) -> dict[tuple[str, int], int]:
        """Records the broker reported that are not archived yet, per partition."""
        ends = self.archive.ends()
        return {key: max(high - ends.get(key, 0), 0) for key, high in self.observed_high.items()}

    async def drain(self, timeout: float, *, quiet_seconds: float = 0.2) -> bool:
        """Archive until every partition is caught up with the broker and nothing new
        arrived for `quiet_seconds` (bounded by `timeout`); True when caught up."""
        assert self._consumer is not None
        if self._task is not None:  # take over from the background loop
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            try:
                await self._discover()
                if await self.step():
                    quiet_since = time.monotonic()
                    continue
            except KafkaError as error:
                log.warning("log_archiver.drain_failed", error=repr(error))
                return False
            caught_up = not any(self.lag().values())
            if caught_up and time.monotonic() - quiet_since >= quiet_seconds:
                with contextlib.suppress(KafkaError):
                    await self.archive_groups()
                return True
        return not any(self.lag().values())

    async def wait_archived(self, ends: Mapping[tuple[str, int], int], timeout: float) -> bool:
        """Until the archive reaches `ends` (partition -> offset), bounded."""
        def reached() -> bool:
            have = self.archive.ends()
            return all(have.get(key, 0) >= end for key, end in ends.items())
        try:
            async with asyncio.timeout(timeout), self._progress:
                await self._progress.wait_for(reached)
        except TimeoutError:
            return False
        return True


async def close_quietly(closing: Coroutine[Any, Any, Any]) -> None:
    """Await a Kafka client's stop/close whose broker may be gone: its errors (and the
    CancelledError aiokafka's fetcher raises when stopped mid-retry) are not ours."""
    task = asyncio.current_task()
    try:
        await closing
    except asyncio.CancelledError:
        if task is not None and task.cancelling():
            raise  # we are being cancelled ourselves
    except Exception as error:  # noqa: BLE001 - shutting down a client of a dead broker
        log.debug("kafka_client.close_failed", error=repr(error))


def _archived(record: ConsumerRecord) -> ArchivedRecord:
    return ArchivedRecord(offset=record.offset, timestamp=record.timestamp, key=record.key,
                          value=record.value, headers=tuple(record.headers or ()),
                          timestamp_type=record.timestamp_type)
