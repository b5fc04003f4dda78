"""Strings the OS or HTTP refuse (a NUL byte, `=` in a variable name, a lone surrogate,
a newline in a header value...) in a manifest's argv or environment, in a secret or in
a parameter give a clear E3xxx outcome under every sandbox, for the HTTP client and for
stdio MCP servers: never a bare ValueError out of the primitive."""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from consumers.primitives import bubblewrap, landlock, landlock_exec, namespace_launcher
from consumers.primitives.file_store import ContentStore
from consumers.primitives.http_primitive import HttpPrimitive, open_endpoint
from consumers.primitives.mcp_servers import McpServers
from consumers.primitives.subprocess_primitive import run_subprocess
from domain.errors import ToolexecError
from domain.model import HttpPlan, McpPlan, NetworkPolicy, SubprocessPlan, ToolFile
from tests.integration.gateway_support import refused_api_tool, running_gateway

pytestmark = pytest.mark.integration

SOURCE = b"print('{}')"
TOOL = ToolFile("main.py", hashlib.sha256(SOURCE).hexdigest(), False, SOURCE)

SANDBOXES = [
    "rlimits",
    pytest.param("bwrap", marks=pytest.mark.skipif(bubblewrap.bwrap_binary() is None,
                                                   reason="bubblewrap not installed")),
    pytest.param("landlock", marks=pytest.mark.skipif(not landlock.available(),
                                                      reason="no Landlock here")),
    pytest.param("namespaces", marks=pytest.mark.skipif(
        not namespace_launcher.usable(), reason="the namespace launcher needs root")),
]
HOSTILE_PROCESS = {
    "NUL in an argument": ({"argv": (sys.executable, "main.py", "a\x00b")}, "argument 2"),
    "lone surrogate in an argument": ({"argv": (sys.executable, "main.py", "\ud800")},
                                      "argument 2"),
    "NUL in a variable": ({"env": {"TOKEN": "x\x00y"}}, "environment variable TOKEN"),
    "lone surrogate in a variable": ({"env": {"TOKEN": "\udfff"}},
                                     "environment variable TOKEN"),
    "'=' in a variable name": ({"env": {"A=B": "1"}}, "environment variable A=B"),
    "NUL in a variable name": ({"env": {"A\x00B": "1"}},
                               "the name of environment variable 'A\\x00B'"),
    "empty variable name": ({"env": {"": "1"}}, "environment variable "),
}


def _plan(**changes: Any) -> SubprocessPlan:
    return dataclasses.replace(SubprocessPlan(argv=(sys.executable, "main.py"), files=(TOOL,)),
                               **changes)


@pytest.mark.parametrize("sandbox", SANDBOXES)
@pytest.mark.parametrize("case", sorted(HOSTILE_PROCESS))
async def test_an_argv_or_environment_the_os_refuses_is_E3401_under_every_sandbox(
        tmp_path: Path, sandbox: str, case: str) -> None:
    changes, where = HOSTILE_PROCESS[case]
    outcome = await run_subprocess(_plan(**changes), {}, store=ContentStore(tmp_path / "cas"),
                                   work_root=tmp_path / "work", sandbox=sandbox)
    assert not outcome.ok and outcome.error is not None
    assert outcome.error["code"] == "E3401", outcome.error
    assert outcome.error["message"].startswith(where), outcome.error
    assert "x\x00y" not in str(outcome.error)  # the value (maybe a secret) is never shown


@pytest.mark.parametrize("sandbox", SANDBOXES)
async def test_the_same_plan_without_the_hostile_string_runs(tmp_path: Path,
                                                             sandbox: str) -> None:
    outcome = await run_subprocess(_plan(env={"TOKEN": "x y\nz"}), {},  # a newline is fine
                                   store=ContentStore(tmp_path / "cas"),
                                   work_root=tmp_path / "work", sandbox=sandbox)
    assert outcome.ok, outcome.error


# -- stdio MCP servers -------------------------------------------------------------------

@pytest_asyncio.fixture(params=[p for p in SANDBOXES
                                if getattr(p, "values", (p,))[0] != "namespaces"])
