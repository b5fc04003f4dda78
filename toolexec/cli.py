"""The `toolexec` command line (Typer). Every command takes --json and exits 0 on
success, 1 on a failure carrying an E3xxx code, 2 on bad usage."""

from __future__ import annotations

import typer

from toolexec import (
    bench,
    cli_authoring,
    cli_broker,
    cli_cancel,
    cli_lifecycle,
    cli_mcp,
    cli_projections,
    cli_runtime,
    cli_security,
)
from toolexec.logs import configure_logging
from toolexec.settings import Settings

app = typer.Typer(
    no_args_is_help=True,
    help="toolexec: an event-sourced tool execution layer for AI agents.",
)

cli_authoring.register(app)  # validate, integrity, lock: no running system needed
cli_runtime.register(app)  # up, run, publish
cli_cancel.register(app)  # cancel
cli_lifecycle.register(app)  # deprecate, remove, restore
cli_security.register(app)  # token issue, policy apply, keys
cli_projections.register(app)  # projections rebuild, search, show, status, audit
cli_broker.register(app)  # broker status, start, stop
bench.register(app)  # bench
cli_mcp.register(app)  # mcp: search, load, execute, help for agents


@app.callback()
def _configure() -> None:
    """Logs go to stderr (quiet by default; TOOLEXEC_LOG_LEVEL=INFO for more)."""
    configure_logging(Settings(), default_level="WARNING")


def main() -> None:
    """Entry point of the `toolexec` console script."""
    app()


if __name__ == "__main__":
    main()
