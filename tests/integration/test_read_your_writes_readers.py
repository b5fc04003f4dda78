"""Read-your-writes for the remaining readers, against a running `toolexec up`: the
audit commands (`replay`, `verify`, `export`), `definitions list`, `policy test` and
the pins `lock` records in processes of their own, and the status page (`GET /`, `GET /status.json`) and the gateway's list
of invocations inside `up`.

Each test writes while `up` cannot fold (stopped with SIGSTOP, or its read models'
SQLite store held by this process), shows that a reader with no wait (bound 0) does
not see the write, asks the patient readers, then lets `up` fold: they answer with
the write. The bounds only stop a hang: whenever `up` folds, the readers answer then.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aiokafka import AIOKafkaProducer

from contracts.envelope import new_envelope
from contracts.events import (
    ChainLink,
    EventData,
    InvokeRequested,
    PermissionDecided,
    ToolDefinitionPinned,
)
from contracts.fact_signature import FactSigner
from contracts.kafka_binding import encode, send_event
from tests.cli_process import clean_env, runtime, serving_up, toolexec
from tests.waiting import START_WAIT, WAIT
from toolexec import keys
from toolexec.settings import Settings

pytestmark = [pytest.mark.integration]

TOOLS = Path(__file__).parent / "tools"
PATIENT = {"TOOLEXEC_READ_YOUR_WRITES_SECONDS": str(WAIT)}
HASTY = {"TOOLEXEC_READ_YOUR_WRITES_SECONDS": "0"}
INTEGRITY = "sha256:" + "0" * 64


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cwd = tmp_path_factory.mktemp("ryw-readers")
    with serving_up(cwd, TOOLS, env={"TOOLEXEC_SANDBOX": "rlimits"}):
        yield cwd


@contextlib.contextmanager
def _up_stopped(cwd: Path) -> Iterator[None]:
    """`up` stopped (SIGSTOP) inside the block: it folds nothing until the block ends."""
    pid = runtime(cwd)["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def _write(cwd: Path, data: EventData, key: str, *, signed: bool) -> None:
    """One event straight to the log, as a front end (a request) or the pipeline (a
    signed fact) writes it."""
    event = new_envelope(data, source="urn:toolexec:test", partitionkey=key,
                         correlationid=key, id=str(uuid.uuid4()), time=datetime.now(UTC))
    record = encode(event)
    if signed:
        settings = Settings(state_dir=cwd / ".toolexec")
        record = FactSigner(keys.fact_signing_key(settings)).sign([record])[0]
    producer = AIOKafkaProducer(bootstrap_servers=runtime(cwd)["kafka_bootstrap"])
    await producer.start()
    try:
        await send_event(producer, event, record=record)
    finally:
        await producer.stop()


def _request(invocation_id: str) -> InvokeRequested:
    return InvokeRequested(invocation_id=invocation_id, tool_id="py_echo",
                           parameters={"text": "read your writes"}, requested_by="test")


def _patient(cwd: Path, *args: str) -> subprocess.Popen[str]:
    """`toolexec ARGS` started now, waiting (bounded) for `up` to fold the log's end."""
    return subprocess.Popen([sys.executable, "-m", "toolexec.cli", *args], cwd=cwd,
                            env=clean_env(PATIENT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _answer(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    stdout, stderr = process.communicate(timeout=START_WAIT)
    return process.returncode, stdout, stderr


def _replayed(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


async def test_audit_commands_read_every_event_written_before_them(workdir: Path) -> None:
    invocation_id = f"ryw-audit-{uuid.uuid4().hex[:8]}"
    export = workdir / f"{invocation_id}.jsonl"
    with _up_stopped(workdir):
        await _write(workdir, _request(invocation_id), invocation_id, signed=False)
        replay = _patient(workdir, "audit", "replay", "--invocation", invocation_id, "--json")
        verify = _patient(workdir, "audit", "verify", "--json")
        exported = _patient(workdir, "audit", "export", "--output", str(export), "--json")
        # after the patient readers started: what `up` had folded when they asked
        unfolded = await asyncio.to_thread(toolexec, "audit", "replay", "--invocation",
                                           invocation_id, "--json", cwd=workdir, env=HASTY)
        assert unfolded.returncode == 0, unfolded.stderr
        assert _replayed(unfolded.stdout) == []
        before = await asyncio.to_thread(toolexec, "audit", "verify", "--json", cwd=workdir,
                                         env=HASTY)
        records_before = json.loads(before.stdout)["records"]

    code, stdout, stderr = await asyncio.to_thread(_answer, replay)
    assert code == 0, stderr
    replayed = _replayed(stdout)
    assert replayed and replayed[0]["type"] == InvokeRequested.EVENT_TYPE
    assert replayed[0]["data"]["invocation_id"] == invocation_id

    code, stdout, stderr = await asyncio.to_thread(_answer, verify)
    assert json.loads(stdout)["records"] > records_before, stderr

    code, stdout, stderr = await asyncio.to_thread(_answer, exported)
    assert code == 0, stderr
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    assert any(line.get("document", {}).get("data", {}).get("invocation_id") == invocation_id
               for line in lines), lines[-1]


async def test_definitions_list_shows_a_pin_written_before_it(workdir: Path) -> None:
    server = f"ryw-server-{uuid.uuid4().hex[:8]}"
    pinned = ToolDefinitionPinned(server_tool_id=server, server_version="1.0.0",
                                  server_integrity=INTEGRITY, mcp_tool_name="lookup",
                                  definition_hash=INTEGRITY, definition={"name": "lookup"})
    with _up_stopped(workdir):
        await _write(workdir, pinned, server, signed=True)
        listed = _patient(workdir, "definitions", "list", "--server", server, "--json")
        unfolded = await asyncio.to_thread(toolexec, "definitions", "list", "--server", server,
                                           "--json", cwd=workdir, env=HASTY)
        assert unfolded.returncode == 0, unfolded.stderr
        assert json.loads(unfolded.stdout)["definitions"] == []

    code, stdout, stderr = await asyncio.to_thread(_answer, listed)
    assert code == 0, stderr
    [pin] = json.loads(stdout)["definitions"]
    assert (pin["server_tool_id"], pin["mcp_tool_name"], pin["state"]) == \
        (server, "lookup", "pinned")


def _decided(invocation_id: str, tool_id: str) -> PermissionDecided:
    link = ChainLink(tool_id=tool_id, version="1.0.0", integrity=INTEGRITY,
                     tool_type="script", executor=None)
    return PermissionDecided(invocation_id=invocation_id, tool_id=tool_id, version="1.0.0",
                             decision="allow", reason="test", subject="agent:test",
                             enforced=True, chain=[link])


def _looked_at(stdout: str) -> int:
    """How many recorded decisions a `policy test --json` read (replayed or left out)."""
    answer = json.loads(stdout)
    return answer["replayed"] + answer["skipped"]


async def test_policy_test_replays_a_decision_recorded_before_it(workdir: Path) -> None:
    tool_id = f"ryw_tool_{uuid.uuid4().hex[:8]}"
    candidate = workdir / f"{tool_id}.cedar"
    candidate.write_text("forbid(principal, action, resource);\n", encoding="utf-8")
    args = ("policy", "test", str(candidate), "--tool", tool_id, "--json")
    with _up_stopped(workdir):
        await _write(workdir, _decided(f"ryw-policy-{uuid.uuid4().hex[:8]}", tool_id),
                     tool_id, signed=True)
        patient = _patient(workdir, *args)
        unfolded = await asyncio.to_thread(toolexec, *args, cwd=workdir, env=HASTY)
        assert unfolded.returncode == 0, unfolded.stderr
        assert _looked_at(unfolded.stdout) == 0

    code, stdout, stderr = await asyncio.to_thread(_answer, patient)
    assert code == 0, stderr
    assert _looked_at(stdout) == 1


def _mcp_tools(root: Path, server: str, tool: str) -> Path:
    """A local MCP server manifest and one of its tools (never started: `lock` only
    resolves and verifies the chain)."""
    (root / server).mkdir(parents=True)
    (root / server / "server.py").write_text("", encoding="utf-8")
    manifest = {"tool_id": server, "version": "1.0.0", "tool_type": "mcp_server",
                "executor": "subprocess", "description": "An MCP server.",
                "config": {"transport": "stdio", "command": sys.executable,
                           "args": ["server.py"]}}
    (root / server / "tool.yaml").write_text(yaml.safe_dump(manifest), encoding="utf-8")
    leaf = {"tool_id": tool, "version": "1.0.0", "tool_type": "mcp_tool",
            "executor": server, "description": "Echo through the server.",
            "config": {"mcp_tool_name": "echo"},
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}
    (root / f"{tool}.yaml").write_text(yaml.safe_dump(leaf), encoding="utf-8")
    return root


async def test_lock_records_a_definition_pinned_before_it(workdir: Path) -> None:
    suffix = uuid.uuid4().hex[:8]
    server, tool = f"ryw_mcp_{suffix}", f"ryw_echo_{suffix}"
    tools = _mcp_tools(workdir / f"tools-{suffix}", server, tool)
    definition_hash = "sha256:" + uuid.uuid4().hex * 2
    pinned = ToolDefinitionPinned(server_tool_id=server, server_version="1.0.0",
                                  server_integrity=INTEGRITY, mcp_tool_name="echo",
                                  definition_hash=definition_hash, definition={"name": "echo"})
    args = ("lock", tool, "--tools", str(tools), "--json")
    with _up_stopped(workdir):
        await _write(workdir, pinned, server, signed=True)
        patient = _patient(workdir, *args)
        unfolded = await asyncio.to_thread(toolexec, *args, cwd=workdir, env=HASTY)
        assert unfolded.returncode == 0, unfolded.stderr
        assert "definition_hash" not in json.loads(unfolded.stdout)["resolved_chain"][0]

    code, stdout, stderr = await asyncio.to_thread(_answer, patient)
    assert code == 0, stderr
    assert json.loads(stdout)["resolved_chain"][0]["definition_hash"] == definition_hash


@contextlib.contextmanager
def _store_held(cwd: Path) -> Iterator[sqlite3.Connection]:
    """`up`'s read-model store with its write lock held by this process: no runner of
    `up` commits a fold until the block ends, while its gateway still reads (WAL)."""
    held = sqlite3.connect(cwd / ".toolexec" / "toolexec.db", isolation_level=None,
                           timeout=WAIT)
    try:
        held.execute("BEGIN IMMEDIATE")
        yield held
    finally:
        held.close()  # rolls back: the lock goes


async def test_the_status_page_and_the_list_show_an_invocation_written_before_asked(
        workdir: Path) -> None:
    invocation_id = f"ryw-page-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=runtime(workdir)["gateway_url"],
                                 timeout=WAIT) as http:
        with _store_held(workdir) as held:
            await _write(workdir, _request(invocation_id), invocation_id, signed=False)
            page = asyncio.create_task(http.get("/"))
            snapshot = asyncio.create_task(http.get("/status.json"))
            listed = asyncio.create_task(http.get("/v1/invocations", params={"limit": 1000}))
            # after they were asked: what the read model holds (nothing folded since)
            assert held.execute("SELECT count(*) FROM invocations WHERE invocation_id = ?",
                                (invocation_id,)).fetchone() == (0,)
            assert (await http.get("/health")).status_code in (200, 503)
        shown, refreshed, answer = await page, await snapshot, await listed
    assert shown.status_code == 200
    assert f'data-invocation="{invocation_id}"' in shown.text
    assert refreshed.status_code == 200
    assert invocation_id in {row["invocation_id"] for row in refreshed.json()["invocations"]}
    assert answer.status_code == 200
    assert invocation_id in {row["invocation_id"] for row in answer.json()["invocations"]}

