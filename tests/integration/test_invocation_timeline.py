"""An invocation's timeline with its progress and checkpoints, from real read models on
SQLite and PostgreSQL: the use case, the status page's JSON and the CLI's document."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.errors import JobNotFound
from tests.integration.test_status_snapshot import fold
from tests.projection_db import *  # noqa: F403 - fixtures
from tests.projection_events import T0, invocation, published
from toolexec.usecases.status import status_snapshot
from toolexec.usecases.timeline import invocation_timeline

pytestmark = pytest.mark.integration


async def test_a_running_invocation_shows_its_latest_progress(engine: AsyncEngine) -> None:
    running = invocation("inv-run", start=60, reports=3)[:8]  # .. started, 2 reports + cps
    await fold(engine, [published("py_echo", "1.0.0"), *running])

    document = await invocation_timeline(engine, "inv-run")
    assert document["status"] == "running" and not document["ended"]
    assert document["progress"]["fraction"] == pytest.approx(2 / 3)
    assert document["progress"]["message"] == "step 2 of 3"
    assert document["checkpoints"] == {"count": 2, "bytes": 201, "stored_bytes": 81,
                                       "last_state_hash": f"sha256:{1:064x}"}
    assert [e["phase"] for e in document["timeline"]] == [
        "requested", "resolved", "decided", "started", "progress", "checkpoint", "progress",
        "checkpoint"]

    snapshot = await status_snapshot(engine, subject=None, now=T0 + timedelta(minutes=5))
    pending = snapshot["pending"]["invocations"]
    assert [p["progress"]["message"] for p in pending] == ["step 2 of 3"]


async def test_an_ended_invocation_keeps_its_timeline_to_the_terminal_event(
        engine: AsyncEngine) -> None:
    await fold(engine, invocation("inv-done", reports=2))
    document = await invocation_timeline(engine, "inv-done")
    assert document["ended"] and document["status"] == "completed"
    assert document["timeline"][-2:][0]["phase"] == "finished"
    assert document["timeline"][-1]["phase"] == "completed"
    assert document["progress"]["fraction"] == 1.0


async def test_an_unknown_or_foreign_invocation_is_not_found(engine: AsyncEngine) -> None:
    await fold(engine, invocation("inv-bob", subject="bob"))
    with pytest.raises(JobNotFound) as unknown:
        await invocation_timeline(engine, "nope")
    assert unknown.value.code == "E3702"
    with pytest.raises(JobNotFound):
        await invocation_timeline(engine, "inv-bob", subject="ann")
    assert (await invocation_timeline(engine, "inv-bob", subject="bob"))["ended"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_the_cli_prints_the_timeline_and_the_json_document(
        engine: AsyncEngine, database_url: str, tmp_path) -> None:
    import asyncio
    import json

    from tests.cli_process import toolexec

    await fold(engine, invocation("inv-run", reports=3)[:6])
    env = {"TOOLEXEC_DATABASE_URL": database_url}
    shown = await asyncio.to_thread(toolexec, "status", "inv-run", "--json", cwd=tmp_path,
                                    env=env)
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)["invocation"]
    assert document["progress"]["message"] == "step 1 of 3"
    assert document["checkpoints"]["count"] == 1

    text = await asyncio.to_thread(toolexec, "status", "inv-run", cwd=tmp_path, env=env)
    assert text.returncode == 0, text.stderr
    assert "step 1 of 3" in text.stdout and "checkpoint" in text.stdout
    assert "33%" in text.stdout

    missing = await asyncio.to_thread(toolexec, "status", "nope", "--json", cwd=tmp_path,
                                      env=env)
    assert missing.returncode == 1
    assert json.loads(missing.stdout)["error"]["code"] == "E3702"
