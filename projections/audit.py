"""The audit trail read model: every record of every topic, redacted, in a hash chain.

`AuditModel` appends one row per record and moves each partition's chain head in the
same transaction. `verify_audit` re-walks every chain and names the first broken
record; `audit_records` is the replay query shared by the CLI and compliance tooling.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, insert, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from contracts import topics
from projections.audit_document import GENESIS, AuditEntry, audit_entry, chain_hash
from projections.store import Record
from projections.tables import audit_heads, audit_log, invocations, iso

NAME = "audit"


class AuditModel:
    """Read model of the audit trail (all topics)."""

    name = NAME
    tables = (audit_log, audit_heads)

    def __init__(self, topic_names: tuple[str, ...] = topics.ALL_TOPICS) -> None:
        self.topics = topic_names

    async def apply(self, conn: AsyncConnection, records: Sequence[Record]) -> None:
        if not records:
            return
        heads = await _heads(conn, {(r.topic, r.partition) for r in records})
        entries: list[AuditEntry] = []
        for record in records:
            place = (record.topic, record.partition)
            last_offset, prev, count = heads.get(place, (-1, GENESIS, 0))
            entry = audit_entry(record.envelope, topic=record.topic,
                                partition=record.partition, offset=record.offset,
                                prev_hash=prev)
            entries.append(entry)
            heads[place] = (record.offset, entry.hash, count + 1)
        await conn.execute(insert(audit_log), [e.as_row() for e in entries])
        touched = sorted({(e.topic, e.partition) for e in entries})
        await conn.execute(delete(audit_heads).where(
            tuple_(audit_heads.c.topic, audit_heads.c.partition).in_(touched)))
        await conn.execute(insert(audit_heads), [
            {"topic": t, "partition": p, "last_offset": heads[(t, p)][0],
             "hash": heads[(t, p)][1], "records": heads[(t, p)][2]} for t, p in touched])


async def _heads(conn: AsyncConnection,
                 places: set[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, str, int]]:
    result = await conn.execute(select(audit_heads))
    return {(r.topic, r.partition): (r.last_offset, r.hash, r.records)
            for r in result if (r.topic, r.partition) in places}


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


async def verify_audit(conn: AsyncConnection) -> AuditVerification:
    """Re-walk every partition's chain; stop at the first record that does not hold."""
    heads = {(r.topic, r.partition): r for r in await conn.execute(select(audit_heads))}
    places = {(r.topic, r.partition) for r in await conn.execute(
        select(audit_log.c.topic, audit_log.c.partition).distinct())}
    total = 0
    for topic, partition in sorted(places | set(heads)):
        walked, broken = await _verify_chain(conn, topic, partition, heads.get((topic, partition)))
        total += walked
        if broken is not None:
            return AuditVerification(total, len(places | set(heads)), broken)
    return AuditVerification(total, len(places | set(heads)), None)


async def _verify_chain(conn: AsyncConnection, topic: str, partition: int,
                        head: Any) -> tuple[int, BrokenRecord | None]:
    prev, count, last = GENESIS, 0, None
    query = (select(audit_log).where(and_(audit_log.c.topic == topic,
                                          audit_log.c.partition == partition))
             .order_by(audit_log.c.offset))
    result = await conn.stream(query)
    async for row in result.mappings():
        reason = _row_problem(row, prev)
        if reason is not None:
            await result.close()
            return count, BrokenRecord(topic, partition, row["offset"], row["event_id"], reason)
        prev, count, last = row["hash"], count + 1, row
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
    try:
        document = json.loads(row["document"])
    except ValueError:
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


async def audit_records(conn: AsyncConnection, query: AuditQuery) -> AsyncIterator[dict[str, Any]]:
    """Matching audit rows in time order (log order within a partition), streamed.

    Each item has the row's columns and ``event``, the parsed CloudEvent document.
    """
    conditions = []
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
    statement = (select(audit_log).where(and_(True, *conditions))
                 .order_by(audit_log.c.time, audit_log.c.topic, audit_log.c.partition,
                           audit_log.c.offset))
    result = await conn.stream(statement)
    async for row in result.mappings():
        item = dict(row)
        item["event"] = json.loads(item["document"])
        yield item
