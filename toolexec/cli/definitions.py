"""CLI commands over pinned MCP tool definitions: `definitions list`, `definitions approve`.

`list` reads the definitions read model (pinned or drifted, and what drifted);
`approve` records a person's approval of a drifted definition on the running `up`
(found like `toolexec deprecate` finds it). With authorization on, `approve` needs a
token (`--token`, else TOOLEXEC_TOKEN) with the approve scope on the server's tool id,
or admin. Exit 0 on success, 1 on a failure carrying an E3xxx code, 2 on bad usage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from toolexec.cli.output import echo_json, fail_with
from toolexec.cli.projections import with_engine

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from toolexec.settings import Settings

err = Console(stderr=True)
out = Console()

definitions_app = typer.Typer(no_args_is_help=True,
                              help="Pinned MCP tool definitions (rug-pull detection).")
JsonFlag = Annotated[bool, typer.Option("--json", help="machine-readable output")]
Token = Annotated[str | None, typer.Option(
    "--token", help="capability token (JWT) with the approve scope on the server; default "
    "TOOLEXEC_TOKEN (needed when authorization is on)")]


def register(app: typer.Typer) -> None:
    """Add `definitions list` and `definitions approve` to the toolexec CLI."""
    app.add_typer(definitions_app, name="definitions")


@definitions_app.command("list")
def list_definitions(
    server: Annotated[str | None, typer.Option("--server", help="one server's tool id")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Every MCP tool's pinned definition: its hash, pinned or drifted, and the drifts
    waiting for approval with what changed."""
    from toolexec.settings import Settings

    pins = read_pins(Settings(), as_json, server)
    if as_json:
        echo_json({"definitions": pins})
        return
    table = Table("server", "tool", "state", "definition", "pinned", "waiting for approval")
    for pin in pins:
        table.add_row(pin["server_tool_id"], pin["mcp_tool_name"], pin["state"],
                      pin["definition_hash"], _pinned(pin),
                      "\n".join(_drift(p) for p in pin["pending"]))
    out.print(table)


def read_pins(settings: Settings, as_json: bool, server: str | None = None
              ) -> list[dict[str, Any]]:
    """The definitions read model's pins (one server's with `server`), once it has
    folded a pin made just before (bounded, like every read-your-writes reader)."""
    from toolexec.usecases.definitions import list_pins

    async def work(engine: AsyncEngine) -> list[dict[str, Any]]:
        return await list_pins(engine, server)

    return with_engine(settings, work, as_json, after=("definitions",))


def _pinned(pin: dict[str, Any]) -> str:
    how = "first seen" if pin["pinned_how"] == "first_use" else \
        f"approved by {pin['approved_by'] or 'the operator'}"
    return f"{how}, {pin['pinned_at']}"


def _drift(pending: dict[str, Any]) -> str:
    paths = ", ".join(change["path"] or "/" for change in pending["diff"])
    return escape(f"{pending['definition_hash']} ({paths})")


@definitions_app.command("approve")
def approve(
    target: Annotated[str, typer.Argument(
        metavar="SERVER-OR-TOOL", help="the mcp_server's tool id, or an mcp_tool's")],
    definition_hash: Annotated[str, typer.Argument(
        metavar="HASH", help="the drifted definition's hash (sha256:...)")],
    reason: Annotated[str | None, typer.Option("--reason", help="why, in words")] = None,
    token: Token = None,
    as_json: JsonFlag = False,
) -> None:
    """Approve a drifted MCP tool definition: calls to the tool run again."""
    import asyncio

    from domain.errors import ToolexecError
    from toolexec import rights
    from toolexec.runtime_file import running_system
    from toolexec.settings import Settings, kafka_client_options
    from toolexec.usecases.definitions import approve as approve_definition

    settings = Settings()
    try:
        runtime, bootstrap, database_url = running_system(settings)
        capability = rights.caller(settings, token or settings.token, runtime)
        answer = asyncio.run(approve_definition(
            bootstrap, database_url, target, definition_hash, capability,
            kafka_client_options(settings), reason))
    except ToolexecError as error:
        fail_with(error, as_json)
    if as_json:
        echo_json(answer)
        return
    pin = answer["definition"]
    what = f"{pin['server_tool_id']} {pin['mcp_tool_name']} {definition_hash}"
    if answer["status"] == "already_approved":
        err.print(f"{escape(what)} is already the approved definition")
    elif answer["applied"]:
        out.print(f"approved {escape(what)}", highlight=False)
    else:
        err.print(f"approved {escape(what)}; [yellow]the read model does not show it yet[/] "
                  f"(event {answer['event_id']})")
