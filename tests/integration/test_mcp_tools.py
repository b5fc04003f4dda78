"""mcp_tool invocations through the whole pipeline, against the project's own MCP
server (examples/tools/text_mcp) run for real: over stdio as a long-lived process
started by the subprocess primitive, and over streamable HTTP through the http plan."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio

from contracts.envelope import Envelope
from domain.model import ToolSource
from tests.waiting import WAIT, eventually, process_gone
from toolexec.client import InvocationClient
from toolexec.publishing import publish_event
from toolexec.settings import Settings
from toolexec.sources import load_builtin_sources, load_source
from toolexec.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

EXAMPLES = Path(__file__).parents[2] / "examples" / "tools"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def http_mcp_server() -> Iterator[int]:
    """The same example server, serving streamable HTTP on a local port."""
    yield from _serve_example("--http")


@pytest.fixture(scope="module")
def sse_mcp_server() -> Iterator[int]:
    """The same example server, serving SSE on a local port."""
    yield from _serve_example("--sse")


def _serve_example(transport: str) -> Iterator[int]:
    port = _free_port()
    process = subprocess.Popen([sys.executable, str(EXAMPLES / "text_mcp" / "server.py"),
                                transport, str(port)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + WAIT
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert process.poll() is None and time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield port
    process.kill()
    process.wait()


def _with_manifest(source: ToolSource, **changes: object) -> ToolSource:
    return dataclasses.replace(source, manifest={**source.manifest, **changes})


def _text_mcp_stdio() -> ToolSource:
    """The shipped server, started with this test run's Python (which has `mcp`)."""
    source = load_source(EXAMPLES / "text_mcp")
    return _with_manifest(source, config={**source.manifest["config"],
                                          "command": sys.executable})


def _mcp_tool(tool_id: str, server: str, tool_name: str, timeout: float = 10) -> ToolSource:
    source = load_source(EXAMPLES / "text_word_count.yaml")
    manifest = {key: value for key, value in source.manifest.items() if key != "result_schema"}
    return dataclasses.replace(source, manifest={
        **manifest, "tool_id": tool_id, "executor": server,
        "config": {"mcp_tool_name": tool_name, "timeout": timeout},
        "parameters": {"type": "object"}})


MARKING_SERVER = """
import asyncio, pathlib, server

@server.server.tool()
async def pause_marked(seconds: float, marker: str) -> str:
    \"\"\"Say that the call arrived (writes `marker`), then wait `seconds`.\"\"\"
    pathlib.Path(marker).touch()
    await asyncio.sleep(seconds)
    return f"paused {seconds:g}s"

server.server.run("stdio")
"""


def _marking_server() -> ToolSource:
    """The shipped server with one more tool, `pause_marked`, which writes a file when a
    call reaches the server: a test can act on the server while it holds the call."""
    source = _text_mcp_stdio()
    any_child = {"child_schemas": [{"match": {"tool_type": "mcp_tool"},
                                    "schema": {"type": "object"}}]}
    return _with_manifest(source, tool_id="marking_mcp", validation=any_child, config={
        **source.manifest["config"], "args": ["-c", MARKING_SERVER]})


def _broken_server() -> ToolSource:
    """A stdio server whose process exits before the MCP handshake."""
    source = _text_mcp_stdio()
    return _with_manifest(source, tool_id="broken_mcp", config={
        **source.manifest["config"], "args": ["-c", "import sys; sys.exit('no mcp here')"]})


