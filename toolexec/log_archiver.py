"""Archiving the embedded broker's log as it is written: records, topics, group commits.

One consumer outside any group follows every partition of every topic on the broker
(topics are discovered from its metadata, never listed here) from the archive's end,
and appends each fetched batch to the archive, made durable before it counts as
archived. Every `groups_seconds` the consumer groups' committed offsets are read
(ListGroups, then OffsetFetch naming the partitions: Tansu does not answer the
all-partitions form) and archived when they changed.

A record is archived once the fetch that returned it is written (and fsynced, with
the `always` policy): the loss window of a broker killed with SIGKILL is what it
acknowledged and the archiver has not fetched yet.

How it learns that there is something to fetch:

- **Told** (`woken=True`: the broker serves through its gate, which every client
  writes through and which calls `kick()` with the partitions produces were
  acknowledged to). The partitions stay paused while nothing is announced, so no
  fetch waits at the broker. News is fetched at once, its partitions alone (Tansu's
  work per fetch grows with the partitions it names), and while news keeps coming
  the partitions stay resumed so that the client fetches ahead, as a poller does.
  Once nothing was announced since the last fetch, the ends of the partitions
  fetched are asked (ListOffsets, sent after every acknowledgement announced, so
  they hold its records) and fetched up to; then they are paused again, before the
  client can send a fetch that would wait at the broker. Every `idle_wait_ms` the
  ends of every partition are looked at without news. The window is the news's
  way through the gate and the supervisor plus a fetch, a write and an fsync.
- **Polling** (the broker on its own port): a fetch waits at most `fetch_wait_ms`
  while records flow and for a few seconds after, `idle_wait_ms` once the log is
  quiet (consumers.runtime.fetch_pacing): the window is about one fetch wait plus a
  write and an fsync, and the first records after a quiet spell may wait up to the
  long one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError, OffsetOutOfRangeError

from consumers.runtime.fetch_pacing import FetchPacer
from contracts.kafka_clients import close_quietly
from toolexec.log_archive import ArchivedRecord, LogArchive

log = structlog.get_logger(__name__)

MAX_RECORDS_PER_FETCH = 5000
INTERNAL_PREFIX = "__"
NEWS_FETCH_WAITS = 3
"""How many fetch waits a told archiver waits for the records of news: a fetch that
finds them is answered at once, one that does not (they were fetched already) after
one wait; then the log's ends decide."""
BEHIND_FETCH_MS = 100
"""How long a told archiver waits for the records of a partition known to hold them
(Tansu answers such a fetch at once; a busy machine may take longer)."""
CATCH_UP_SECONDS = 1.0
"""How long one catch-up of a told archiver runs at most: under a stream of news it
returns then (the topics and groups are looked at, and it goes on); one that cannot
reach the ends it asked for pauses and tries again on the next news or look (a
broker gone silent is the supervisor's)."""
UNKNOWN_NEWS_LOOK_SECONDS = 0.1
"""News of a partition not followed (a topic created since the last look) looks for
topics at once, but not more often than this (a client writing to topics the broker
refuses would otherwise have it ask for every topic at every turn)."""
IDLE_SLOWDOWN = 10
"""How much less often group commits are looked at while nothing flows (topics are
looked for at the same pace always: records of a topic created during a quiet spell
must not wait for it to end)."""


