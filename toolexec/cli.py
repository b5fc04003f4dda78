"""The `toolexec` command line (Typer). Every command takes --json and exits 0 on
success, 1 on a failure carrying an E3xxx code, 2 on bad usage."""

from __future__ import annotations

import importlib.util

import typer

from toolexec import cli_authoring
from toolexec.logs import configure_logging
from toolexec.settings import Settings

app = typer.Typer(
    no_args_is_help=True,
    help="toolexec: an event-sourced tool execution layer for AI agents.",
)

# Authoring commands (no running system needed): validate, integrity, lock.
cli_authoring.register(app)

# --- Runtime commands (up, run, publish) live in toolexec.cli_runtime and register
# --- themselves here; the guard keeps the CLI usable before that module exists.
if importlib.util.find_spec("toolexec.cli_runtime"):
    from toolexec import cli_runtime

    cli_runtime.register(app)
importlib.import_module("toolexec.bench").register(app)  # toolexec bench (issue 8)


@app.callback()
def _configure() -> None:
    """Logs go to stderr (quiet by default; TOOLEXEC_LOG_LEVEL=INFO for more)."""
    configure_logging(Settings(), default_level="WARNING")


def main() -> None:
    """Entry point of the `toolexec` console script."""
    app()


if __name__ == "__main__":
    main()