def _remote_server(tool_id: str, port: int, allowed: list[str],
                   transport: str = "streamable_http") -> ToolSource:
    source = load_source(EXAMPLES / "text_mcp")
    path = "sse" if transport == "sse" else "mcp"
    return ToolSource(manifest={
        **source.manifest, "tool_id": tool_id, "executor": "http_client",
        "config": {"transport": transport, "url": f"http://127.0.0.1:{port}/{path}",
                   "headers": {"x-client": "toolexec"}, "startup_timeout": 20},
        "network_policy": {"allowed_domains": allowed, "allowed_ports": [port]},
    }, files=(), origin=f"test:{tool_id}", layout="single_file")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory, http_mcp_server: int,
                sse_mcp_server: int) -> AsyncIterator[Stack]:
    state = tmp_path_factory.mktemp("state")
    # rlimits: the test signals the server by its host pid (under bwrap the server
    # sees only its own PID namespace); bubblewrap has its own tests.
    settings = Settings(state_dir=state, tools_dir=state / "none", user_tools_dir=None,
                        sandbox="rlimits",
                        egress_allowed_networks=["127.0.0.1/32"])  # the remote MCP servers
    port = http_mcp_server
    sources = [
        *load_builtin_sources(), _text_mcp_stdio(),
        load_source(EXAMPLES / "text_word_count.yaml"),
        _mcp_tool("text_fail", "text_mcp", "fail"),
        _mcp_tool("text_upper", "text_mcp", "upper"),
        # the quick pause must end within the timeout however loaded the machine is
        _mcp_tool("text_pause", "text_mcp", "pause", timeout=15),
        _mcp_tool("text_long_pause", "text_mcp", "pause", timeout=600),
        _marking_server(),
        _mcp_tool("marking_word_count", "marking_mcp", "word_count"),
        _mcp_tool("marking_long_pause", "marking_mcp", "pause_marked", timeout=600),
        _broken_server(),
        _mcp_tool("broken_upper", "broken_mcp", "upper"),
        _remote_server("text_mcp_http", port, ["127.0.0.1"]),
        _mcp_tool("remote_word_count", "text_mcp_http", "word_count"),
        _remote_server("text_mcp_sse", sse_mcp_server, ["127.0.0.1"], transport="sse"),
        _mcp_tool("sse_word_count", "text_mcp_sse", "word_count"),
        _remote_server("text_mcp_fenced", port, ["mcp.example.com"]),
        _mcp_tool("fenced_word_count", "text_mcp_fenced", "word_count"),
    ]
    async with Stack(settings, group_prefix=f"t{uuid.uuid4().hex[:6]}") as running:
        now = datetime.now(UTC)
        for source in sources:
            event = publish_event(source, now=now)
            assert event.type == "tool.published", event.data
            await running.publish(event)
        yield running


@pytest_asyncio.fixture(loop_scope="module")
async def client(stack: Stack) -> AsyncIterator[InvocationClient]:
    async with InvocationClient(stack.bootstrap, verifier=stack.verifier) as c:
        yield c


def _completed(event: Envelope) -> object:
    assert event.type == "tool.invoke.completed", event.data
    return event.data.result



async def test_mcp_tool_returns_the_servers_result(client: InvocationClient) -> None:
    result = _completed(await client.invoke("text_word_count", {"text": "to be or not to be"}))
    assert result["words"] == 6
    assert result["characters"] == 18


async def test_second_call_reuses_the_server_process(client: InvocationClient) -> None:
    first = _completed(await client.invoke("text_word_count", {"text": "one"}))
    second = _completed(await client.invoke("text_word_count", {"text": "one two"}))
    assert second["words"] == 2
    assert first["pid"] == second["pid"]
    assert not process_gone(first["pid"])


async def test_other_tools_of_the_same_server_share_its_process(
        client: InvocationClient) -> None:
    counted = _completed(await client.invoke("text_word_count", {"text": "x"}))
    upper = _completed(await client.invoke("text_upper", {"text": "quiet words"}))
    assert upper == {"result": "QUIET WORDS"}
    again = _completed(await client.invoke("text_word_count", {"text": "x"}))
    assert again["pid"] == counted["pid"]


async def test_killed_server_is_restarted_by_the_next_call(client: InvocationClient) -> None:
    before = _completed(await client.invoke("text_word_count", {"text": "a b"}))
    os.kill(before["pid"], signal.SIGKILL)
    await eventually(lambda: process_gone(before["pid"]), "the killed server exits")
    after = _completed(await client.invoke("text_word_count", {"text": "a b c"}))
    assert after["words"] == 3
    assert after["pid"] != before["pid"]


