"""How the CLI commands answer: JSON documents on stdout with `--json`, readable
lines on stderr otherwise; exit 1 for a failure carrying an E3xxx code, 2 for bad
usage."""

from __future__ import annotations

import json
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

err = Console(stderr=True)


def echo_json(data: Any) -> None:
    """`data` as an indented JSON document on stdout (keys sorted, non-JSON as text)."""
    typer.echo(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, default=str))


def fail(code: str, message: str, as_json: bool, details: dict[str, Any] | None = None,
         exit_code: int = 1) -> NoReturn:
    """Report a failure (`{"error": {code, message, details}}` with --json) and exit."""
    if as_json:
        echo_json({"error": {"code": code, "message": message, "details": details or {}}})
    else:
        err.print(f"[red]{code}[/] {escape(message)}", highlight=False)
    raise typer.Exit(exit_code)


def bad_usage(message: str, as_json: bool) -> NoReturn:
    """Report a usage error (code "usage") and exit 2."""
    if as_json:
        echo_json({"error": {"code": "usage", "message": message, "details": {}}})
    else:
        err.print(f"[red]bad usage:[/] {escape(message)}", highlight=False)
    raise typer.Exit(2)
