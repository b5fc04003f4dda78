"""`status_snapshot` (the status page's JSON) over real read models on SQLite and
PostgreSQL: the last hour's traffic per tool, pending work, a subject's own view."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts import topics
from contracts.envelope import Envelope
from projections.approvals import approvals_model
from projections.audit import AuditModel
from projections.invocations import invocations_model
from projections.registry_table import registry_model
from projections.store import Record, apply
from tests.projection_db import *  # noqa: F403 - fixtures
from tests.projection_events import T0, invocation, published
from toolexec.usecases.status import status_snapshot

pytestmark = pytest.mark.integration


async def fold(engine: AsyncEngine, events: Sequence[Envelope]) -> None:
    offsets: dict[str, int] = {}
    log = []
    for event in events:
        topic = topics.TOPIC_OF_TYPE[event.type]
        offsets[topic] = offsets.get(topic, -1) + 1
        log.append(Record(topic, 0, offsets[topic], event, None))
    for model in (registry_model(), invocations_model(), approvals_model(), AuditModel()):
        async with engine.begin() as conn:
            await apply(model, conn, [r for r in log if r.topic in model.topics])


async def test_traffic_and_pending_work_of_the_last_hour(engine: AsyncEngine) -> None:
    started_only = invocation("inv-open", start=3000)[:4]  # requested .. execution started
    await fold(engine, [published("py_echo", "1.0.0"), published("grep", "1.0.0"),
                        *invocation("inv-old", start=-7200),  # two hours before: not charted
                        *invocation("inv-1", start=60), *invocation("inv-2", start=70),
                        *invocation("inv-3", "grep", outcome="failed", start=600),
                        *started_only])
    snapshot = await status_snapshot(engine, subject=None, now=T0 + timedelta(minutes=59))

    traffic = snapshot["traffic"]
    assert traffic["endings"] == 3 and not traffic["truncated"]
    echo, grep = traffic["tools"]["py_echo"], traffic["tools"]["grep"]
    assert len(echo) == 60 and sum(b["ended"] for b in echo) == 2
    busy = next(b for b in echo if b["ended"])
    assert busy["per_second"] == pytest.approx(2 / 60) and busy["error_rate"] == 0
    assert busy["p50_ms"] == pytest.approx(12.5)
    assert [b["error_rate"] for b in grep if b["ended"]] == [1.0]

    assert snapshot["pending"]["count"] == 1
    assert [p["invocation_id"] for p in snapshot["pending"]["invocations"]] == ["inv-open"]
    assert snapshot["pending"]["invocations"][0]["status"] == "running"
    assert {v["invocation_id"] for v in snapshot["invocations"]} == {
        "inv-old", "inv-1", "inv-2", "inv-3", "inv-open"}


async def test_a_subject_sees_only_its_own_traffic_and_work(engine: AsyncEngine) -> None:
    ada, bob = "did:example:ada", "did:example:bob"
    await fold(engine, [published("py_echo", "1.0.0"),
                        *invocation("inv-ada", subject=ada, start=60),
                        *invocation("inv-bob", subject=bob, start=70),
                        *invocation("inv-bob-open", subject=bob, start=80)[:4]])

    mine = await status_snapshot(engine, subject=ada,
                                 now=T0 + timedelta(minutes=5))
    assert [v["invocation_id"] for v in mine["invocations"]] == ["inv-ada"]
    assert mine["traffic"]["endings"] == 1 and mine["pending"]["count"] == 0
    everyone = await status_snapshot(engine, subject=None, now=T0 + timedelta(minutes=5))
    assert everyone["traffic"]["endings"] == 2 and everyone["pending"]["count"] == 1


async def test_calls_waiting_for_an_approver_are_listed_to_whom_may_see_them(
        engine: AsyncEngine) -> None:
    ada, bob = "did:example:ada", "did:example:bob"
    waiting = [e for e in invocation("inv-waits", subject=bob, start=60, approval="approve")
               if e.type != "tool.approval.decided"][:4]  # up to tool.approval.requested
    await fold(engine, [published("py_echo", "1.0.0"), *waiting,
                        *invocation("inv-approved", subject=bob, start=70, approval="approve"),
                        *invocation("inv-denied", subject=bob, start=80, approval="deny")])

    everyone = await status_snapshot(engine, subject=None, now=T0 + timedelta(minutes=5))
    assert [a["invocation_id"] for a in everyone["approvals"]] == ["inv-waits"]
    assert everyone["approvals"][0]["subject"] == bob
    assert everyone["approvals"][0]["call_hash"].startswith("sha256:")
    mine = await status_snapshot(engine, subject=ada, now=T0 + timedelta(minutes=5))
    assert mine["approvals"] == []