async def test_tool_error_result_becomes_a_failure_with_its_code(
        client: InvocationClient) -> None:
    event = await client.invoke("text_fail", {"reason": "the disk is made of cheese"})
    assert event.type == "tool.invoke.failed", event.data
    assert event.data.error.code == "E3401"
    assert "the disk is made of cheese" in event.data.error.message
    assert event.data.error.details["is_error"] is True


async def test_invalid_arguments_are_refused_by_the_server(client: InvocationClient) -> None:
    event = await client.invoke("text_upper", {"not_text": 1})
    assert event.type == "tool.invoke.failed", event.data
    assert event.data.error.code.startswith("E3")
    assert event.data.error.code in ("E3301", "E3401")


async def test_streamable_http_server_is_called_through_the_http_plan(
        client: InvocationClient, http_mcp_server: int) -> None:
    result = _completed(await client.invoke("remote_word_count", {"text": "far away words"}))
    assert result["words"] == 3


async def test_sse_server_is_called_through_the_http_plan(client: InvocationClient) -> None:
    result = _completed(await client.invoke("sse_word_count", {"text": "events stream in"}))
    assert result["words"] == 3


async def test_network_policy_fences_a_remote_server_with_E3406(
        client: InvocationClient) -> None:
    event = await client.invoke("fenced_word_count", {"text": "never sent"})
    assert event.type == "tool.invoke.failed", event.data
    assert event.data.error.code == "E3406"


async def test_call_past_the_tools_timeout_fails_with_E3402(client: InvocationClient) -> None:
    event = await client.invoke("text_pause", {"seconds": 600})
    assert event.type == "tool.invoke.failed", event.data
    assert event.data.error.code == "E3402"
    quick = _completed(await client.invoke("text_pause", {"seconds": 0}))
    assert quick == {"result": "paused 0s"}


async def test_server_that_cannot_start_fails_with_its_stderr(client: InvocationClient) -> None:
    event = await client.invoke("broken_upper", {"text": "x"})
    assert event.type == "tool.invoke.failed", event.data
    assert event.data.error.code == "E3401"
    assert "no mcp here" in event.data.error.details["stderr_tail"]
    assert event.data.error.details["exit_code"] == 1


async def test_server_dying_during_a_call_fails_it_with_E3404(
        client: InvocationClient, tmp_path: Path) -> None:
    pid = _completed(await client.invoke("marking_word_count", {"text": "x"}))["pid"]
    marker = tmp_path / "call-arrived"
    call = asyncio.create_task(client.invoke(
        "marking_long_pause", {"seconds": 600, "marker": str(marker)}))
    # The server's own sign that it holds the call: it is killed in the middle of it.
    await eventually(marker.exists, "the pause call reached the server")
    os.kill(pid, signal.SIGKILL)
    event = await asyncio.wait_for(call, WAIT)
    assert event.type == "tool.invoke.failed", event.data
    assert event.data.error.code == "E3404"
    again = _completed(await client.invoke("marking_word_count", {"text": "x y"}))
    assert again["words"] == 2 and again["pid"] != pid


async def test_cancelled_call_ends_with_E3703_and_the_server_serves_the_next_one(
        client: InvocationClient) -> None:
    before = _completed(await client.invoke("text_word_count", {"text": "a"}))
    started = asyncio.Event()
    invocation_id = str(uuid.uuid4())
    call = asyncio.create_task(client.invoke(
        "text_long_pause", {"seconds": 500}, invocation_id=invocation_id,
        progress=lambda e: started.set() if e.type == "tool.execution.started" else None))
    await asyncio.wait_for(started.wait(), WAIT)
    await client.cancel(invocation_id, "no longer needed")
    event = await asyncio.wait_for(call, WAIT)  # the pause would end it completed
    assert event.type == "tool.invoke.failed", event.data
    assert event.data.error.code == "E3703"
    after = _completed(await client.invoke("text_word_count", {"text": "a b"}))
    assert after["words"] == 2 and after["pid"] == before["pid"]
