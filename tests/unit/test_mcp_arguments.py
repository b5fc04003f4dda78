"""The MCP server answers arguments that do not fit a tool's input schema the way it
answers every other failure: `{"error": {"code": "E3004", ...}}`, never the SDK's
pydantic text. In process: no broker and no read model are needed to refuse them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mcp_types
import pytest

from toolexec.gateway.mcp import Gateway, build_server
from toolexec.settings import Settings


async def _call(tmp_path: Path, name: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
    server = build_server(Gateway(Settings(state_dir=tmp_path / ".toolexec"), []))
    result = await server.call_tool(name, arguments)
    assert isinstance(result, mcp_types.CallToolResult)
    text = next(b.text for b in result.content if isinstance(b, mcp_types.TextContent))
    return bool(result.is_error), json.loads(text)


@pytest.mark.parametrize("arguments", [
    {"action": "explode", "tool_id": "hello"},
    {"action": "run", "tool_id": "hello", "parameters": [1, 2]},
    {"action": "run", "tool_id": "hello", "timeout": "soon"},
    {"action": "run"},
    {},
], ids=["unknown action", "parameters not an object", "timeout not a number", "no tool_id",
        "no action"])
async def test_malformed_execute_arguments_are_E3004(tmp_path: Path,
                                                     arguments: dict[str, Any]) -> None:
    is_error, body = await _call(tmp_path, "execute", arguments)
    assert is_error
    assert body["error"]["code"] == "E3004"


async def test_a_search_limit_of_the_wrong_type_is_E3004(tmp_path: Path) -> None:
    is_error, body = await _call(tmp_path, "search", {"query": "x", "limit": "many"})
    assert is_error and body["error"]["code"] == "E3004"
    assert body["error"]["details"]["errors"][0]["loc"] == ["limit"]
