"""A stdio MCP server whose `echo` tool's description is read, at start, from the file
named by its first argument: the definitions tests edit that file and restart the
server to make it announce another definition (a "rug pull")."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("drift_mcp", version="1.0.0")


def echo(text: str) -> dict[str, object]:
    """Placeholder; the announced description comes from the file."""
    return {"echo": text, "pid": os.getpid()}


if __name__ == "__main__":
    description = Path(sys.argv[1]).read_text(encoding="utf-8").strip()
    server.tool(name="echo", description=description)(echo)
    server.run("stdio")
