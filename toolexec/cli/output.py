"""How the CLI commands answer: JSON documents on stdout with `--json`, readable
lines on stderr otherwise; exit 1 for a failure carrying an E3xxx code, 2 for bad
usage (a malformed request: E3004)."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from domain.errors import InvalidRequest, ToolexecError

err = Console(stderr=True)

USAGE = "E3004"  # invalid request format: the code of every bad usage


def echo_json(data: Any) -> None:
    """`data` as an indented JSON document on stdout (keys sorted, non-JSON as text)."""
    typer.echo(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, default=str))


def exit_code_of(error: ToolexecError) -> int:
    """2 for a malformed request (bad usage), 1 for any other failure."""
    return 2 if isinstance(error, InvalidRequest) else 1


def print_error(code: str, message: str, as_json: bool,
                details: dict[str, Any] | None = None) -> None:
    """Show a failure: `{"error": {code, message, details}}` with --json, a line on
    stderr otherwise."""
    if as_json:
        echo_json({"error": {"code": code, "message": message, "details": details or {}}})
    else:
        err.print(f"[red]{code}[/] {escape(message)}", highlight=False)


def fail(code: str, message: str, as_json: bool, details: dict[str, Any] | None = None,
         exit_code: int = 1) -> NoReturn:
    """Report a failure and exit (1 by default)."""
    print_error(code, message, as_json, details)
    raise typer.Exit(exit_code)


def fail_with(error: ToolexecError, as_json: bool) -> NoReturn:
    """Report a ToolexecError and exit with its exit code (`exit_code_of`)."""
    fail(error.code, error.message, as_json, error.details, exit_code_of(error))


def bad_usage(message: str, as_json: bool) -> NoReturn:
    """Report a usage error (E3004) and exit 2."""
    fail(USAGE, message, as_json, exit_code=2)


def wants_json(argv: list[str] | None = None) -> bool:
    """Whether the command line asks for JSON answers (for errors raised before the
    command's own --json option is parsed)."""
    return "--json" in (sys.argv[1:] if argv is None else argv)
