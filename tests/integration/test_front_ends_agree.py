"""The CLI, the HTTP gateway and the MCP server are adapters over the same use cases:
the same bad input gets the same E3xxx code from each, against one running `up`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mcp_types
import pytest

from tests.cli_process import toolexec
from tests.integration.gateway_support import RunningGateway, running_gateway
from toolexec.gateway.mcp import Gateway, build_server
from toolexec.settings import Settings

pytestmark = pytest.mark.integration

NOT_JSON = object()  # the parameters `{"x": NaN}`: not strict JSON


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with running_gateway(tmp_path_factory.mktemp("front-ends")) as running:
        yield running


def _cli(gateway: RunningGateway, tool_id: str, parameters: Any, lockfile: Any) -> str:
    params = '{"x": NaN}' if parameters is NOT_JSON else json.dumps(parameters)
    args = ["run", tool_id, "--params", params, "--json", "--timeout", "60"]
    if lockfile is not None:
        path = gateway.cwd / "case.lock.json"
        path.write_text(json.dumps(lockfile))
        args += ["--lock", str(path)]
    done = toolexec(*args, cwd=gateway.cwd, env=gateway.env)
    assert done.returncode in (1, 2), (done.stdout, done.stderr)
    return str(json.loads(done.stdout)["error"]["code"])


def _http(gateway: RunningGateway, tool_id: str, parameters: Any, lockfile: Any) -> str:
    body: dict[str, Any] = {"tool_id": tool_id, "timeout_seconds": 60}
    body["parameters"] = {"x": float("nan")} if parameters is NOT_JSON else parameters
    if lockfile is not None:
        body["lockfile"] = lockfile
    content = json.dumps(body)  # allow_nan: the gateway must refuse NaN itself
    response = gateway.http.post("/v1/tools/invoke", content=content,
                                 headers={"Content-Type": "application/json"})
    assert response.status_code >= 400, response.text
    return str(response.json()["error"]["code"])


def _mcp(gateway: RunningGateway, tool_id: str, parameters: Any, lockfile: Any) -> str:
    import anyio

    async def call() -> mcp_types.CallToolResult:
        settings = Settings(state_dir=gateway.cwd / ".toolexec")
        server = build_server(Gateway(settings, []))
        arguments: dict[str, Any] = {"action": "run", "tool_id": tool_id, "timeout": 60,
                                     "parameters": {"x": float("nan")}
                                     if parameters is NOT_JSON else parameters}
        if lockfile is not None:
            arguments["lockfile"] = lockfile
        return await server.call_tool("execute", arguments)

    result = anyio.run(call)
    assert result.is_error
    text = next(b.text for b in result.content if isinstance(b, mcp_types.TextContent))
    return str(json.loads(text)["error"]["code"])


FRONT_ENDS: dict[str, Callable[[RunningGateway, str, Any, Any], str]] = {
    "cli": _cli, "http": _http, "mcp": _mcp}

CASES = [
    pytest.param("no_such_tool", {}, None, "E3101", id="unknown tool"),
    pytest.param("word_stats", {"text": 7}, None, "E3301", id="parameters the schema refuses"),
    pytest.param("word_stats", [1, 2], None, "E3004", id="parameters not an object"),
    pytest.param("word_stats", NOT_JSON, None, "E3004", id="parameters not strict JSON"),
    pytest.param("word_stats", {"text": "a"}, [1], "E3004", id="lockfile not an object"),
    pytest.param("", {}, None, "E3004", id="no tool id"),
]


@pytest.mark.parametrize("front_end", sorted(FRONT_ENDS))
@pytest.mark.parametrize(("tool_id", "parameters", "lockfile", "code"), CASES)
def test_the_same_bad_input_gets_the_same_code_from_every_front_end(
        gateway: RunningGateway, front_end: str, tool_id: str, parameters: Any,
        lockfile: Any, code: str, tmp_path: Path) -> None:
    assert FRONT_ENDS[front_end](gateway, tool_id, parameters, lockfile) == code


@pytest.mark.parametrize(("url", "code"), [
    pytest.param("https://hooks.example.net/done", "E3406", id="callback host not allowed"),
    pytest.param("ftp://hooks.example.net/done", "E3004", id="callback not http(s)"),
])
def test_a_callback_url_refused_gets_the_same_code_from_every_front_end(
        gateway: RunningGateway, url: str, code: str) -> None:
    import anyio

    done = toolexec("run", "word_stats", "-p", "text=a", "--callback-url", url, "--json",
                    cwd=gateway.cwd, env=gateway.env)
    assert done.returncode in (1, 2) and json.loads(done.stdout)["error"]["code"] == code
    response = gateway.http.post("/v1/tools/invoke", json={
        "tool_id": "word_stats", "parameters": {"text": "a"}, "callback_url": url})
    assert response.json()["error"]["code"] == code

    async def call() -> mcp_types.CallToolResult:
        server = build_server(Gateway(Settings(state_dir=gateway.cwd / ".toolexec"), []))
        return await server.call_tool("execute", {
            "action": "start", "tool_id": "word_stats", "parameters": {"text": "a"},
            "callback_url": url})

    result = anyio.run(call)
    assert result.is_error and result.structured_content["error"]["code"] == code
def _cli_approval(gateway: RunningGateway, invocation_id: str, approved_hash: str | None) -> str:
    extra = ["--hash", approved_hash] if approved_hash is not None else []
    done = toolexec("approve", invocation_id, *extra, "--json", cwd=gateway.cwd,
                    env=gateway.env)
    assert done.returncode in (1, 2), (done.stdout, done.stderr)
    return str(json.loads(done.stdout)["error"]["code"])


def _http_approval(gateway: RunningGateway, invocation_id: str,
                   approved_hash: str | None) -> str:
    response = gateway.http.post(f"/v1/invocations/{invocation_id}/approval",
                                 json={"decision": "approve", "approved_hash": approved_hash})
    assert response.status_code >= 400, response.text
    return str(response.json()["error"]["code"])


def _mcp_approval(gateway: RunningGateway, invocation_id: str,
                  approved_hash: str | None) -> str:
    import anyio

    async def call() -> mcp_types.CallToolResult:
        settings = Settings(state_dir=gateway.cwd / ".toolexec")
        server = build_server(Gateway(settings, []))
        return await server.call_tool("approval", {
            "action": "approve", "invocation_id": invocation_id,
            "approved_hash": approved_hash})

    result = anyio.run(call)
    assert result.is_error
    text = next(b.text for b in result.content if isinstance(b, mcp_types.TextContent))
    return str(json.loads(text)["error"]["code"])


APPROVAL_FRONT_ENDS: dict[str, Callable[[RunningGateway, str, str | None], str]] = {
    "cli": _cli_approval, "http": _http_approval, "mcp": _mcp_approval}


@pytest.mark.parametrize("front_end", sorted(APPROVAL_FRONT_ENDS))
@pytest.mark.parametrize("approved_hash", [None, "sha256:" + "ab" * 32])
def test_approving_a_call_nothing_waits_with_is_E3702_everywhere(
        gateway: RunningGateway, front_end: str, approved_hash: str | None) -> None:
    assert APPROVAL_FRONT_ENDS[front_end](gateway, "no-such-invocation", approved_hash) == "E3702"
