"""McpPlan: what an mcp_tool's chain [tool, server, primitive] turns into (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from domain.credentials import declared_credentials, references, scoped_secrets
from domain.errors import AuthorizationError, ChainInvalid
from domain.model import McpPlan, ResolvedChain
from domain.plan import build_plan, mcp_server_key
from tests.unit.chain_builders import builtin, tool, tool_file

SERVER_PY = tool_file("server.py", b"print('serve')\n")


def _server(primitive: str = "subprocess", **config: Any) -> Any:
    extra = {k: config.pop(k) for k in ("network_policy", "resource_limits") if k in config}
    return tool("text_mcp", tool_type="mcp_server", executor=primitive, config=config,
                files=(SERVER_PY,) if primitive == "subprocess" else (), **extra)


def _mcp_tool(**config: Any) -> Any:
    return tool("text_upper", tool_type="mcp_tool", executor="text_mcp",
                config={"mcp_tool_name": "upper", **config})


def _plan(server: Any, leaf: Any = None) -> McpPlan:
    primitive = builtin(server.manifest["executor"])
    plan = build_plan(ResolvedChain((leaf or _mcp_tool(), server, primitive)))
    assert isinstance(plan, McpPlan)
    return plan


def test_stdio_tool_plans_its_server_as_a_process_with_its_files():
    server = _server(transport="stdio", command="python3", args=["server.py"],
                     env={"MODE": "fast"}, resource_limits={"memory": "1Gi"})
    plan = _plan(server)
    assert plan.transport == "stdio" and plan.tool_name == "upper"
    assert plan.server is not None and plan.endpoint is None
    assert plan.server.argv == ("python3", "server.py")
    assert plan.server.env == {"MODE": "fast"}
    assert [f.path for f in plan.server.files] == ["server.py"]
    assert plan.server.limits.memory_bytes == 1024**3
    assert plan.primitive == "subprocess"


def test_server_key_names_the_verified_server_version():
    server = _server(transport="stdio", command="python3")
    assert _plan(server).server_key == mcp_server_key(server)
    assert server.integrity in mcp_server_key(server)


def test_the_tools_config_does_not_reach_the_server_process():
    server = _server(transport="stdio", command="python3")
    plan = _plan(server, _mcp_tool(env={"LEAK": "x"}, args=["--evil"]))
    assert plan.server is not None
    assert plan.server.argv == ("python3",) and "LEAK" not in plan.server.env


def test_call_timeout_comes_from_the_tool_and_startup_from_the_server():
    server = _server(transport="stdio", command="python3", startup_timeout=25)
    plan = _plan(server, _mcp_tool(timeout=7))
    assert plan.timeout_seconds == 7 and plan.startup_timeout_seconds == 25


def test_remote_server_is_an_http_endpoint_with_secret_headers_and_policy():
    server = _server("http_client", transport="streamable_http",
                     url="https://mcp.example.com/mcp",
                     headers={"authorization": "Bearer ${MCP_TOKEN}"},
                     network_policy={"allowed_domains": ["mcp.example.com"]})
    plan = _plan(server)
    assert plan.server is None and plan.endpoint is not None
    assert plan.endpoint.url_template == "https://mcp.example.com/mcp"
    assert plan.endpoint.headers == {"authorization": "Bearer ${MCP_TOKEN}"}
    assert plan.endpoint.network.allowed_domains == ("mcp.example.com",)
    assert references(plan) == ["MCP_TOKEN"]
    assert plan.primitive == "http_client"


def test_stdio_server_env_references_are_credentials_too():
    server = _server(transport="stdio", command="python3", env={"KEY": "${GH_TOKEN}"})
    assert references(_plan(server)) == ["GH_TOKEN"]


def test_websocket_servers_cannot_be_called():
    server = _server("http_client", transport="websocket", url="wss://mcp.example.com/ws")
    with pytest.raises(ChainInvalid) as raised:
        _plan(server)
    assert raised.value.code == "E3105"


def test_an_mcp_server_is_not_invoked_by_itself():
    server = _server(transport="stdio", command="python3")
    with pytest.raises(ChainInvalid):
        build_plan(ResolvedChain((server, builtin("subprocess"))))


def test_an_mcp_tool_must_run_on_an_mcp_server():
    runtime_like = tool("text_mcp", tool_type="runtime", executor="subprocess",
                        config={"command": "python3"})
    with pytest.raises(ChainInvalid):
        build_plan(ResolvedChain((_mcp_tool(), runtime_like, builtin("subprocess"))))


def test_an_undeclared_header_credential_is_refused_with_E3206():
    server = _server("http_client", transport="streamable_http",
                     url="https://mcp.example.com/mcp",
                     headers={"authorization": "Bearer ${MCP_TOKEN}"})
    plan = _plan(server)
    chain = ResolvedChain((_mcp_tool(), server, builtin("http_client")))
    with pytest.raises(AuthorizationError) as raised:
        scoped_secrets(plan, declared_credentials(chain), {"MCP_TOKEN": "s3cret"}.get)
    assert raised.value.code == "E3206"


def test_a_declared_header_credential_is_handed_over():
    server = tool("text_mcp", tool_type="mcp_server", executor="http_client",
                  config={"transport": "sse", "url": "https://mcp.example.com/sse",
                          "headers": {"authorization": "Bearer ${MCP_TOKEN}"}},
                  required_permissions=["credentials:MCP_TOKEN"])
    plan = _plan(server)
    chain = ResolvedChain((_mcp_tool(), server, builtin("http_client")))
    lookup = scoped_secrets(plan, declared_credentials(chain), {"MCP_TOKEN": "s3cret"}.get)
    assert lookup("MCP_TOKEN") == "s3cret"
