"""A small MCP server of toolexec's own (stdio): text tools for the `text_mcp` example.

Run by the subprocess primitive as `python3 server.py` (a long-lived process that
the executor keeps and reuses); `pid` lets callers see which process answered.
`python3 server.py --http PORT` serves the same tools over streamable HTTP on
127.0.0.1:PORT/mcp instead, `--sse PORT` over SSE on 127.0.0.1:PORT/sse.
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("text_mcp", version="1.0.0")


@server.tool()
def word_count(text: str) -> dict[str, int]:
    """Count the words and characters of a text; `pid` is the answering server's."""
    return {"words": len(text.split()), "characters": len(text), "pid": os.getpid()}


@server.tool()
def upper(text: str) -> str:
    """The text in upper case."""
    return text.upper()


@server.tool()
async def pause(seconds: float) -> str:
    """Wait `seconds`, then say so (for timeouts)."""
    await asyncio.sleep(seconds)
    return f"paused {seconds:g}s"


@server.tool()
def fail(reason: str) -> str:
    """Always fails with `reason` (a tool error, not a crash)."""
    raise ToolError(reason)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "--sse":
        server.run("sse", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
