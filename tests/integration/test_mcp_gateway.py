"""`toolexec mcp` spoken to by the MCP SDK's own client, as an agent would: over stdio
(the gateway spawned as a process) and over streamable HTTP, against a running
`toolexec up` serving the example tools."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import mcp_types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.cli_process import REPO, clean_env, serving_up
from tests.waiting import WAIT
from toolexec.usecases.authoring import source_integrity

pytestmark = [pytest.mark.integration]

EXAMPLES = REPO / "examples" / "tools"
GATEWAY_TOOLS = {"search", "load", "execute", "approval", "help"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A project directory with a running `toolexec up` serving the example tools."""
    cwd = tmp_path_factory.mktemp("project")
    with serving_up(cwd, EXAMPLES, env={"TOOLEXEC_SANDBOX": "rlimits"}):
        yield cwd


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def http_gateway(workdir: Path) -> Iterator[str]:
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "toolexec.cli", "mcp", "--http",
                                "--port", str(port), "--tools", str(EXAMPLES)],
                               cwd=workdir, env=clean_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + WAIT
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"toolexec mcp --http did not start: {process.communicate()[1]}")
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.asynccontextmanager
async def _stdio_session(workdir: Path) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "toolexec.cli", "mcp"],
                                   cwd=workdir, env=clean_env())
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def _http_session(url: str) -> AsyncIterator[ClientSession]:
    async with streamable_http_client(url) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def _call(session: ClientSession, name: str, **arguments: Any) -> tuple[bool, Any]:
    result = await session.call_tool(name, arguments)
    text = next(b.text for b in result.content if isinstance(b, mcp_types.TextContent))
    structured = result.structured_content
    assert structured == json.loads(text)
    return result.is_error, structured


async def _search_until_found(session: ClientSession, query: str, tool_id: str) -> list[dict]:
    """The registry read model folds the log asynchronously: wait (bounded) for it."""
    deadline = time.monotonic() + WAIT
    while True:
        is_error, found = await _call(session, "search", query=query)
        assert not is_error, found
        if any(r["tool_id"] == tool_id for r in found["results"]):
            return found["results"]
        assert time.monotonic() < deadline, f"{tool_id} never appeared in the registry"
        await asyncio.sleep(0.2)


async def _exercise(session: ClientSession) -> None:
    """What an agent does: list, search, load, run, and run something that fails."""
    listed = await session.list_tools()
    assert {tool.name for tool in listed.tools} == GATEWAY_TOOLS

    results = await _search_until_found(session, "word", "word_stats")
    assert all("word" in json.dumps(r).lower() for r in results)

    is_error, loaded = await _call(session, "load", tool_id="word_stats")
    assert not is_error, loaded
    assert loaded["manifest"]["tool_id"] == "word_stats"
    assert loaded["metadata"]["integrity"].startswith("sha256:")
    assert "main.py" in {f["path"] for f in loaded["files"]}

    is_error, ran = await _call(session, "execute", action="run", tool_id="word_stats",
                                parameters={"text": "to be or not to be"})
    assert not is_error, ran
    assert ran["status"] == "completed"
    assert ran["result"]["words"] == 6

    is_error, reloaded = await _call(session, "load", tool_id="word_stats")
    assert not is_error, reloaded
    main = next(f for f in reloaded["files"] if f["path"] == "main.py")
    assert main["content"] == (EXAMPLES / "word_stats" / "main.py").read_text()  # now stored

    is_error, failed = await _call(session, "execute", action="run", tool_id="no_such_tool")
    assert is_error
    assert failed["error"]["code"] == "E3101"


async def test_stdio_gateway_serves_an_agent(workdir: Path) -> None:
    async with _stdio_session(workdir) as session:
        await _exercise(session)


async def test_streamable_http_gateway_serves_an_agent(http_gateway: str) -> None:
    async with _http_session(http_gateway) as session:
        await _exercise(session)


async def test_load_of_an_unknown_tool_is_an_error_with_E3101(http_gateway: str) -> None:
    async with _http_session(http_gateway) as session:
        is_error, body = await _call(session, "load", tool_id="no_such_tool")
    assert is_error
    assert body["error"]["code"] == "E3101"


async def test_sign_computes_the_canonical_integrity(http_gateway: str) -> None:
    async with _http_session(http_gateway) as session:
        is_error, signed = await _call(session, "execute", action="sign",
                                       path=str(EXAMPLES / "hello"))
    assert not is_error, signed
    assert signed["integrity"] == source_integrity(EXAMPLES / "hello")[2]


async def test_lock_freezes_the_verified_chain(http_gateway: str, tmp_path: Path) -> None:
    target = tmp_path / "hello.lock.json"
    async with _http_session(http_gateway) as session:
        is_error, locked = await _call(session, "execute", action="lock", tool_id="hello",
                                       path=str(target))
    assert not is_error, locked
    pinned = json.loads(target.read_text())
    assert pinned == locked["lockfile"]
    assert "hello" in json.dumps(pinned)


async def test_run_with_parameters_the_schema_refuses_carries_E3301(http_gateway: str) -> None:
    async with _http_session(http_gateway) as session:
        is_error, body = await _call(session, "execute", action="run", tool_id="word_stats",
                                     parameters={"text": 7})
    assert is_error
    assert body["error"]["code"] == "E3301"


async def test_help_and_a_run_without_a_tool_is_E3004(http_gateway: str) -> None:
    async with _http_session(http_gateway) as session:
        helped = await session.call_tool("help", {"topic": "execute"})
        is_error, body = await _call(session, "execute", action="run")
    text = "".join(b.text for b in helped.content if isinstance(b, mcp_types.TextContent))
    assert "sign" in text and "lock" in text
    assert is_error
    assert body["error"]["code"] == "E3004"