async def servers(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[McpServers]:
    sandbox = getattr(request.param, "values", (request.param,))[0]
    if sandbox == "landlock" and landlock_exec.abi_version() < landlock.MIN_NETWORK_ABI:
        pytest.skip("this kernel's Landlock cannot confine the network")
    pool = McpServers(ContentStore(tmp_path / "cas"), tmp_path / "work", sandbox=sandbox)
    yield pool
    await pool.aclose()


@pytest.mark.parametrize("case", sorted(HOSTILE_PROCESS))
async def test_a_stdio_mcp_server_the_os_cannot_start_is_E3401(servers: McpServers,
                                                               case: str) -> None:
    changes, where = HOSTILE_PROCESS[case]
    plan = McpPlan(transport="stdio", server_key=f"hostile@1#{case}", tool_name="x",
                   timeout_seconds=5, startup_timeout_seconds=5, server=_plan(**changes))
    outcome = await servers.run(plan, {}, secrets=lambda _: None)
    assert not outcome.ok and outcome.error is not None
    assert outcome.error["code"] == "E3401", outcome.error
    assert outcome.error["message"].startswith(where), outcome.error


# -- the HTTP client ---------------------------------------------------------------------

POLICY = NetworkPolicy(allowed_domains=("127.0.0.1",), allowed_ports=(9,))
URL = "http://127.0.0.1:9/items/{id}"


def _secrets(name: str) -> str | None:
    return {"SPLIT": "abc\r\nX-Injected: 1", "NUL": "a\x00b", "WIDE": "jeton-é"}.get(name)


HOSTILE_HTTP = {  # plan changes, parameters, expected code, message start
    "newline in a header value": ({"headers": {"X-A": "a\nb"}}, {"id": 1}, "E3401",
                                  "the value of header X-A"),
    "secret splitting a header": ({"headers": {"Authorization": "Bearer ${SPLIT}"}},
                                  {"id": 1}, "E3401", "the value of header Authorization"),
    "NUL from a secret": ({"headers": {"X-A": "${NUL}"}}, {"id": 1}, "E3401",
                          "the value of header X-A"),
    "non-ASCII header value": ({"headers": {"X-A": "${WIDE}"}}, {"id": 1}, "E3401",
                               "the value of header X-A"),
    "header name with a colon": ({"headers": {"X-A: b": "1"}}, {"id": 1}, "E3401",
                                 "header name"),
    "method that is no token": ({"method": "GET /x HTTP/1.1\r\nHost: evil"}, {"id": 1},
                                "E3401", "the method"),
    "newline in the URL template": ({"url_template": "http://127.0.0.1:9/a\nb/{id}"},
                                    {"id": 1}, "E3401", "the URL"),
    "NUL in the URL template": ({"url_template": "http://127.0.0.1:9/a\x00/{id}"},
                                {"id": 1}, "E3401", "the URL"),
    "lone surrogate in a path parameter": ({}, {"id": "\ud800"}, "E3301", "parameter 'id'"),
    "lone surrogate in a query parameter": ({}, {"id": 1, "q": "\udc80"}, "E3301",
                                            "parameter 'q'"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_HTTP))
async def test_a_request_http_cannot_carry_is_refused_before_any_connection(case: str) -> None:
    changes, params, code, where = HOSTILE_HTTP[case]
    plan = HttpPlan(**({"method": "GET", "url_template": URL, "network": POLICY} | changes))
    primitive = HttpPrimitive(allowed_networks=("127.0.0.1/32",))
    try:
        outcome = await primitive.run(plan, params, secrets=_secrets)
    finally:
        await primitive.aclose()
    assert not outcome.ok and outcome.error is not None
    assert outcome.error["code"] == code, outcome.error
    assert outcome.error["message"].startswith(where), outcome.error
    assert "X-Injected" not in str(outcome.error)  # no secret in the error


@pytest.mark.parametrize("headers", [{"X-A": "a\nb"}, {"Authorization": "Bearer ${SPLIT}"},
                                     {"X-A": "${WIDE}"}])
def test_a_remote_mcp_endpoint_http_cannot_carry_is_E3401(headers: dict[str, str]) -> None:
    plan = HttpPlan(method="POST", url_template="http://127.0.0.1:9/mcp", headers=headers,
                    network=POLICY)
    with pytest.raises(ToolexecError) as refused:
        open_endpoint(plan, _secrets)
    assert refused.value.code == "E3401" and "X-Injected" not in str(refused.value.to_dict())


# -- end to end: a terminal event each, and the pipeline goes on ---------------------

def _script(tool_id: str, config: dict[str, Any]) -> dict[str, Any]:
    return {"tool_id": tool_id, "version": "1.0.0", "tool_type": "script",
            "executor": "python_runtime", "description": "Prints nothing much.",
            "config": {"entrypoint": "main.py", **config}}


E2E_TOOLS = {
    "nul_argument": (_script("nul_argument", {"args": ["a\x00b"]}), "E3401"),
    "nul_variable": (_script("nul_variable", {"env": {"MODE": "x\x00y"}}), "E3401"),
    "split_header": (refused_api_tool("split_header", "split-header") | {
        "config": {"method": "GET", "url_template": "http://127.0.0.1:9/ping",
                   "headers": {"X-Mode": "a\r\nX-Injected: 1"}}}, "E3401"),
}


def test_each_hostile_manifest_ends_its_invocation_with_its_code_on_a_real_up(
        tmp_path: Path) -> None:
    with running_gateway(tmp_path) as gateway:
        for manifest, _ in E2E_TOOLS.values():
            registered = gateway.register(manifest, [{"path": "main.py",
                                                      "content": "print('{}')"}])
            assert registered.status_code == 201, registered.text
        for tool_id, (_, code) in E2E_TOOLS.items():
            answer = gateway.invoke(tool_id, {})
            assert answer.json()["error"]["code"] == code, answer.text
        healthy = gateway.invoke("py_echo", {"text": "still here"})
        assert healthy.status_code == 200, healthy.text
