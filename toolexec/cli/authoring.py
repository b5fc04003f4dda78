"""Authoring commands that need no running system: validate, integrity, lock.

Exit codes: 0 success, 1 a failure carrying an E3xxx code (invalid tool, integrity or
chain error), 2 bad usage (missing path, malformed argument).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from domain.errors import ToolexecError
from domain.model import LOCAL_REGISTRY_URL, Issue, ToolSource
from toolexec.cli.output import bad_usage, echo_json, fail_with

if TYPE_CHECKING:
    from toolexec.sources import SourceError

# Validation, the sources and the authoring use cases are imported by the commands, so
# that `toolexec --help` starts quickly.

DEFAULT_TOOLS_DIR = Path(".ai/tools")

out = Console()
err = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="machine-readable output")]


def register(app: typer.Typer) -> None:
    """Add the authoring commands to the `toolexec` application."""
    app.command("validate")(validate)
    app.command("integrity")(integrity)
    app.command("lock")(lock)


# ------------------------------------------------------------------------------ shared


def _require_existing(paths: Iterable[Path], as_json: bool) -> None:
    for path in paths:
        if not path.exists():
            bad_usage(f"{path} does not exist", as_json)


def _display(origin: str) -> str:
    try:
        return str(Path(origin).relative_to(Path.cwd().resolve()))
    except ValueError:
        return origin


# ---------------------------------------------------------------------------- validate


def validate(
    paths: Annotated[list[Path], typer.Argument(help="tool sources or directories of tools")],
    as_json: JsonFlag = False,
) -> None:
    """Validate tool sources without publishing (layers 1-2).

    Checks the manifest, executor rules and per-type requirements of every tool found
    under PATH; exits 1 when any tool has an error."""
    from domain.validation import validate_source
    from toolexec.sources import SourceError, bash_syntax_check, discover, load_builtin_sources
    from toolexec.usecases.authoring import known_tools

    _require_existing(paths, as_json)
    found = discover(paths)
    if not found:
        bad_usage(f"no tool sources found under {', '.join(map(str, paths))}", as_json)
    sources = [item for item in found if isinstance(item, ToolSource)]
    unreadable = [item for item in found if isinstance(item, SourceError)]
    known = known_tools([*load_builtin_sources(), *sources])
    reports = [_tool_report(s, validate_source(s, bash_syntax=bash_syntax_check,
                                               known_tools=known)) for s in sources]
    valid = not unreadable and all(report["valid"] for report in reports)
    if as_json:
        echo_json({"valid": valid, "tools": reports,
                    "unreadable": [error.to_dict() for error in unreadable]})
    else:
        _print_validation(reports, unreadable)
    raise typer.Exit(0 if valid else 1)


def _tool_report(source: ToolSource, issues: list[Issue]) -> dict[str, Any]:
    from toolexec.usecases.authoring import errors_of

    manifest = source.manifest
    return {
        "tool_id": manifest.get("tool_id"),
        "version": manifest.get("version"),
        "tool_type": manifest.get("tool_type"),
        "origin": source.origin,
        "layout": source.layout,
        "valid": not errors_of(issues),
        "issues": [issue.to_dict() for issue in issues],
    }


def _print_validation(reports: Sequence[dict[str, Any]], unreadable: Sequence[SourceError]) -> None:
    table = Table(title="toolexec validate", title_justify="left")
    for column in ("status", "tool", "version", "type"):
        table.add_column(column, no_wrap=True)
    table.add_column("source", overflow="fold")
    for report in reports:
        status = "[green]ok[/]" if report["valid"] else "[red]invalid[/]"
        if report["valid"] and report["issues"]:
            status = "[yellow]warnings[/]"
        table.add_row(status, *(escape(str(report[key] or "-"))
                                for key in ("tool_id", "version", "tool_type")),
                      escape(_display(report["origin"])))
    out.print(table)
    for report in reports:
        for issue in report["issues"]:
            colour = "red" if issue["severity"] == "error" else "yellow"
            out.print(f"[{colour}]{issue['severity']}[/] {escape(str(report['tool_id']))} "
                      f"{escape(issue['path'])}: {escape(issue['message'])}", soft_wrap=True)
    for error in unreadable:
        out.print(f"[red]{error.code}[/] {escape(error.message)}", soft_wrap=True)
    invalid = sum(1 for r in reports if not r["valid"])
    summary = f"{len(reports)} tool(s), {invalid} invalid" + (
        f", {len(unreadable)} unreadable" if unreadable else "")
    failed = invalid or unreadable
    out.print(f"[red]{summary}[/]" if failed else f"[green]{summary}[/]")


# --------------------------------------------------------------------------- integrity


def integrity(
    path: Annotated[Path, typer.Argument(help="a tool directory, manifest, .py or .md file")],
    sign_key: Annotated[Path | None, typer.Option(
        "--sign-key", help="publisher's Ed25519 private key (PEM): also print the "
        "publisher_signature of the integrity (for POST /v1/tools/register)")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Print the canonical integrity (sha256:<hex>) of the tool source at PATH."""
    from domain.publisher_signature import sign_integrity
    from toolexec.usecases.authoring import source_integrity
    from toolexec.usecases.publish import publisher_private_key

    _require_existing([path], as_json)
    try:
        key = None if sign_key is None else publisher_private_key(sign_key)
        tool_id, version, value = source_integrity(path)
    except ToolexecError as error:
        fail_with(error, as_json)
    signature = None if key is None else sign_integrity(key, value)
    signed = {} if signature is None else {"publisher_signature": {
        "key_id": signature.key_id, "signature": signature.signature}}
    if as_json:
        echo_json({"tool_id": tool_id, "version": version, "integrity": value, **signed})
    else:
        typer.echo(value)
        if signature is not None:
            typer.echo(f"{signature.key_id} {signature.signature}")


