"""The MCP server pool on its own: the example stdio server started through the
subprocess primitive (rlimits, and bubblewrap or Landlock where available), kept and
reused."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shlex
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from consumers.primitives import bubblewrap, landlock, landlock_exec
from consumers.primitives.file_store import ContentStore
from consumers.primitives.host_groups import FOLDER
from consumers.primitives.mcp_servers import McpServers
from domain.integrity import seal
from domain.model import McpPlan, ResolvedChain
from domain.plan import build_plan
from toolexec.sources import load_builtin_sources, load_source

pytestmark = [pytest.mark.integration]

EXAMPLES = Path(__file__).parents[2] / "examples" / "tools"


def _plan(tool_name: str = "word_count") -> McpPlan:
    server = load_source(EXAMPLES / "text_mcp")
    server = dataclasses.replace(server, manifest={
        **server.manifest, "config": {**server.manifest["config"], "command": sys.executable}})
    tool = load_source(EXAMPLES / "text_word_count.yaml")
    tool = dataclasses.replace(tool, manifest={
        **tool.manifest, "config": {"mcp_tool_name": tool_name, "timeout": 10}})
    subprocess_tool = next(s for s in load_builtin_sources()
                           if s.manifest["tool_id"] == "subprocess")
    plan = build_plan(ResolvedChain((seal(tool), seal(server), seal(subprocess_tool))))
    assert isinstance(plan, McpPlan)
    return plan


@pytest_asyncio.fixture(params=["rlimits", "bwrap", "landlock"])
async def servers(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[McpServers]:
    if request.param == "bwrap" and bubblewrap.bwrap_binary() is None:
        pytest.skip("bubblewrap not installed")
    if request.param == "landlock" and landlock_exec.abi_version() < landlock.MIN_NETWORK_ABI:
        pytest.skip("this kernel's Landlock cannot confine the network")
    store = ContentStore(tmp_path / "cas")
    for file in load_source(EXAMPLES / "text_mcp").files:
        assert file.content is not None
        store.put(file.content)
    pool = McpServers(store, tmp_path / "work", sandbox=request.param)
    yield pool
    await pool.aclose()
    # the server's run directory is gone, and its process group's entry (host_groups)
    assert [p.name for p in (tmp_path / "work").iterdir() if p.name != FOLDER] == []
    assert not any((tmp_path / "work" / FOLDER).glob("*"))


async def test_server_answers_in_its_sandbox_and_is_reused(servers: McpServers) -> None:
    plan = _plan()
    first = await servers.run(plan, {"text": "one two three"}, secrets=lambda _: None)
    assert first.ok, first.error
    pid = servers.pid_of(plan.server_key)
    second = await servers.run(plan, {"text": "four"}, secrets=lambda _: None)
    assert second.ok, second.error
    assert b'"words":1' in second.stdout
    assert servers.pid_of(plan.server_key) == pid is not None


async def test_tampered_server_file_is_refused_before_start(servers: McpServers) -> None:
    plan = _plan()
    assert plan.server is not None
    bad = dataclasses.replace(plan.server.files[0], sha256="0" * 64, content=None)
    plan = dataclasses.replace(plan, server=dataclasses.replace(plan.server, files=(bad,)))
    outcome = await servers.run(plan, {"text": "x"}, secrets=lambda _: None)
    assert not outcome.ok
    assert outcome.error is not None and outcome.error["code"] in ("E3105", "E3401")


async def test_concurrent_first_calls_start_one_server(servers: McpServers,
                                                      tmp_path: Path) -> None:
    plan = _plan()
    outcomes = await asyncio.gather(*(servers.run(plan, {"text": "x " * n},
                                                  secrets=lambda _: None) for n in range(1, 6)))
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert len(list((tmp_path / "work").glob("run-*"))) == 1  # one run directory: one server
    assert sorted(json.loads(o.stdout)["words"] for o in outcomes) == [1, 2, 3, 4, 5]


async def test_another_server_version_gets_its_own_process(servers: McpServers) -> None:
    plan = _plan()
    assert plan.server is not None
    changed = dataclasses.replace(plan, server_key=plan.server_key + "-other",
                                  server=dataclasses.replace(plan.server, env={"V": "2"}))
    first = await servers.run(plan, {"text": "a"}, secrets=lambda _: None)
    second = await servers.run(changed, {"text": "a"}, secrets=lambda _: None)
    assert first.ok and second.ok
    assert servers.pid_of(plan.server_key) != servers.pid_of(changed.server_key)


async def test_server_gone_between_calls_is_started_again_to_list_its_tools(
        tmp_path: Path) -> None:
    """The server's stdout ends while the process it was started as lives on (a wrapper
    outlives it), so the pool still sees its process alive: listing the tools finds the
    server gone and starts it again instead of failing the call."""
    store = ContentStore(tmp_path / "cas")
    for file in load_source(EXAMPLES / "text_mcp").files:
        assert file.content is not None
        store.put(file.content)
    pool = McpServers(store, tmp_path / "work", sandbox="rlimits")
    plan = _plan()
    assert plan.server is not None
    python = " ".join(shlex.quote(part) for part in plan.server.argv)
    plan = dataclasses.replace(plan, server=dataclasses.replace(
        plan.server, argv=("/bin/sh", "-c", f"{python}; exec >&-; exec sleep 600")))
    try:
        first = await pool.run(plan, {"text": "a"}, secrets=lambda _: None)
        assert first.ok, first.error
        os.kill(json.loads(first.stdout)["pid"], signal.SIGKILL)
        wrapper = pool.pid_of(plan.server_key)
        listed = await pool.definition(plan, secrets=lambda _: None)
        assert listed is not None and listed["name"] == "word_count"
        assert pool.pid_of(plan.server_key) not in (None, wrapper)
        again = await pool.run(plan, {"text": "a b"}, secrets=lambda _: None)
        assert again.ok, again.error
        assert json.loads(again.stdout)["words"] == 2
    finally:
        await pool.aclose()
