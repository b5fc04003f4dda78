"""`toolexec broker status|start|stop`: the embedded broker of a state directory.

The embedded profile's broker runs as its own process tree (a supervisor, Tansu,
the archive of the log under `<state_dir>/log/`), started by `toolexec up` or
`toolexec run` when none runs and kept across `up` restarts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from toolexec.cli.output import echo_json, fail

if TYPE_CHECKING:
    from toolexec.settings import Settings

# The settings and the broker control (aiokafka) are imported by the commands, so that
# `toolexec --help` starts quickly.

err = Console(stderr=True)
JsonFlag = Annotated[bool, typer.Option("--json", help="machine-readable output")]
broker_app = typer.Typer(help="The embedded broker and the archive of its log.",
                         no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add `broker status|start|stop` to the toolexec CLI."""
    app.add_typer(broker_app, name="broker")


def _embedded(settings: Settings, as_json: bool) -> None:
    if not settings.embedded:
        fail("E3004", "TOOLEXEC_KAFKA_BOOTSTRAP is set: there is no embedded broker to manage",
             as_json, {"kafka_bootstrap": settings.kafka_bootstrap})


def broker_report(settings: Settings) -> dict[str, Any]:
    """Everything `broker status` shows, as data."""
    from toolexec.broker_control import (
        archive_dir,
        read_state,
        supervisor_log_path,
        supervisor_running,
    )
    from toolexec.log_archive import LogArchive
    from toolexec.runtime_file import runtime_status

    state = read_state(settings.state_dir)
    running = supervisor_running(state)
    data = dict(state.data) if state is not None else {}
    archive = LogArchive(archive_dir(settings.state_dir), fsync="never", read_only=True)
    up = runtime_status(settings)
    return {
        "running": running,
        "status": data.get("status", "absent") if running else
        ("stopped" if data.get("status") == "stopped" else
         ("gone" if state is not None else "absent")),
        "supervisor_pid": data.get("supervisor_pid") if running else None,
        "broker_pid": data.get("broker_pid") if running else None,
        "gate_pid": data.get("gate_pid") if running else None,
        "bootstrap": data.get("bootstrap") if running else None,
        "mode": data.get("mode"),
        "cluster_id": data.get("cluster_id") or (archive.identity() or {}).get("cluster_id"),
        "incarnation": data.get("incarnation"),
        "restarts": data.get("restarts"),
        "last_restart_reason": data.get("last_restart_reason"),
        "clean_stop": data.get("clean_stop"),
        "archive": str(archive.root),
        "archive_bytes": archive.size_bytes(),
        "archived": data.get("archived") or
        {f"{t}/{p}": end for (t, p), end in sorted(archive.ends().items())},
        "archive_lag": data.get("archive_lag") or {},
        "restore": data.get("restore"),
        "error": data.get("error"),
        "log": str(supervisor_log_path(settings.state_dir)),
        "up": up.describe() if up.state != "absent" else None,
    }


@broker_app.command("status")
def status(as_json: JsonFlag = False) -> None:
    """Whether the state directory's broker runs, where, and how much is archived."""
    from toolexec.settings import Settings

    settings = Settings()
    _embedded(settings, as_json)
    report = broker_report(settings)
    if as_json:
        echo_json(report)
        return
    if report["running"]:
        err.print(f"broker [bold]{report['status']}[/] at {report['bootstrap']} "
                  f"(supervisor pid {report['supervisor_pid']}, Tansu pid {report['broker_pid']}, "
                  f"{report['mode']}, incarnation {report['incarnation']}, "
                  f"restarts {report['restarts']})", highlight=False)
    else:
        err.print(f"broker {report['status']} (not running)", highlight=False)
    records = sum(report["archived"].values())
    err.print(f"log {report['cluster_id']}: archive {report['archive']} "
              f"({report['archive_bytes']:,} bytes, log ends sum {records:,})", highlight=False)
    if report["archive_lag"]:
        err.print(f"[yellow]not yet archived[/]: {report['archive_lag']}", highlight=False)
    if report["last_restart_reason"]:
        err.print(f"last restart: {escape(str(report['last_restart_reason']))}", highlight=False)
    if report["error"]:
        err.print(f"[red]error[/]: {escape(str(report['error']))}", highlight=False)
    if report["up"]:
        err.print(escape(report["up"]), highlight=False)


@broker_app.command("start")
def start(as_json: JsonFlag = False) -> None:
    """Start the state directory's broker (restoring its log) unless it runs already."""
    import asyncio

    from toolexec.broker_control import BrokerUnavailable, ensure_broker
    from toolexec.settings import Settings

    settings = Settings()
    _embedded(settings, as_json)
    try:
        broker = asyncio.run(ensure_broker(settings))
    except BrokerUnavailable as error:
        fail(error.code, error.message, as_json)
    if as_json:
        echo_json(broker_report(settings))
    else:
        err.print(f"broker ready at {broker.bootstrap} (supervisor pid {broker.supervisor_pid})",
                  highlight=False)


@broker_app.command("stop")
def stop(force: Annotated[bool, typer.Option(
        "--force", help="stop it even while a toolexec up uses it")] = False,
         as_json: JsonFlag = False) -> None:
    """Stop the state directory's broker: it archives what is left, then exits."""
    from toolexec.broker_control import stop_broker
    from toolexec.runtime_file import runtime_status
    from toolexec.settings import Settings

    settings = Settings()
    _embedded(settings, as_json)
    up = runtime_status(settings)
    if up.state == "running" and not force:
        fail("E3001", f"{up.describe()} and uses this broker: stop it first (or --force; "
             "records it writes while the broker stops may be lost)", as_json, up.info)
    state = stop_broker(settings)
    if state is None:
        if as_json:
            echo_json({"stopped": False, "reason": "not running"})
        else:
            err.print("broker not running")
        return
    result = {"stopped": True, "clean_stop": state.data.get("clean_stop"),
              "archived": state.data.get("archived"), "status": state.status}
    if as_json:
        echo_json(result)
    else:
        note = "everything archived" if result["clean_stop"] else \
            "[yellow]it stopped before archiving everything[/]"
        err.print(f"broker stopped ({note})", highlight=False)
    if not result["clean_stop"]:
        raise typer.Exit(1)
