"""Authoring commands that need no running system: validate, integrity, lock.

Exit codes: 0 success, 1 a failure carrying an E3xxx code (invalid tool, integrity or
chain error), 2 bad usage (missing path, malformed argument).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from domain.chain import resolve_chain
from domain.child_validation import ensure_chain_valid
from domain.errors import ToolexecError
from domain.integrity import compute_integrity, seal, verify_chain
from domain.lockfile import freeze
from domain.model import Issue, ToolSource
from domain.publication import plan_publication
from domain.registry import InMemoryRegistry
from domain.validation import validate_source
from toolexec.cli_output import bad_usage, echo_json, fail
from toolexec.sources import (
    SourceError,
    bash_syntax_check,
    discover,
    load_builtin_sources,
    load_source,
)

DEFAULT_TOOLS_DIR = Path(".ai/tools")
LOCAL_REGISTRY_URL = "urn:toolexec:local"

out = Console()
err = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="machine-readable output")]


def register(app: typer.Typer) -> None:
    """Add the authoring commands to the `toolexec` application."""
    app.command("validate")(validate)
    app.command("integrity")(integrity)
    app.command("lock")(lock)


# ------------------------------------------------------------------------------ shared


def _fail(error: ToolexecError, as_json: bool) -> NoReturn:
    fail(error.code, error.message, as_json, error.details)


def _require_existing(paths: Iterable[Path], as_json: bool) -> None:
    for path in paths:
        if not path.exists():
            bad_usage(f"{path} does not exist", as_json)


def _display(origin: str) -> str:
    try:
        return str(Path(origin).relative_to(Path.cwd().resolve()))
    except ValueError:
        return origin


def _known_tools(sources: Iterable[ToolSource]) -> dict[str, str]:
    return {str(s.manifest.get("tool_id")): str(s.manifest.get("tool_type")) for s in sources}


def _errors(issues: Iterable[Issue]) -> list[Issue]:
    return [issue for issue in issues if issue.severity == "error"]


# ---------------------------------------------------------------------------- validate


def validate(
    paths: Annotated[list[Path], typer.Argument(help="tool sources or directories of tools")],
    as_json: JsonFlag = False,
) -> None:
    """Validate tool sources without publishing (layers 1-2).

    Checks the manifest, executor rules and per-type requirements of every tool found
    under PATH; exits 1 when any tool has an error."""
    _require_existing(paths, as_json)
    found = discover(paths)
    if not found:
        bad_usage(f"no tool sources found under {', '.join(map(str, paths))}", as_json)
    sources = [item for item in found if isinstance(item, ToolSource)]
    unreadable = [item for item in found if isinstance(item, SourceError)]
    known = _known_tools([*load_builtin_sources(), *sources])
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
    manifest = source.manifest
    return {
        "tool_id": manifest.get("tool_id"),
        "version": manifest.get("version"),
        "tool_type": manifest.get("tool_type"),
        "origin": source.origin,
        "layout": source.layout,
        "valid": not _errors(issues),
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
    as_json: JsonFlag = False,
) -> None:
    """Print the canonical integrity (sha256:<hex>) of the tool source at PATH."""
    _require_existing([path], as_json)
    try:
        tool_id, version, value = source_integrity(path)
    except ToolexecError as error:
        _fail(error, as_json)
    if as_json:
        echo_json({"tool_id": tool_id, "version": version, "integrity": value})
    else:
        typer.echo(value)


def source_integrity(path: Path) -> tuple[str, str, str]:
    """(tool_id, version, `sha256:<hex>` integrity) of the tool source at `path`.
    Raises ToolexecError (SourceError) when it cannot be read."""
    source = load_source(path)
    tool_id, version = _identity(source)
    return tool_id, version, compute_integrity(tool_id, version, source.manifest, source.files)


def _identity(source: ToolSource) -> tuple[str, str]:
    tool_id, version = source.manifest.get("tool_id"), source.manifest.get("version")
    if not isinstance(tool_id, str) or not isinstance(version, str):
        raise SourceError(f"{source.origin}: the manifest needs tool_id and version "
                          "to compute an integrity", details={"origin": source.origin})
    return tool_id, version


# -------------------------------------------------------------------------------- lock


def lock(
    tool: Annotated[str, typer.Argument(help="TOOL or TOOL@RANGE (semver range)")],
    tools: Annotated[list[Path] | None, typer.Option(
        "--tools", help="tool directories (default: .ai/tools)")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="lockfile to write")] = None,
    strict: Annotated[bool, typer.Option(
        help="parents without child_schemas reject their children")] = False,
    registry_url: Annotated[str, typer.Option(help="registry recorded in the lockfile")] = LOCAL_REGISTRY_URL,
    as_json: JsonFlag = False,
) -> None:
    """Freeze TOOL's resolved and verified chain to a lockfile.

    Resolves the chain from the built-in and local tools, verifies every link's
    integrity and checks parent -> child schemas."""
    tool_id, _, version_range = tool.partition("@")
    if not tool_id:
        bad_usage(f"expected TOOL or TOOL@RANGE, got {tool!r}", as_json)
    if tools:
        _require_existing(tools, as_json)
    try:
        lockfile, warnings = lock_chain(tool_id, version_range or "*", tools or [DEFAULT_TOOLS_DIR],
                                        strict=strict, registry_url=registry_url)
    except ToolexecError as error:
        _fail(error, as_json)
    for warning in warnings:
        err.print(f"[yellow]warning:[/] {escape(warning)}")
    _write_lockfile(lockfile, output, as_json)


def lock_chain(tool_id: str, version_range: str, tool_dirs: Sequence[Path], *,
               strict: bool = False, registry_url: str = LOCAL_REGISTRY_URL
               ) -> tuple[dict[str, Any], list[str]]:
    """The lockfile of `tool_id@version_range` resolved from the built-in tools and
    `tool_dirs` (every link verified, parent -> child schemas checked), and the
    warnings met. Raises ToolexecError (E31xx) when it cannot be resolved."""
    registry = _local_registry(tool_dirs)
    chain = resolve_chain(registry, tool_id, version_range)
    verify_chain(chain)
    warnings = [*chain.warnings, *ensure_chain_valid(chain, strict=strict)]
    lockfile = freeze(chain, generated_at=_now(), registry_url=registry_url)
    return lockfile, list(dict.fromkeys(warnings))


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _local_registry(tool_dirs: Sequence[Path]) -> InMemoryRegistry:
    """Built-in tools plus every valid source under `tool_dirs`, sealed and pinned to
    their executors as publishing them would; unreadable or invalid sources are
    reported on stderr and left out."""
    found = discover([d for d in tool_dirs if d.exists()])
    for error in (item for item in found if isinstance(item, SourceError)):
        err.print(f"[yellow]skipped:[/] {escape(str(error))}")
    sources = [*load_builtin_sources(), *(i for i in found if isinstance(i, ToolSource))]
    known = _known_tools(sources)
    sealed = []
    for source in sources:
        problems = _errors(validate_source(source, bash_syntax=bash_syntax_check,
                                           known_tools=known))
        if problems:
            err.print(f"[yellow]skipped:[/] {escape(_display(source.origin))}: "
                      f"{len(problems)} validation error(s), first: "
                      f"{escape(problems[0].path)} {escape(problems[0].message)}")
            continue
        try:
            sealed.append(seal(source))
        except ToolexecError as error:
            err.print(f"[yellow]skipped:[/] {escape(_display(source.origin))}: {escape(str(error))}")
    registry = InMemoryRegistry()
    for plan in plan_publication(sealed, InMemoryRegistry()):
        if plan.outcome == "new":
            registry.add(plan.version)
        elif plan.error is not None:
            err.print(f"[yellow]skipped:[/] {escape(plan.version.tool_id)}@"
                      f"{escape(plan.version.version)}: {escape(str(plan.error))}")
    return registry


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
