"""The read models of a running stack, end to end: real broker, pipeline, tools, databases."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio
from sqlalchemy import func, update

from projections.audit import AuditQuery, audit_records, verify_audit
from projections.catalog import read_models
from projections.queries import invocation_status, search_tools
from projections.rebuild import rebuild
from projections.tables import audit_log
from tests.projection_db import _fresh_postgres, postgres_server_url, snapshot  # noqa: F401
from tests.waiting import START_WAIT, WAIT
from toolexec.client import InvocationClient
from toolexec.publishing import publish_event
from toolexec.read_models import SIGNED_TOPICS, ReadModels, fact_verifier, start_read_models
from toolexec.settings import Settings
from toolexec.sources import load_builtin_sources, load_source
from toolexec.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

TOOLS = Path(__file__).parent / "tools"
ROOT = Path(__file__).parent.parent.parent


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def pipeline_database_url(request: pytest.FixtureRequest,
                          tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('db') / 'toolexec.db'}"
    return _fresh_postgres(request.getfixturevalue("postgres_server_url"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory,
                pipeline_database_url: str) -> AsyncIterator[Stack]:
    state = tmp_path_factory.mktemp("state")
    settings = Settings(state_dir=state, tools_dir=state / "none", user_tools_dir=None,
                        database_url=pipeline_database_url)
    async with Stack(settings, group_prefix=f"t{uuid.uuid4().hex[:6]}",
                     read_models_factory=start_read_models) as running:
        now = datetime.now(UTC)
        for source in load_builtin_sources() + [load_source(TOOLS / "py_echo"),
                                                load_source(TOOLS / "sh_upper")]:
            await running.publish(publish_event(source, now=now))
        async with InvocationClient(running.bootstrap, verifier=running.verifier) as client:
            running.outcomes = [  # type: ignore[attr-defined]
                await client.invoke("py_echo", {"text": "mail me at a@b.example", "times": 1}),
                await client.invoke("sh_upper", {"text": "quiet"}),
                await client.invoke("no_such_tool", {}),
            ]
        yield running


def _read_models(stack: Stack) -> ReadModels:
    handle = stack._read_models  # the factory's handle: what `up` would hold
    assert isinstance(handle, ReadModels)
    return handle


async def _cli(stack: Stack, *args: str) -> tuple[int, str]:
    """Run `toolexec ARGS` as users do, in its own process (the CLI configures logging
    for its process: in-process it would capture this test's stderr)."""
    env = {**os.environ, "TOOLEXEC_DATABASE_URL": stack.settings.database_url or "",
           "TOOLEXEC_KAFKA_BOOTSTRAP": stack.bootstrap,
           "TOOLEXEC_STATE_DIR": str(stack.settings.state_dir)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "toolexec.cli", *args, env=env, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, _ = await asyncio.wait_for(process.communicate(), START_WAIT)  # as toolexec()
    assert process.returncode is not None
    return process.returncode, stdout.decode()


async def _tamper_completed_record(handle: ReadModels) -> dict:
    async with handle.engine.begin() as conn:
        target = (await conn.execute(
            audit_log.select().where(audit_log.c.type == "tool.invoke.completed")
            .order_by(audit_log.c.topic, audit_log.c.partition, audit_log.c.offset).limit(1)
        )).mappings().first()
        await conn.execute(update(audit_log).where(
            (audit_log.c.topic == target["topic"]) & (audit_log.c.partition == target["partition"])
            & (audit_log.c.offset == target["offset"])
        ).values(document=func.replace(audit_log.c.document, "completed", "failed")))
    return dict(target)


async def test_invocations_reach_every_read_model(stack: Stack) -> None:
    handle = _read_models(stack)
    assert await handle.wait_caught_up(WAIT)
    ids = [e.data.invocation_id for e in stack.outcomes]  # type: ignore[attr-defined]
    async with handle.engine.connect() as conn:
        rows = [await invocation_status(conn, i) for i in ids]
        events = [r async for r in audit_records(conn, AuditQuery(invocation_id=ids[0]))]
        tools = await search_tools(conn, "echo")
    assert [r["status"] for r in rows] == ["completed", "completed", "failed"]
    assert rows[2]["error_code"] == "E3101" and rows[0]["version"] == "1.0.0"
    assert events[0]["type"] == "tool.invoke.requested"
    assert events[-1]["type"] == "tool.invoke.completed"
    assert not any("a@b.example" in e["document"] for e in events)
    assert [t["tool_id"] for t in tools] == ["py_echo"]


async def test_rebuild_yields_the_incremental_tables_row_by_row(stack: Stack) -> None:
    handle = _read_models(stack)
    assert await handle.wait_caught_up(WAIT)
    for name, model in read_models().items():
        before = await snapshot(handle.engine, model)
        report = await rebuild(handle.engine, model, stack.bootstrap,  # checking facts as up
                               verifier=fact_verifier(stack.settings),
                               signed_topics=SIGNED_TOPICS)
        assert report.records > 0 or name == "circuits", name  # no breaker tripped here
        assert await snapshot(handle.engine, model) == before, name


async def test_audit_verify_fails_naming_a_modified_row(stack: Stack) -> None:
    handle = _read_models(stack)
    assert await handle.wait_caught_up(WAIT)
    async with handle.engine.connect() as conn:
        assert (await verify_audit(conn)).ok
    target = await _tamper_completed_record(handle)
    async with handle.engine.connect() as conn:
        result = await verify_audit(conn)
    assert result.broken is not None
    assert (result.broken.topic, result.broken.partition, result.broken.offset) == (
        target["topic"], target["partition"], target["offset"])


async def test_cli_reads_rebuilds_and_verifies(stack: Stack, pipeline_database_url: str) -> None:
    if not pipeline_database_url.startswith("sqlite"):
        pytest.skip("the CLI is the same on both stores; one run of it is enough")
    assert await _read_models(stack).wait_caught_up(WAIT)
    invocation_id = stack.outcomes[0].data.invocation_id  # type: ignore[attr-defined]
    (search_rc, search_out), (show_rc, show_out), (ghost_rc, _), (replay_rc, replay_out) = (
        await asyncio.gather(
            _cli(stack, "search", "echo", "--json"), _cli(stack, "show", "py_echo", "--json"),
            _cli(stack, "show", "ghost", "--json"),
            _cli(stack, "audit", "replay", "--invocation", invocation_id)))
    assert search_rc == 0 and [t["tool_id"] for t in json.loads(search_out)["tools"]] == [
        "py_echo"]
    assert show_rc == 0 and json.loads(show_out)["tool"]["current_version"] == "1.0.0"
    assert ghost_rc == 1
    assert replay_rc == 0
    assert json.loads(replay_out.splitlines()[0])["type"] == "tool.invoke.requested"
    code, text = await _cli(stack, "projections", "rebuild", "--json")
    assert code == 0 and {r["name"] for r in json.loads(text)["rebuilt"]} == set(read_models())
    target = await _tamper_completed_record(_read_models(stack))
    code, text = await _cli(stack, "audit", "verify", "--json")
    broken = json.loads(text)["broken"]
    assert code == 1 and (broken["topic"], broken["offset"]) == (target["topic"],
                                                                 target["offset"])