# -------------------------------------------------------------------------------- lock


def lock(
    tool: Annotated[str, typer.Argument(help="TOOL or TOOL@RANGE (semver range)")],
    tools: Annotated[list[Path] | None, typer.Option(
        "--tools", help="tool directories (default: .ai/tools)")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="lockfile to write")] = None,
    strict: Annotated[bool, typer.Option(
        help="parents without child_schemas reject their children")] = False,
    registry_url: Annotated[str, typer.Option(help="registry recorded in the lockfile")] = LOCAL_REGISTRY_URL,
    definition_hash: Annotated[str | None, typer.Option(
        "--definition-hash", help="an mcp_tool's definition hash to pin (default: its "
        "pinned one, as `toolexec definitions list` shows)")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Freeze TOOL's resolved and verified chain to a lockfile.

    Resolves the chain from the built-in and local tools, verifies every link's
    integrity and checks parent -> child schemas. An MCP tool's entry also pins the
    definition its server announces (read from the definitions read model of this
    state directory when it exists)."""
    from toolexec.usecases.authoring import lock_chain

    tool_id, _, version_range = tool.partition("@")
    if not tool_id:
        bad_usage(f"expected TOOL or TOOL@RANGE, got {tool!r}", as_json)
    if tools:
        _require_existing(tools, as_json)
    try:
        lockfile, warnings = lock_chain(tool_id, version_range or "*", tools or [DEFAULT_TOOLS_DIR],
                                        strict=strict, registry_url=registry_url,
                                        definitions=_pinned_definitions(as_json),
                                        definition_hash=definition_hash)
    except ToolexecError as error:
        fail_with(error, as_json)
    for warning in warnings:
        err.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
    _write_lockfile(lockfile, output, as_json)


def _pinned_definitions(as_json: bool) -> dict[tuple[str, str], str]:
    """(server, MCP tool name) -> pinned definition hash, from this state directory's
    read model when one exists (a lock needs no running system, and makes none); with
    a running `up`, once it has folded a pin made just before (bounded)."""
    from toolexec.cli.definitions import read_pins
    from toolexec.settings import Settings

    settings = Settings()
    if not settings.database_url and not (settings.state_dir / "toolexec.db").exists():
        return {}
    pins = read_pins(settings, as_json)
    return {(pin["server_tool_id"], pin["mcp_tool_name"]): pin["definition_hash"]
            for pin in pins}


def _write_lockfile(lockfile: dict[str, Any], output: Path | None, as_json: bool) -> None:
    text = json.dumps(lockfile, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as error:
        bad_usage(f"cannot write {output}: {error.strerror or error}", as_json)
    if as_json:
        echo_json({"output": str(output), "lockfile": lockfile})
    else:
        err.print(f"lockfile written to [bold]{escape(str(output))}[/]")
