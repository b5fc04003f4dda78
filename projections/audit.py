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
from sqlalchemy import and_, delete, func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from contracts import topics
from contracts.events import TERMINAL_TYPES as TERMINAL
from projections.audit_document import GENESIS, audit_entry, chain_hash
from projections.audit_document import _chain_hash as stored_text_hash
from projections.bulk_rows import insert_tuples
from projections.store import Changes, Record
from projections.tables import audit_heads, audit_log, invocations, iso

NAME = "audit"
ROW_COLUMNS = ("topic", "partition", "offset", "event_id", "type", "time", "invocation_id",
               "tool_id", "document", "redactions", "prev_hash", "hash", "signature")
"""`audit_log`'s columns, the order `AuditModel` writes its row tuples in."""


class AuditModel:
    """Read model of the audit trail (all topics): one row per log record, keyed by its
    log position, so a record is never applied twice and needs no applied-ids row (an
    event written twice to the log is two records, and the trail shows both)."""

    name = NAME
    tables = (audit_log, audit_heads)
    deduplicates = True

    def __init__(self, topic_names: tuple[str, ...] = topics.ALL_TOPICS, *,
                 keep_heads: bool = False) -> None:
        self.topics = topic_names
        self._heads: dict[tuple[str, int], tuple[int, str, int]] | None = (
            {} if keep_heads else None)

    def rebuilding(self) -> AuditModel:
        """A copy for one rebuild worker: it owns its partitions' chains, so their heads
        stay in memory instead of being read back every batch."""
        return AuditModel(self.topics, keep_heads=True)

    async def prepare(self, conn: AsyncConnection, records: Sequence[Record]) -> Changes:
        if not records:
            return Changes()
        places = {(r.topic, r.partition) for r in records}
        heads = self._heads
        if heads is None or not places <= heads.keys():
            heads = {**(heads or {}), **await _heads(conn, places - (heads or {}).keys())}
        heads = dict(heads)
        rows: list[tuple[object, ...]] = []
        for record in records:
            place = (record.topic, record.partition)
            count = heads[place][2] if place in heads else 0
            prev = heads[place][1] if place in heads else GENESIS
            entry = audit_entry(record.envelope, topic=record.topic,
                                partition=record.partition, offset=record.offset,
                                prev_hash=prev)
            rows.append((entry.topic, entry.partition, entry.offset, entry.event_id,
                         entry.type, entry.time, entry.invocation_id, entry.tool_id,
                         entry.document, entry.redactions, entry.prev_hash, entry.hash,
                         record.signature))
            heads[place] = (record.offset, entry.hash, count + 1)
        touched = sorted(places)

        async def write(target: AsyncConnection) -> None:
            await insert_tuples(target, audit_log, rows)
            await target.execute(delete(audit_heads).where(
                tuple_(audit_heads.c.topic, audit_heads.c.partition).in_(touched)))
            await insert_tuples(target, audit_heads, [
                (t, p, heads[(t, p)][0], heads[(t, p)][1], heads[(t, p)][2])
                for t, p in touched])
            if self._heads is not None:
                self._heads.update(heads)

        return Changes(write)


async def _heads(conn: AsyncConnection,
                 places: set[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, str, int]]:
    if not places:
        return {}
    result = await conn.execute(select(audit_heads))
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
