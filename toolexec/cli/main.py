"""The `toolexec` application (Typer): every command registered, and the entry point
of the console script. Every command takes --json and exits 0 on success, 1 on a
failure carrying an E3xxx code, 2 on bad usage.

Importing it is light (Typer, rich, the command modules): each command imports the
machinery it uses (settings, Kafka, SQL, the stack...) when it runs, so `--help`
starts quickly and so does the fork server of `projections rebuild`, which preloads
this module (`projections.rebuild_workers.preloaded_modules`).
`tests/unit/test_cli_imports.py` keeps it so."""

from __future__ import annotations

import sys

import typer

try:  # typer >= 0.22 ships its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer on the real click
    from click import exceptions as click_errors  # type: ignore[no-redef]

from domain.errors import ToolexecError
from toolexec.bench import command as bench
from toolexec.cli import (
    approval,
    authoring,
    broker,
    cancel,
    definitions,
    invocation_status,
    lifecycle,
    mcp,
    projections,
    runtime,
    security,
)
from toolexec.cli.output import USAGE, exit_code_of, print_error, wants_json

app = typer.Typer(
    no_args_is_help=True,
    help="toolexec: an event-sourced tool execution layer for AI agents.",
)

authoring.register(app)  # validate, integrity, lock: no running system needed
runtime.register(app)  # up, run, publish
cancel.register(app)  # cancel
invocation_status.register(app)  # status INVOCATION: timeline and progress
approval.register(app)  # approve, deny, approvals
lifecycle.register(app)  # deprecate, remove, restore
definitions.register(app)  # definitions list, approve
security.register(app)  # token issue, policy apply, keys
projections.register(app)  # projections rebuild, search, show, status, audit
broker.register(app)  # broker status, start, stop
bench.register(app)  # bench
mcp.register(app)  # mcp: search, load, execute, help for agents


@app.callback()
def _configure() -> None:
    """Logs go to stderr (quiet by default; TOOLEXEC_LOG_LEVEL=INFO for more)."""
    from toolexec.logs import configure_logging
    from toolexec.settings import Settings

    configure_logging(Settings(), default_level="WARNING")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `toolexec` console script. Usage errors (exit 2) and
    ToolexecErrors a command lets through (exit 1, or 2 for a malformed request) are
    answered here, as JSON when the command line has --json."""
    as_json = wants_json(argv)
    try:
        code = app(args=argv, standalone_mode=False)
    except click_errors.NoArgsIsHelpError as error:
        error.show()
        sys.exit(error.exit_code)
    except click_errors.ClickException as error:  # parsing, typer.BadParameter
        if as_json:
            print_error(USAGE, error.format_message(), as_json)
        else:
            error.show()
        sys.exit(error.exit_code)
    except click_errors.Abort:
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    except ToolexecError as error:
        print_error(error.code, error.message, as_json, error.details)
        sys.exit(exit_code_of(error))
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
