"""The audit trail read model: every record of every topic, redacted, in a hash chain.

`AuditModel` appends one row per record and moves each partition's chain head in the
same transaction. `verify_audit` re-walks every chain and names the first broken
record; `audit_findings` names the records no honest pipeline wrote (facts whose
signature did not verify, facts of invocations never requested, second terminal
events); `audit_records` is the replay query shared by the CLI and compliance tooling.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import and_, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from contracts import topics
from contracts.events import TERMINAL_TYPES as TERMINAL
from projections.audit_document import GENESIS, audit_values, chain_hash
from projections.audit_document import _chain_hash as stored_text_hash
from projections.bulk_rows import insert_tuples
from projections.store import Changes, Record, upsert_sql
from projections.tables import audit_heads, audit_log, invocations, iso

NAME = "audit"
ROW_COLUMNS = ("topic", "partition", "offset", "event_id", "type", "time", "invocation_id",
               "tool_id", "document", "redactions", "prev_hash", "hash", "signature")
"""`audit_log`'s columns, the order `AuditModel` writes its row tuples in."""


Head = tuple[int, str, int]
"""A chain head: (last offset, hash, records)."""
Place = tuple[str, int]


class AuditModel:
    """Read model of the audit trail (all topics): one row per log record, keyed by its
    log position, so a record is never applied twice and needs no applied-ids row (an
    event written twice to the log is two records, and the trail shows both).

    Live, it remembers the chain heads it committed (the runner lets it only while no
    other writer can move them, and makes it `forget` whenever it re-reads its stored
    positions), so a batch reads no head back; each batch writes its rows and one
    upsert of the heads it moved. A head belongs to one place (topic, partition) and
    only a writer that moves that place's offset changes it (`place_rows`)."""

    name = NAME
    tables = (audit_log, audit_heads)
    deduplicates = True
    place_rows = True

    def __init__(self, topic_names: tuple[str, ...] = topics.ALL_TOPICS, *,
                 keep_heads: bool = False) -> None:
        self.topics = topic_names
        self._heads: dict[Place, Head] | None = {} if keep_heads else None
        self._remembered: dict[Place, Head] = {}

    def rebuilding(self) -> AuditModel:
        """A copy for one rebuild worker: it owns its partitions' chains, so their heads
        stay in memory instead of being read back every batch."""
        return AuditModel(self.topics, keep_heads=True)

    def remembered_head(self, topic: str, partition: int) -> Head | None:
        """The head of a chain as this live model committed it last, if it remembers it."""
        return self._remembered.get((topic, partition))

    def forget(self) -> None:
        """Drop the remembered heads: the store may have changed under them."""
        self._remembered.clear()

    async def prepare(self, conn: AsyncConnection, records: Sequence[Record]) -> Changes:
        if not records:
            return Changes()
        known = self._remembered if self._heads is None else self._heads
        heads: dict[Place, Head] = {}
        missing: set[Place] = set()
        for record in records:
            place = (record.topic, record.partition)
            if place not in heads and place not in missing:
                if place in known:
                    heads[place] = known[place]
                else:
                    missing.add(place)
        if missing:
            heads.update(await _heads(conn, missing))
        rows: list[tuple[object, ...]] = []
        for record in records:
            place = (record.topic, record.partition)
            head = heads.get(place)
            row = audit_values(record.envelope, topic=record.topic,
                               partition=record.partition, offset=record.offset,
                               prev_hash=GENESIS if head is None else head[1])
            rows.append((*row, record.signature))
            heads[place] = (record.offset, row[-1], 1 if head is None else head[2] + 1)
        moved = [(t, p, *head) for (t, p), head in heads.items()]

        async def write(target: AsyncConnection) -> None:
            await insert_tuples(target, audit_log, rows)
            await target.exec_driver_sql(upsert_sql(audit_heads, target.dialect.paramstyle),
                                         moved)
            if self._heads is not None:
                self._heads.update(heads)

        if self._heads is not None:
            return Changes(write)
        return Changes(write, committed=lambda: self._remembered.update(heads))


_ALL_HEADS = select(audit_heads)


async def _heads(conn: AsyncConnection, places: set[Place]) -> dict[Place, Head]:
    result = await conn.execute(_ALL_HEADS)
    return {(r.topic, r.partition): (r.last_offset, r.hash, r.records)
            for r in result if (r.topic, r.partition) in places}


# --- forgeries -----------------------------------------------------------------------------

TERMINAL_TYPES = tuple(sorted(TERMINAL))
FACT_TYPES = tuple(t for t, topic in topics.TOPIC_OF_TYPE.items() if topic == topics.INVOCATIONS)
FINDINGS_SHOWN = 100
"""Records named per kind of finding (the counts are always complete)."""


