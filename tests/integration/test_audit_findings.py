"""`audit_findings` on SQLite and PostgreSQL: facts whose signature did not verify, facts
of invocations nobody requested, and every terminal event of an invocation with two;
nothing for an honest log."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts import topics
from contracts.envelope import Envelope
from contracts.errors import ErrorInfo
from contracts.events import InvokeFailed
from projections.audit import AuditModel, audit_findings, verify_audit
from projections.store import Record, apply
from tests.projection_db import *  # noqa: F403 - fixtures
from tests.projection_events import envelope, invocation, published

pytestmark = pytest.mark.integration


def records(events: Sequence[Envelope], verdicts: dict[str, str] | None = None) -> list[Record]:
    """`events` as log records, one partition per topic; facts get the verdict named
    for their id in `verdicts`, "valid" otherwise (requests and publications: none)."""
    out, offsets = [], {}
    for event in events:
        topic = topics.TOPIC_OF_TYPE[event.type]
        offsets[topic] = offsets.get(topic, -1) + 1
        signed = topic in (topics.INVOCATIONS, topics.CIRCUITS)
        verdict = (verdicts or {}).get(event.id, "valid") if signed else None
        out.append(Record(topic, 0, offsets[topic], event, verdict))
    return out


async def findings_of(engine: AsyncEngine, log: list[Record]):  # noqa: ANN201
    async with engine.begin() as conn:
        await apply(AuditModel(), conn, log)
    async with engine.connect() as conn:
        assert (await verify_audit(conn)).ok  # marked records still chain
        return await audit_findings(conn)


async def test_an_honest_log_has_no_findings(engine: AsyncEngine) -> None:
    log = [published("grep", "1.0.0"), *invocation("inv-1"),
           *invocation("inv-2", outcome="failed"), *invocation("inv-3", outcome="denied")]
    findings = await findings_of(engine, records(log))
    assert findings.clean
    assert (findings.untrusted_count, findings.orphaned_count,
            findings.double_terminal_invocations) == (0, 0, 0)


async def test_forged_orphaned_and_doubled_facts_are_each_named(engine: AsyncEngine) -> None:
    honest = invocation("inv-1")
    forged_end = envelope(InvokeFailed(invocation_id="inv-1", tool_id="py_echo",
                                       version="1.0.0", stage="execute",
                                       error=ErrorInfo(code="E3401", message="forged")),
                          "inv-1", id="forged-end")
    nobody_asked = invocation("inv-ghost")[1:]  # every fact, no request
    altered = invocation("inv-2")
    log = records([*honest, forged_end, *nobody_asked, *altered],
                  {"forged-end": "unsigned", altered[3].id: "invalid"})
    findings = await findings_of(engine, log)

    assert not findings.clean
    assert [(r.event_id, r.signature) for r in findings.untrusted] == [
        ("forged-end", "unsigned"), (altered[3].id, "invalid")]  # in log order
    assert findings.untrusted_count == 2
    assert {r.invocation_id for r in findings.orphaned} == {"inv-ghost"}
    assert findings.orphaned_count == len(nobody_asked)
    assert findings.double_terminal_invocations == 1
    assert [(r.invocation_id, r.type, r.signature) for r in findings.double_terminal] == [
        ("inv-1", "tool.invoke.completed", "valid"),
        ("inv-1", "tool.invoke.failed", "unsigned")]
