"""Export of the audit trail and its offline verification: a round trip through the
audit model on SQLite, then every way of tampering with the file."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts import topics
from contracts.envelope import Envelope
from contracts.fact_signature import key_id
from projections.audit import AuditModel
from projections.audit_document import GENESIS, audit_entry, chain_hash
from projections.audit_export import (
    ExportBroken,
    ExportWriter,
    export_audit,
    verify_export,
)
from projections.database import make_engine, migrate
from projections.store import Record
from projections.tables import audit_heads, audit_log
from tests.projection_events import at, circuit, invocation, published

KEY = Ed25519PrivateKey.generate()
EXPORTED_AT = "2026-11-25T12:00:00.000000Z"


def _records() -> list[Record]:
    """A small log over three topics, the invocations spread over two partitions."""
    out: list[Record] = []
    offsets: dict[tuple[str, int], int] = {}

    def add(topic: str, partition: int, envelope: Envelope, signature: str | None) -> None:
        offset = offsets.get((topic, partition), 0)
        offsets[(topic, partition)] = offset + 1
        out.append(Record(topic, partition, offset, envelope, signature))

    add(topics.REGISTRY, 0, published("grep", "1.0.0"), None)
    add(topics.CIRCUITS, 0, circuit("api.example", "closed", "open", when=at(1)), "valid")
    for n in range(6):
        for envelope in invocation(f"inv-{n}", outcome=("completed", "failed", "denied")[n % 3],
                                   start=n):
            add(topics.INVOCATIONS, n % 2, envelope, "valid")
    return out


@pytest_asyncio.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    created = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'audit.db'}")
    await migrate(created)
    model = AuditModel()
    records = _records()
    for start in range(0, len(records), 7):  # several batches: heads carried over
        async with created.begin() as conn:
            changes = await model.prepare(conn, records[start:start + 7])
            await changes.write(conn)
    yield created
    await created.dispose()


async def _export(engine: AsyncEngine, key: Ed25519PrivateKey | None = KEY) -> list[bytes]:
    async with engine.connect() as conn:
        blob = b"".join([block async for block in export_audit(conn, EXPORTED_AT,
                                                                 signing_key=key)])
    return blob.splitlines(keepends=True)


def _edit(line: bytes, **changes: Any) -> bytes:
    return orjson.dumps({**orjson.loads(line), **changes}) + b"\n"


def _problem(lines: Sequence[bytes], key: Ed25519PrivateKey | None = KEY) -> Any:
    result = verify_export(lines, [key.public_key()] if key else [])
    assert not result.ok
    return result.problem


async def test_a_signed_export_verifies_offline_with_the_public_key(engine: AsyncEngine) -> None:
    lines = await _export(engine)
    record_count = len(_records())
    assert len(lines) == record_count + 2
    assert orjson.loads(lines[0])["format"] == "toolexec-audit-export/1"
    last = orjson.loads(lines[-1])
    assert last["kid"] == key_id(KEY.public_key())
    assert last["checkpoint"]["records"] == record_count
    assert {(c["topic"], c["partition"]) for c in last["checkpoint"]["chains"]} == {
        (topics.REGISTRY, 0), (topics.CIRCUITS, 0), (topics.INVOCATIONS, 0),
        (topics.INVOCATIONS, 1)}
    async with engine.connect() as conn:
        stored = {(r.topic, r.partition, r.offset): r for r in await conn.execute(select(audit_log))}
    for line in lines[1:-1]:  # every record as stored, with the verdict as information
        row = orjson.loads(line)
        kept = stored[(row["topic"], row["partition"], row["offset"])]
        assert (row["hash"], row["prev_hash"], row["signature"]) == (
            kept.hash, kept.prev_hash, kept.signature)
        assert orjson.loads(kept.document) == row["document"]

    result = verify_export(lines, [KEY.public_key()])
    assert result.ok, result.problem
    assert (result.records, result.chains, result.signature_checked) == (record_count, 4, True)
    assert result.kid == key_id(KEY.public_key())


async def test_an_unsigned_export_verifies_without_a_key_but_not_with_one(
        engine: AsyncEngine) -> None:
    lines = await _export(engine, key=None)
    result = verify_export(lines)
    assert result.ok and not result.signature_checked and result.kid is None
    problem = _problem(lines)
    assert problem.line == len(lines)
    assert "not signed" in problem.reason


async def test_a_changed_document_is_named_by_line_and_position(engine: AsyncEngine) -> None:
    lines = await _export(engine)
    row = orjson.loads(lines[5])
    row["document"]["data"]["marker"] = "edited"
    lines[5] = orjson.dumps(row) + b"\n"
    problem = _problem(lines)
    assert (problem.line, problem.topic, problem.partition, problem.offset) == (
        6, row["topic"], row["partition"], row["offset"])
    assert "hash does not match" in problem.reason


async def test_a_removed_record_breaks_its_chain_at_the_next_one(engine: AsyncEngine) -> None:
    lines = await _export(engine)
    following = orjson.loads(lines[6])
    del lines[5]
    problem = _problem(lines)
    assert (problem.line, problem.offset) == (6, following["offset"])
    assert "prev_hash" in problem.reason


async def test_a_removed_last_record_of_a_chain_fails_the_digest(engine: AsyncEngine) -> None:
    lines = await _export(engine)
    del lines[-2]  # the newest record of the last chain: what is left walks
    problem = _problem(lines)
    assert problem.line == len(lines)
    assert "digest" in problem.reason


async def test_reordered_records_are_caught(engine: AsyncEngine) -> None:
    lines = await _export(engine)
    lines[5], lines[6] = lines[6], lines[5]
    problem = _problem(lines)
    assert problem.line == 6 and "prev_hash" in problem.reason


async def test_an_edited_checkpoint_is_caught(engine: AsyncEngine) -> None:
    lines = await _export(engine)
    last = orjson.loads(lines[-1])
    last["checkpoint"]["chains"][0]["records"] -= 1
    lines[-1] = orjson.dumps(last) + b"\n"
    problem = _problem(lines)
    assert problem.line == len(lines) and "checkpoint names offset" in problem.reason
    assert problem.topic == last["checkpoint"]["chains"][0]["topic"]


async def test_a_consistent_forgery_fails_only_at_the_signature(engine: AsyncEngine) -> None:
    """Rewrite a record and recompute every hash, the digest and the checkpoint: all
    that is left to catch it is the signature the forger cannot make."""
    lines = await _export(engine)
    rows = [orjson.loads(line) for line in lines[1:-1]]
    rows[3]["document"]["data"]["marker"] = "forged"
    writer, prev = ExportWriter(EXPORTED_AT), {}
    forged = [writer.header()]
    for row in rows:
        place = (row["topic"], row["partition"])
        row["prev_hash"] = prev.get(place, GENESIS)
        row["hash"] = chain_hash(row["prev_hash"], row, row["document"])
        prev[place] = row["hash"]
        forged.append(writer.record({**row, "document": orjson.dumps(row["document"]).decode()}))
    original = orjson.loads(lines[-1])
    checkpoint = orjson.loads(writer.checkpoint())
    forged.append(orjson.dumps({**checkpoint, "kid": original["kid"],
                                "signature": original["signature"]}) + b"\n")
    assert verify_export(forged).ok  # without the key, only integrity is checked
    problem = _problem(forged)
    assert problem.line == len(forged) and "signature does not verify" in problem.reason


async def test_a_wrong_key_is_named(engine: AsyncEngine) -> None:
    lines = await _export(engine)
    other = Ed25519PrivateKey.generate()
    problem = _problem(lines, other)
    assert key_id(KEY.public_key()) in problem.reason
    assert key_id(other.public_key()) in problem.reason


async def test_a_truncated_export_is_caught(engine: AsyncEngine) -> None:
    lines = await _export(engine)
    assert "not a checkpoint" in _problem(lines[:-1]).reason
    assert "newline" in _problem([*lines[:-1], lines[-1].rstrip(b"\n")]).reason
    assert "empty" in _problem([]).reason
    assert "no checkpoint" in _problem(lines[:1]).reason
    assert "checkpoint before the last line" in _problem([*lines, lines[3]]).reason


async def test_a_broken_trail_is_not_exported(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(update(audit_log).where(audit_log.c.offset == 2).values(
            document=audit_log.c.document + " "))  # whitespace: still the same record
    assert verify_export(await _export(engine), [KEY.public_key()]).ok
    async with engine.begin() as conn:
        await conn.execute(update(audit_log).where(audit_log.c.offset == 3).values(
            document=audit_log.c.document.op("||")('{"x": 1}')))
    with pytest.raises(ExportBroken, match="not JSON"):
        await _export(engine)


async def test_a_deleted_newest_record_is_not_exported(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(delete(audit_log).where(
            (audit_log.c.topic == topics.CIRCUITS) & (audit_log.c.offset == 0)))
    with pytest.raises(ExportBroken, match="records deleted or head edited"):
        await _export(engine)


async def test_a_chain_whose_head_was_deleted_is_not_exported(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(delete(audit_heads).where(audit_heads.c.topic == topics.REGISTRY))
    with pytest.raises(ExportBroken, match="no head"):
        await _export(engine)


# --- property: any log exports and verifies; any edit of a record is caught ----------------

_events = st.lists(st.tuples(st.sampled_from([(topics.INVOCATIONS, 0), (topics.INVOCATIONS, 1),
                                              (topics.REGISTRY, 0)]),
                             st.integers(0, 2), st.text(max_size=20)),
                   min_size=0, max_size=25)


def _pure_export(events: list[tuple[tuple[str, int], int, str]],
                 key: Ed25519PrivateKey) -> list[bytes]:
    heads: dict[tuple[str, int], tuple[int, str]] = {}
    rows = []
    for n, (place, kind, text) in enumerate(events):
        envelope = invocation(f"i{n}", parameters={"text": text},
                              outcome=("completed", "failed", "denied")[kind])[kind]
        offset, prev = heads.get(place, (-1, GENESIS))
        offset += 1 + kind  # gaps in offsets happen (compaction, transactions)
        entry = audit_entry(envelope, topic=place[0], partition=place[1], offset=offset,
                            prev_hash=prev)
        heads[place] = (offset, entry.hash)
        rows.append({**entry.as_row(), "signature": None})
    rows.sort(key=lambda r: (r["topic"], r["partition"], r["offset"]))
    writer = ExportWriter(EXPORTED_AT)
    return [writer.header(), *(writer.record(row) for row in rows), writer.checkpoint(key)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_events, data=st.data())
def test_any_log_round_trips_and_any_record_edit_is_caught(
        events: list[tuple[tuple[str, int], int, str]], data: st.DataObject) -> None:
    lines = _pure_export(events, KEY)
    assert verify_export(lines, [KEY.public_key()]).ok
    if not events:
        return
    index = data.draw(st.integers(1, len(events)))
    name = data.draw(st.sampled_from(["event_id", "type", "time", "tool_id", "redactions",
                                      "offset", "document"]))
    row = orjson.loads(lines[index])
    row[name] = {"changed": True} if name == "document" else (
        row[name] + 1 if isinstance(row[name], int) else f"{row[name]}x")
    lines[index] = orjson.dumps(row) + b"\n"
    problem = verify_export(lines, [KEY.public_key()]).problem
    assert problem is not None and problem.line == index + 1
