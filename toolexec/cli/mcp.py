"""CLI command `toolexec mcp`: the MCP gateway (loaded only when the command runs,
so other commands do not pay for importing the MCP SDK)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

err = Console(stderr=True)


def register(app: typer.Typer) -> None:
    app.command("mcp")(mcp_command)


def mcp_command(
    http: Annotated[bool, typer.Option("--http", help="serve streamable HTTP, not stdio")] = False,
    host: Annotated[str, typer.Option(help="HTTP listen address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port (path /mcp)")] = 8765,
    tools: Annotated[list[Path], typer.Option("--tools", help="extra tool directories")] = [],  # noqa: B006
) -> None:
    """MCP server exposing search, load, execute (run | sign | lock) and help."""
    from toolexec.settings import Settings
    from toolexec.system import serve_mcp

    if http:
        err.print(f"toolexec mcp: streamable HTTP on http://{host}:{port}/mcp")
    serve_mcp(Settings(), tools, http=http, host=host, port=port)
