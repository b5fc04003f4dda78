"""CLI commands that change a tool's lifecycle: deprecate, remove, restore.

Each checks the change against the registry read model of the running `up` (found
like `toolexec publish` finds it), emits `tool.lifecycle.changed`, and waits (bounded)
until the read model shows it, so that `toolexec show` right after sees the change.
With authorization on (this process's settings or the running `up`'s), a capability
token (`--token`, else `TOOLEXEC_TOKEN`) with the lifecycle scope on the tool is
required (admin for runtimes, primitives and MCP servers), as the gateway requires.
Exit 0 on success, 1 on a failure carrying an E3xxx code, 2 on bad usage.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from toolexec.cli_output import bad_usage, fail
from toolexec.runtime_file import read_runtime
from toolexec.settings import Settings, kafka_client_options

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from domain.capability import Capability
    from domain.lifecycle import LifecycleChange

err = Console(stderr=True)
out = Console()

READ_MODEL_WAIT_SECONDS = 5.0  # a tool published just before may not be folded yet
POLL_SECONDS = 0.1

Token = Annotated[str | None, typer.Option(
    "--token", help="capability token (JWT) with the lifecycle scope; default TOOLEXEC_TOKEN "
    "(needed when authorization is on)")]

JsonFlag = Annotated[bool, typer.Option("--json", help="machine-readable output")]
Reason = Annotated[str | None, typer.Option("--reason", help="why (shown in warnings)")]
Replacement = Annotated[str | None, typer.Option(
    "--replacement", help="tool to use instead (TOOL or TOOL@RANGE)")]


def register(app: typer.Typer) -> None:
    """Add `deprecate`, `remove` and `restore` to the toolexec CLI."""
    app.command("deprecate")(deprecate)
    app.command("remove")(remove)
    app.command("restore")(restore)


def deprecate(
    tool: Annotated[str, typer.Argument(metavar="TOOL[@VERSION]", help="TOOL (every version) or TOOL@VERSION")],
    reason: Reason = None, replacement: Replacement = None, token: Token = None,
    as_json: JsonFlag = False,
) -> None:
    """Deprecate a tool version (or every version): it still runs, with a warning."""
    _change(tool, "deprecated", reason, replacement, token, as_json, version_required=False)


def remove(
    tool: Annotated[str, typer.Argument(metavar="TOOL@VERSION", help="the exact version to remove")],
    reason: Reason = None, replacement: Replacement = None, token: Token = None,
    as_json: JsonFlag = False,
) -> None:
    """Remove a tool version: invoking it fails with E3104 (HTTP 410) from now on."""
    _change(tool, "removed", reason, replacement, token, as_json, version_required=True)


def restore(
    tool: Annotated[str, typer.Argument(metavar="TOOL[@VERSION]", help="TOOL (every version) or TOOL@VERSION")],
    reason: Reason = None, token: Token = None, as_json: JsonFlag = False,
) -> None:
    """Make a deprecated or removed version active again."""
    _change(tool, "active", reason, None, token, as_json, version_required=False)


def _change(tool: str, state: str, reason: str | None, replacement: str | None,
            token: str | None, as_json: bool, *, version_required: bool) -> None:
    from domain.errors import ToolexecError
    from domain.lifecycle import LifecycleChange
    from domain.semver import is_valid_version
    from toolexec import rights

    tool_id, _, version = tool.partition("@")
    if not tool_id or (version and not is_valid_version(version)) or (
            version_required and not version):
        wanted = "TOOL@VERSION" if version_required else "TOOL or TOOL@VERSION"
        bad_usage(f"expected {wanted} with an exact version, got {tool!r}", as_json)
    settings = Settings()
    runtime = read_runtime(settings) or {}
    bootstrap = settings.kafka_bootstrap or runtime.get("kafka_bootstrap")
    if not bootstrap:
        fail("E3001", "no running toolexec found: start `toolexec up` first "
              "or set TOOLEXEC_KAFKA_BOOTSTRAP", as_json)
    database_url = runtime.get("database_url") or settings.effective_database_url
    change = LifecycleChange(tool_id, version or None, state, reason=reason,
                             replacement_tool_id=replacement)
    try:
        capability = rights.caller(settings, token or settings.token, runtime)
        event_ids, shown = asyncio.run(_emit(str(bootstrap), str(database_url), change,
                                             capability, kafka_client_options(settings)))
    except ToolexecError as error:
        fail(error.code, error.message, as_json, error.details)
    _report(change, event_ids, shown, as_json)


async def _emit(bootstrap: str, database_url: str, change: LifecycleChange,
                capability: Capability | None, client_options: dict[str, Any]
                ) -> tuple[list[str], dict[str, Any] | None]:
    from projections.database import make_engine
    from toolexec.client import InvocationClient
    from toolexec.lifecycle import checked_reading_your_writes, lifecycle_event
    from toolexec.registry_reads import registry_caught_up

    engine = make_engine(database_url)
    try:
        changes = await checked_reading_your_writes(
            engine, change,
            lambda: registry_caught_up(engine, bootstrap, client_options=client_options),
            capability)
        now = datetime.now(UTC)
        events = [lifecycle_event(checked, now=now) for checked in changes]
        async with InvocationClient(bootstrap, client_options=client_options) as client:
            for event in events:
                await client.send(event)
        return [e.id for e in events], await _wait_shown(engine, changes)
    finally:
        await engine.dispose()


async def _wait_shown(engine: AsyncEngine,
                      changes: tuple[LifecycleChange, ...]) -> dict[str, Any] | None:
    """The tool's read-model row once it shows `changes` (None if not within the bound)."""
    from projections.queries import show_tool
    from toolexec.lifecycle import shows_changes

    deadline = time.monotonic() + READ_MODEL_WAIT_SECONDS
    while time.monotonic() < deadline:
        async with engine.connect() as conn:
            tool = await show_tool(conn, changes[0].tool_id)
        if shows_changes(tool, changes):
            return tool
        await asyncio.sleep(POLL_SECONDS)
    return None


def _report(change: LifecycleChange, event_ids: list[str], shown: dict[str, Any] | None,
            as_json: bool) -> None:
    versions = [{"version": v["version"], "lifecycle": v["lifecycle"]}
                for v in (shown or {}).get("versions", [])]
    if as_json:
        typer.echo(json.dumps({
            "event_ids": event_ids, "tool_id": change.tool_id, "version": change.version,
            "lifecycle": change.state, "reason": change.reason,
            "replacement_tool_id": change.replacement_tool_id,
            "applied": shown is not None, "versions": versions}, indent=2))
        return
    target = f"{change.tool_id}@{change.version}" if change.version else \
        f"{change.tool_id} (every version)"
    err.print(f"{change.state} {escape(target)}"
              + (f": {escape(change.reason)}" if change.reason else "")
              + (f"; use {escape(change.replacement_tool_id)} instead"
                 if change.replacement_tool_id else ""), highlight=False)
    if shown is None:
        err.print("[yellow]the read model does not show it yet[/] (event "
                  f"{', '.join(event_ids)}); `toolexec show {escape(change.tool_id)}` will")
    else:
        out.print(", ".join(f"{v['version']} {v['lifecycle']}" for v in versions),
                  highlight=False)
