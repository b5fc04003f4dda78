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

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from toolexec.cli.output import bad_usage, fail_with

if TYPE_CHECKING:
    from domain.lifecycle import LifecycleChange

err = Console(stderr=True)
out = Console()

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
    import asyncio

    from domain.errors import ToolexecError
    from domain.lifecycle import LifecycleChange
    from domain.semver import is_valid_version
    from toolexec import rights
    from toolexec.runtime_file import running_system
    from toolexec.settings import Settings, kafka_client_options
    from toolexec.usecases.lifecycle import change_lifecycle

    tool_id, _, version = tool.partition("@")
    if not tool_id or (version and not is_valid_version(version)) or (
            version_required and not version):
        wanted = "TOOL@VERSION" if version_required else "TOOL or TOOL@VERSION"
        bad_usage(f"expected {wanted} with an exact version, got {tool!r}", as_json)
    settings = Settings()
    change = LifecycleChange(tool_id, version or None, state, reason=reason,
                             replacement_tool_id=replacement)
    try:
        runtime, bootstrap, database_url = running_system(settings)
        capability = rights.caller(settings, token or settings.token, runtime)
        event_ids, shown = asyncio.run(change_lifecycle(
            bootstrap, database_url, change, capability, kafka_client_options(settings)))
    except ToolexecError as error:
        fail_with(error, as_json)
    _report(change, event_ids, shown, as_json)


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