class LogArchiver:
    """Follows the broker at `bootstrap` and appends what it reads to `archive`."""

    def __init__(self, archive: LogArchive, bootstrap: str, *, fetch_wait_ms: int = 5,
                 idle_wait_ms: int | None = None,
                 discover_seconds: float = 1.0, groups_seconds: float = 1.0,
                 woken: bool = False,
                 client_options: Mapping[str, Any] | None = None) -> None:
        self.archive = archive
        self.bootstrap = bootstrap
        self.fetch_wait_ms = fetch_wait_ms
        self.woken = woken
        self._pacer = FetchPacer(fetch_wait_ms, idle_wait_ms or fetch_wait_ms)
        self._kicked = asyncio.Event()
        self._news: set[tuple[str, int]] = set()
        self._news_everywhere = False
        self._unknown_news = False
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
        if not self.woken:
            self._pacer.attach(self._consumer)
        self._admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, **self._options)
        await self._admin.start()
        await self._discover()
        self.follow()

    def follow(self) -> None:
        """Follow the broker in the background (again, after a `drain()` that did not
        end in a stop)."""
        if self._task is None:
            self._pause()
            self._task = asyncio.create_task(self._run(), name="log-archiver")

    def kick(self, places: Iterable[tuple[str, int]] | None = None) -> None:
        """Produces to `places` (None: to partitions unknown) were acknowledged:
        archive them (a told archiver)."""
        if places is None:
            self._news_everywhere = True
        else:
            self._news.update(places)
        self._kicked.set()

    def _take_news(self) -> list[TopicPartition]:
        """The followed partitions news was told for since the last call: all of them
        after news of partitions unknown, or of one not followed yet (a topic created
        since the last look, looked for at once)."""
        news, self._news = self._news, set()
        everywhere, self._news_everywhere = self._news_everywhere, False
        self._kicked.clear()
        if not set(self._assigned).issuperset(news):  # TopicPartition == (topic, partition)
            self._unknown_news = True
            everywhere = True
        return list(self._assigned) if everywhere else [TopicPartition(*p) for p in news]

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
        next_discovery = next_groups = next_look = time.monotonic()
        last_discovery = 0.0
        while True:
            try:
                now = time.monotonic()
                slower = 1 if self._pacer.wait_ms == self._pacer.short_ms else IDLE_SLOWDOWN
                told = self._unknown_news and now >= last_discovery + UNKNOWN_NEWS_LOOK_SECONDS
                if now >= next_discovery or told:  # never slowed
                    if told:  # its partitions are followed next: fetch them then
                        self._unknown_news = False
                        self.kick()
                    await self._discover()
                    last_discovery, next_discovery = now, now + self.discover_seconds
                if now >= next_groups:
                    await self.archive_groups()
                    next_groups = now + self.groups_seconds * slower
                if not self.woken:
                    await self.step()
                    continue
                if now >= next_look or self._kicked.is_set():
                    await self.catch_up()
                    next_look = time.monotonic() + self._pacer.long_ms / 1000
                look_for_topics = (last_discovery + UNKNOWN_NEWS_LOOK_SECONDS
                                   if self._unknown_news else next_discovery)
                await self._until_kicked(min(look_for_topics, next_groups, next_look))
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
                self.kick()  # what was announced is still to archive (wherever it was)
                await asyncio.sleep(0.1)
            except Exception as error:
                self.failure = error
                log.exception("log_archiver.failed")
                raise

    async def _until_kicked(self, deadline: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(asyncio.get_running_loop().time()
                                          + max(deadline - time.monotonic(), 0)):
                await self._kicked.wait()

    async def catch_up(self) -> int:
        """Archive what was announced and everything the broker holds.

        While news keeps coming, its partitions are fetched at once (records flow: no
        time goes to asking for ends in between). Once nothing was announced since,
        the log's ends are asked, of the partitions fetched (of every partition on a
        look without news), and fetched up to. A partition is resumed only for its
        fetches and paused as soon as no news is pending (a fetch left waiting at the
        broker would hold the next news's back by its wait). Under a stream of news
        it returns after `CATCH_UP_SECONDS`, the news still pending, so that the
        loop's other work runs. Returns the records archived."""
        assert self._consumer is not None
        if not self._assigned:
            self._take_news()  # of a topic not followed yet: looked for next
            return 0
        count = 0
        touched: set[TopicPartition] = set()
        ends: dict[TopicPartition, int] | None = None
        deadline = time.monotonic() + CATCH_UP_SECONDS
        try:
            while time.monotonic() < deadline:
                if self._kicked.is_set():  # news: records are there (or fetched already)
                    fetch = self._take_news()
                    touched.update(fetch)
                    ends = None  # asked before this news: stale
                    wait_ms = NEWS_FETCH_WAITS * self.fetch_wait_ms
                elif ends is None:
                    ends = await self._ends(sorted(touched) or self._assigned)
                    continue
                elif fetch := self._behind(ends):
                    wait_ms = BEHIND_FETCH_MS  # known to hold records: as long as they take
                else:
                    return count
                self._consumer.resume(*fetch)
                count += await self.step(wait_ms)
                if not self._kicked.is_set():
                    self._pause()  # before the client sends another fetch to wait there
            if ends is not None and not self._kicked.is_set() and (
                    behind := self._behind(ends)):
                log.warning("log_archiver.catch_up_incomplete",
                            behind={f"{tp.topic}/{tp.partition}": ends[tp] for tp in behind})
            return count
        finally:
            self._pause()

    async def _ends(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        assert self._consumer is not None
        ends = await self._consumer.end_offsets(partitions)
        self._observe({(tp.topic, tp.partition): end for tp, end in ends.items()})
        return ends

    def _behind(self, ends: Mapping[TopicPartition, int]) -> list[TopicPartition]:
        return [tp for tp, end in ends.items()
                if self.archive.partition(tp.topic, tp.partition).next_offset < end]

    def _pause(self) -> None:
        if self.woken and self._consumer is not None and self._assigned:
            self._consumer.pause(*self._assigned)

    def _observe(self, highs: Mapping[tuple[str, int], int]) -> None:
        for key, high in highs.items():
            self.observed_high[key] = max(self.observed_high.get(key, 0), high)

    async def step(self, timeout_ms: int | None = None) -> int:
        """One fetch (waiting at most `timeout_ms` for records), written and synced;
        returns the records archived."""
        assert self._consumer is not None
        if not self._assigned:
            await asyncio.sleep(self.fetch_wait_ms / 1000)
            return 0
        if timeout_ms is None:
            timeout_ms = BEHIND_FETCH_MS if self.woken else max(self._pacer.wait_ms, 1) * 4
        fetched = await self._consumer.getmany(timeout_ms=timeout_ms,
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
        self._observe({(tp.topic, tp.partition): high for tp in self._assigned
                       if (high := self._consumer.highwater(tp)) is not None})
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
            if self._task is not None:  # following: a new partition waits to be told too
                self._pause()

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
        self._consumer.resume(*self._assigned)  # a partition assigned anew is not paused
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


def _archived(record: ConsumerRecord) -> ArchivedRecord:
    return ArchivedRecord(offset=record.offset, timestamp=record.timestamp, key=record.key,
                          value=record.value, headers=tuple(record.headers or ()),
                          timestamp_type=record.timestamp_type)
