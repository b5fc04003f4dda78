"""`toolexec status INVOCATION`: an invocation's timeline with its progress, from the
invocations read model (the database `toolexec up` uses), once it has folded the log
up to its end as it was when asked (bounded: `TOOLEXEC_READ_YOUR_WRITES_SECONDS`).

No token is checked: whoever holds the database URL (or can read the embedded
database file) is the operator and could read every row with any SQL client; callers
limited to their own invocations use the gateway (docs/rights.md).

On a terminal it draws the latest progress as a bar; `--follow` redraws it until the
invocation ends; `--json` prints the timeline document of `usecases.timeline`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from domain.errors import ToolexecError
from toolexec.cli.output import echo_json, fail_with
from toolexec.cli.projections import with_engine

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from toolexec.settings import Settings

out = Console()
err = Console(stderr=True)
FOLLOW_POLL_SECONDS = 1.0


def register(app: typer.Typer) -> None:
    """Add `status` (alias `show-invocation`) to the toolexec CLI."""
    app.command("status")(status)
    app.command("show-invocation", hidden=True)(status)


def _read(settings: Settings, invocation_id: str, as_json: bool) -> dict[str, Any]:
    from toolexec.usecases.timeline import invocation_timeline

    async def work(engine: AsyncEngine) -> dict[str, Any]:
        return await invocation_timeline(engine, invocation_id)

    try:
        return with_engine(settings, work, as_json, after=("invocations",))
    except ToolexecError as error:
        fail_with(error, as_json)


def status(
    invocation_id: Annotated[str, typer.Argument(metavar="INVOCATION", help="invocation id")],
    follow: Annotated[bool, typer.Option("--follow", "-f",
                                         help="poll until the invocation ends")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Show an invocation's timeline, its latest progress and its checkpoints."""
    from toolexec.settings import Settings

    settings = Settings()
    document = _read(settings, invocation_id, as_json)
    if follow and not document["ended"]:
        document = _follow(settings, invocation_id, document, as_json)
    if as_json:
        echo_json({"invocation": document})
        return
    _print(document)
    if not follow and not document["ended"]:
        out.print(_bar(document))


def _follow(settings: Settings, invocation_id: str, document: dict[str, Any],
            as_json: bool) -> dict[str, Any]:
    """Poll the read model until the invocation ends, drawing its progress (on stderr,
    on a terminal only: the JSON document on stdout stays the last state alone)."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                  TimeElapsedColumn(), console=err, disable=as_json) as bar:
        task = bar.add_task(_label(document), total=None)
        while not document["ended"]:
            progress = document["progress"]
            fraction = None if progress is None else progress["fraction"]
            bar.update(task, description=_label(document),
                       total=None if fraction is None else 1.0, completed=fraction or 0.0)
            time.sleep(FOLLOW_POLL_SECONDS)
            document = _read(settings, invocation_id, as_json)
        bar.update(task, description=_label(document), total=1.0, completed=1.0)
    return document


def _label(document: dict[str, Any]) -> str:
    progress = document["progress"]
    message = progress["message"] if progress else ""
    return escape(f"{document['status']} {message}".strip())


def _bar(document: dict[str, Any]) -> Table:
    from rich.progress_bar import ProgressBar

    progress = document["progress"] or {}
    fraction = progress.get("fraction")
    grid = Table.grid(padding=(0, 1))
    grid.add_row(ProgressBar(total=1.0 if fraction is not None else None,
                             completed=fraction or 0.0, width=40),
                 "-" if fraction is None else f"{fraction:.0%}",
                 escape(progress.get("message", "")))
    return grid


def _print(document: dict[str, Any]) -> None:
    checkpoints = document["checkpoints"]
    out.print(f"[bold]{escape(document['invocation_id'])}[/] "
              f"{escape(str(document['tool_id']))}@{escape(str(document['version']))} "
              f"{document['status']}, attempts {document['attempts']}, "
              f"checkpoints {checkpoints['count']} ({checkpoints['stored_bytes']} of "
              f"{checkpoints['bytes']} bytes stored)", highlight=False)
    table = Table("time", "phase", "attempt", "detail")
    for entry in document["timeline"]:
        table.add_row(entry["time"], entry["phase"], str(entry.get("attempt", "")),
                      escape(_detail(entry)))
    out.print(table)
    if document["error"]:
        out.print(f"[red]{document['error']['code']}[/] {escape(document['error']['message'])}")


def _detail(entry: dict[str, Any]) -> str:
    if entry["phase"] == "progress":
        fraction = entry.get("fraction")
        share = "" if fraction is None else f"{fraction:.0%} "
        return share + str(entry.get("message", ""))
    if entry["phase"] == "checkpoint":
        return f"#{entry['sequence']} {entry['stored_size']}/{entry['size']} bytes " \
               f"({entry['compression']})"
    for name in ("decision", "outcome", "error_code", "stage"):
        if name in entry:
            return str(entry[name])
    return ""
