"""Progress of a running tool reaches every reader before its result: an HTTP poller
(`GET /v1/invocations/{id}`), an MCP client (progress notifications on `tools/call`),
the MCP `start` / `status` pair, against a real `toolexec up`.

Two sources of progress:
- facts written to the log the way the pipeline writes them (signed with the state
  directory's fact key) while the tool runs: the read side alone, proven now;
- the tool's own report lines (TOOLEXEC_REPORT_FILE), which the executor turns into
  `tool.execution.progressed`: the whole path, tool to reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import mcp_types
import pytest
from aiokafka import AIOKafkaProducer
from mcp import ClientSession, StdioServerParameters, stdio_client

from contracts.envelope import new_envelope
from contracts.events import ExecutionProgressed
from contracts.fact_signature import FactSigner
from contracts.kafka_binding import encode, send_event
from tests.cli_process import clean_env, runtime, serving_up, toolexec
from tests.waiting import WAIT
from toolexec import keys
from toolexec.settings import Settings

pytestmark = [pytest.mark.integration]

TOOLS = Path(__file__).parent / "progress_tools"
STEPS = 3


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cwd = tmp_path_factory.mktemp("progress")
    with serving_up(cwd, TOOLS, env={"TOOLEXEC_SANDBOX": "rlimits"}):
        yield cwd


@contextlib.asynccontextmanager
async def _mcp(cwd: Path, env: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "toolexec.cli", "mcp"],
                                   cwd=cwd, env=clean_env({"TOOLEXEC_SANDBOX": "rlimits",
                                                           **(env or {})}))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def _structured(result: mcp_types.CallToolResult) -> Any:
    assert not result.is_error, result.structured_content
    return result.structured_content


async def _running_invocation(gateway: str, release: Path) -> str:
    """The id of the running `reporter` invocation waiting on `release`."""
    async with httpx.AsyncClient(base_url=gateway, timeout=WAIT) as http:
        for _ in range(600):
            listed = (await http.get("/v1/invocations", params={
                "tool": "reporter", "status": "running"})).json()["invocations"]
            for row in listed:
                shown = (await http.get("/v1/audit", params={
                    "invocation": row["invocation_id"], "type": "tool.invoke.requested"})).json()
                records = shown.get("records", [])
                if records and records[0]["event"]["data"]["parameters"].get("release") \
                        == str(release):
                    return str(row["invocation_id"])
            await asyncio.sleep(0.2)
    pytest.fail("the reporter invocation never showed as running")


async def _progress_seen(gateway: str, invocation_id: str, message: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=gateway, timeout=WAIT) as http:
        for _ in range(600):
            view = (await http.get(f"/v1/invocations/{invocation_id}")).json()
            if view["progress"] and view["progress"]["message"] == message:
                assert view["status"] == "running"  # seen before the result
                return dict(view)
            await asyncio.sleep(0.2)
    pytest.fail(f"progress {message!r} never reached GET /v1/invocations/{invocation_id}")


async def _write_progress(cwd: Path, invocation_id: str) -> None:
    """Progress facts as the pipeline writes them: signed with its fact key."""
    settings = Settings(state_dir=cwd / ".toolexec")
    signer = FactSigner(keys.fact_signing_key(settings))
    producer = AIOKafkaProducer(bootstrap_servers=runtime(cwd)["kafka_bootstrap"])
    await producer.start()
    try:
        for sequence in range(STEPS):
            data = ExecutionProgressed(invocation_id=invocation_id, attempt=1,
                                       sequence=sequence, fraction=(sequence + 1) / STEPS,
                                       message=f"step {sequence + 1} of {STEPS}")
            event = new_envelope(data, source="urn:toolexec:test", partitionkey=invocation_id,
                                 correlationid=invocation_id, causationid=f"test-{sequence}",
                                 time=datetime.now(UTC))
            await send_event(producer, event, record=signer.sign([encode(event)])[0])
    finally:
        await producer.stop()


async def _follow_one_run(cwd: Path, write_facts: bool) -> None:
    gateway = runtime(cwd)["gateway_url"]
    release = cwd / f"release-{write_facts}"
    try:
        await _follow(cwd, gateway, release, write_facts)
    finally:
        release.touch()  # whatever happened, the tool ends


async def _follow(cwd: Path, gateway: str, release: Path, write_facts: bool) -> None:
    notes: list[tuple[float, float | None, str | None]] = []

    async def noted(progress: float, total: float | None, message: str | None) -> None:
        notes.append((progress, total, message))

    async with _mcp(cwd) as session:
        call = asyncio.create_task(session.call_tool(
            "execute", {"action": "run", "tool_id": "reporter",
                        "parameters": {"steps": STEPS, "release": str(release),
                                       "quiet": write_facts}},
            progress_callback=noted))
        invocation_id = await _running_invocation(gateway, release)
        if write_facts:
            await _write_progress(cwd, invocation_id)
        final = f"step {STEPS} of {STEPS}"
        view = await _progress_seen(gateway, invocation_id, final)
        assert view["progress"]["fraction"] == pytest.approx(1.0)

        status = _structured(await session.call_tool(
            "execute", {"action": "status", "invocation_id": invocation_id}))
        assert status["status"] == "running" and status["progress"]["message"] == final
        assert "progress" in [e["phase"] for e in status["timeline"]]

        for _ in range(1200):  # at least WAIT seconds
            if any(message and message.endswith(final) for _, _, message in notes):
                break
            await asyncio.sleep(0.1)
        assert notes, "no MCP progress notification"
        assert [p for p, _, _ in notes] == sorted({p for p, _, _ in notes})  # increasing
        assert notes[-1][2] == f"100% {final}"
        assert not call.done()  # every notification came while the tool ran

        release.touch()
        ran = _structured(await call)
        assert ran["result"] == {"steps": STEPS}


async def test_progress_written_to_the_log_reaches_http_and_mcp(workdir: Path) -> None:
    await _follow_one_run(workdir, write_facts=True)


async def test_a_tool_s_report_lines_reach_http_and_mcp(workdir: Path) -> None:
    await asyncio.wait_for(_follow_one_run(workdir, write_facts=False), timeout=300)


async def test_start_then_status_until_the_result(workdir: Path) -> None:
    """Read-your-writes across processes: the request written by one `toolexec mcp`,
    the first status asked of another (and of `toolexec status`) knows it. `up` is
    stopped (SIGSTOP) from before the request until the status is asked, so it cannot
    have folded the request: the reader waits for it. With a short bound and `up`
    still stopped, the wait ends and the reader answers what the read model holds."""
    release = workdir / "release-start"
    up = runtime(workdir)["pid"]
    # the bound only stops a hang: on a loaded machine `up` may fold seconds later
    patient = {"TOOLEXEC_READ_YOUR_WRITES_SECONDS": str(WAIT)}
    os.kill(up, signal.SIGSTOP)
    try:
        async with _mcp(workdir) as starter:
            started = _structured(await starter.call_tool("execute", {
                "action": "start", "tool_id": "reporter",
                "parameters": {"steps": 1, "release": str(release)}}))
        invocation_id = started["invocation_id"]
        async with _mcp(workdir, patient) as session, \
                _mcp(workdir, {"TOOLEXEC_READ_YOUR_WRITES_SECONDS": "1"}) as hasty:
            asked = asyncio.create_task(session.call_tool(
                "execute", {"action": "status", "invocation_id": invocation_id}))
            unfolded = await hasty.call_tool(
                "execute", {"action": "status", "invocation_id": invocation_id})
            assert unfolded.is_error, unfolded.structured_content
            assert unfolded.structured_content["error"]["code"] == "E3702"
            os.kill(up, signal.SIGCONT)
            first = _structured(await asked)
            assert first["invocation_id"] == invocation_id and not first["ended"], first
            shown = await asyncio.to_thread(toolexec, "status", invocation_id, "--json",
                                            cwd=workdir, env=patient)
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["invocation"]["invocation_id"] == invocation_id
            release.touch()
            status = first
            for _ in range(600):
                status = _structured(await session.call_tool(
                    "execute", {"action": "status", "invocation_id": invocation_id}))
                if status["ended"]:
                    break
                await asyncio.sleep(0.2)
            assert status["status"] == "completed" and status["result"] == {"steps": 1}
            assert status["timeline"][-1]["phase"] == "completed"

            unknown = await session.call_tool("execute", {"action": "status",
                                                          "invocation_id": "nope"})
            assert unknown.is_error
            assert unknown.structured_content["error"]["code"] == "E3702"
    finally:
        os.kill(up, signal.SIGCONT)