@dataclass(frozen=True, slots=True)
class FlaggedRecord:
    """One audit record a finding names."""

    topic: str
    partition: int
    offset: int
    event_id: str
    type: str
    invocation_id: str | None
    signature: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset,
                "event_id": self.event_id, "type": self.type,
                "invocation_id": self.invocation_id, "signature": self.signature}


@dataclass(frozen=True, slots=True)
class AuditFindings:
    """Records of the trail that no honest pipeline wrote, or that contradict each other:
    facts whose signature did not verify when folded (`untrusted`), facts of an
    invocation that was never requested (`orphaned`), and every terminal record of an
    invocation that has more than one (`double_terminal`). Each list names at most
    `FINDINGS_SHOWN` records; the counts are complete."""

    untrusted: tuple[FlaggedRecord, ...]
    untrusted_count: int
    orphaned: tuple[FlaggedRecord, ...]
    orphaned_count: int
    double_terminal: tuple[FlaggedRecord, ...]
    double_terminal_invocations: int

    @property
    def clean(self) -> bool:
        return not (self.untrusted_count or self.orphaned_count
                    or self.double_terminal_invocations)


_FLAGGED = (audit_log.c.topic, audit_log.c.partition, audit_log.c.offset, audit_log.c.event_id,
            audit_log.c.type, audit_log.c.invocation_id, audit_log.c.signature)
_ORDER = (audit_log.c.topic, audit_log.c.partition, audit_log.c.offset)


async def audit_findings(conn: AsyncConnection) -> AuditFindings:
    """What `AuditFindings` lists, read from the trail."""
    untrusted = and_(audit_log.c.signature.is_not(None), audit_log.c.signature != "valid")
    request, end = audit_log.alias("request"), audit_log.alias("terminal")
    requested = select(request.c.invocation_id).where(and_(
        request.c.type == "tool.invoke.requested", request.c.invocation_id.is_not(None)))
    orphaned = and_(audit_log.c.type.in_(FACT_TYPES), audit_log.c.invocation_id.is_not(None),
                    audit_log.c.invocation_id.not_in(requested.scalar_subquery()))
    doubled = (select(end.c.invocation_id)
               .where(and_(end.c.type.in_(TERMINAL_TYPES), end.c.invocation_id.is_not(None)))
               .group_by(end.c.invocation_id).having(func.count() > 1))
    doubled_ids = doubled.scalar_subquery()
    terminal = and_(audit_log.c.type.in_(TERMINAL_TYPES),
                    audit_log.c.invocation_id.in_(doubled_ids))

    async def flagged(condition: Any) -> tuple[FlaggedRecord, ...]:
        result = await conn.execute(select(*_FLAGGED).where(condition)
                                    .order_by(*_ORDER).limit(FINDINGS_SHOWN))
        return tuple(FlaggedRecord(*row) for row in result)

    async def count(condition: Any) -> int:
        return int((await conn.execute(
            select(func.count()).select_from(audit_log).where(condition))).scalar_one())

    return AuditFindings(
        untrusted=await flagged(untrusted), untrusted_count=await count(untrusted),
        orphaned=await flagged(orphaned), orphaned_count=await count(orphaned),
        double_terminal=await flagged(terminal),
        double_terminal_invocations=int((await conn.execute(
            select(func.count()).select_from(doubled.subquery()))).scalar_one()))


# --- verify ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BrokenRecord:
    """The first audit record that does not hold, and why."""

    topic: str
    partition: int
    offset: int | None
    event_id: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class AuditVerification:
    """Outcome of re-walking every chain."""

    records: int
    chains: int
    broken: BrokenRecord | None

    @property
    def ok(self) -> bool:
        return self.broken is None


VerifyProgress = Callable[[int, int], None]
"""Called as a verification goes with (records walked, records the heads announce)."""
STREAM_ROWS = 5000
"""Rows fetched per round trip when verifying or replaying."""


async def verify_audit(conn: AsyncConnection,
                       progress: VerifyProgress | None = None) -> AuditVerification:
    """Re-walk every partition's chain; stop at the first record that does not hold."""
    heads = {(r.topic, r.partition): r for r in await conn.execute(select(audit_heads))}
    places = {(r.topic, r.partition) for r in await conn.execute(
        select(audit_log.c.topic, audit_log.c.partition).distinct())}
    announced = sum(int(head.records) for head in heads.values())
    total = 0

    def walked(count: int) -> None:
        if progress is not None:
            progress(total + count, max(announced, total + count))

    for topic, partition in sorted(places | set(heads)):
        count, broken = await _verify_chain(conn, topic, partition,
                                            heads.get((topic, partition)), walked)
        total += count
        if broken is not None:
            return AuditVerification(total, len(places | set(heads)), broken)
    return AuditVerification(total, len(places | set(heads)), None)


async def _verify_chain(conn: AsyncConnection, topic: str, partition: int, head: Any,
                        walked: Callable[[int], None]) -> tuple[int, BrokenRecord | None]:
    prev, count, last = GENESIS, 0, None
    query = (select(audit_log).where(and_(audit_log.c.topic == topic,
                                          audit_log.c.partition == partition))
             .order_by(audit_log.c.offset).execution_options(yield_per=STREAM_ROWS))
    result = await conn.stream(query)
    async for rows in result.mappings().partitions():
        for row in rows:
            reason = _row_problem(row, prev)
            if reason is not None:
                await result.close()
                return count, BrokenRecord(topic, partition, row["offset"], row["event_id"],
                                           reason)
            prev, count, last = row["hash"], count + 1, row
        walked(count)
    if head is None:
        return count, BrokenRecord(topic, partition, None, None, "chain has no head record")
    if last is None or (head.last_offset, head.hash, head.records) != (
            last["offset"], last["hash"], count):
        return count, BrokenRecord(
            topic, partition, head.last_offset, None,
            f"chain ends at offset {last['offset'] if last else None} after {count} "
            f"record(s) but its head names offset {head.last_offset} after {head.records} "
            "(records deleted or head edited)")
    return count, None


def _row_problem(row: Any, prev: str) -> str | None:
    if row["prev_hash"] != prev:
        return "prev_hash does not match the previous record (a record was removed or reordered)"
    # Fast path: the stored text as the canonical document it was written as. A match
    # means the record holds (the hash covers the canonical text); anything else (even
    # whitespace added) is settled by parsing and canonicalising the document.
    if stored_text_hash(prev, row, row["document"].encode("utf-8")) == row["hash"]:
        return None
    try:
        document = orjson.loads(row["document"])
    except orjson.JSONDecodeError:
        return "document is not JSON (the record was modified)"
    if chain_hash(prev, row, document) != row["hash"]:
        return "hash does not match the record's contents (the record was modified)"
    return None


# --- replay ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """Filters of an audit replay; None means any."""

    since: datetime | None = None
    until: datetime | None = None
    type: str | None = None
    invocation_id: str | None = None
    tool_id: str | None = None
    subject: str | None = None
    """Only the records of this subject's invocations."""


def _selection(query: AuditQuery) -> list[Any]:
    conditions: list[Any] = []
    if query.since is not None:
        conditions.append(audit_log.c.time >= iso(query.since))
    if query.until is not None:
        conditions.append(audit_log.c.time < iso(query.until))
    if query.type is not None:
        conditions.append(audit_log.c.type == query.type)
    if query.invocation_id is not None:
        conditions.append(audit_log.c.invocation_id == query.invocation_id)
    if query.tool_id is not None:
        conditions.append(audit_log.c.tool_id == query.tool_id)
    if query.subject is not None:
        conditions.append(audit_log.c.invocation_id.in_(
            select(invocations.c.invocation_id).where(invocations.c.subject == query.subject)))
    return conditions


_REPLAY_ORDER = (audit_log.c.time, audit_log.c.topic, audit_log.c.partition, audit_log.c.offset)


async def audit_records(conn: AsyncConnection, query: AuditQuery) -> AsyncIterator[dict[str, Any]]:
    """Matching audit rows in time order (log order within a partition), streamed.

    Each item has the row's columns and ``event``, the parsed CloudEvent document.
    """
    statement = (select(audit_log).where(and_(True, *_selection(query)))
                 .order_by(*_REPLAY_ORDER).execution_options(yield_per=STREAM_ROWS))
    result = await conn.stream(statement)
    async for rows in result.mappings().partitions():
        for row in rows:
            item = dict(row)
            item["event"] = orjson.loads(item["document"])
            yield item


async def audit_documents(conn: AsyncConnection,
                          query: AuditQuery) -> AsyncIterator[list[str]]:
    """The documents (canonical JSON text) of the matching audit rows, in the order of
    `audit_records`, a few thousand at a time: the replay's bulk path."""
    statement = (select(audit_log.c.document).where(and_(True, *_selection(query)))
                 .order_by(*_REPLAY_ORDER).execution_options(yield_per=STREAM_ROWS))
    result = await conn.stream(statement)
    async for rows in result.scalars().partitions():
        yield list(rows)


async def count_audit_records(conn: AsyncConnection, query: AuditQuery) -> int:
    """How many audit rows match `query`."""
    statement = select(func.count()).select_from(audit_log).where(
        and_(True, *_selection(query)))
    return int((await conn.execute(statement)).scalar_one())
