"""CLI commands that talk to a running system: up, run, publish."""

from __future__ import annotations

import asyncio
import json
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from toolexec.runtime_file import (
    acquire_up_lock,
    read_runtime,
    remove_runtime,
    replace_stale_runtime,
    runtime_status,
    write_runtime,
)
from toolexec.settings import Settings
from toolexec.sources import bash_syntax_check, collect_sources

if TYPE_CHECKING:
    from contracts.envelope import Envelope
    from toolexec.client import Progress
    from toolexec.read_models import ReadModels

# The client, the stack and the publishing code (Kafka, FastStream, SQLAlchemy) are
# imported by the commands that use them, so that `toolexec --help` starts quickly.

err = Console(stderr=True)
out = Console()


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("run")(run)
    app.command("publish")(publish)


def _tool_events(tool_dirs: list[Path], settings: Settings) -> list[Envelope]:
    from toolexec.publishing import publish_event

    now = datetime.now(UTC)
    sources = collect_sources(tool_dirs, settings)
    known = {str(s.manifest.get("tool_id")): str(s.manifest.get("tool_type")) for s in sources}
    return [publish_event(s, now=now, bash_syntax=bash_syntax_check, known_tools=known)
            for s in sources]


def _report_rejections(events: list[Envelope]) -> None:
    for event in events:
        if event.type == "tool.publish.rejected":
            data = event.data
            err.print(f"[yellow]rejected[/] {data.origin}: "
                      + "; ".join(f"{i['path']}: {i['message']}" for i in data.issues))


def up(
    tools: Annotated[list[Path], typer.Option("--tools", help="extra tool directories")] = [],  # noqa: B006
    gateway_port: Annotated[int | None, typer.Option(
        "--gateway-port", min=0, max=65535,
        help="HTTP gateway port (default TOOLEXEC_GATEWAY_PORT, 0 = a free port)")] = None,
) -> None:
    """Run the whole system (embedded default: broker, consumers, read models, HTTP
    gateway); Ctrl-C stops it."""
    from toolexec.broker_control import BrokerUnavailable

    settings = Settings()
    if gateway_port is not None:
        settings = settings.model_copy(update={"gateway_port": gateway_port})
    lock = acquire_up_lock(settings)
    if lock is None:
        status = runtime_status(settings)
        err.print(f"[red]E3001[/] {escape(status.describe())} for state directory "
                  f"{escape(str(settings.state_dir.resolve()))}: one toolexec up per state "
                  "directory (stop it first, or set TOOLEXEC_STATE_DIR)", highlight=False)
        raise typer.Exit(1)
    try:
        stale = replace_stale_runtime(settings)
        if stale.state == "stale" and stale.info is not None:
            err.print(f"[yellow]warning[/] {escape(stale.describe())}; replacing its "
                      f"{escape(str(settings.runtime_file))}", highlight=False)
        asyncio.run(_up(settings, tools))
    except BrokerUnavailable as error:
        err.print(f"[red]{error.code}[/] {escape(error.message)}", highlight=False)
        raise typer.Exit(1) from None
    finally:
        lock.release()


async def _up(settings: Settings, tools: list[Path]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    from toolexec.gateway_server import serve_gateway  # FastAPI/uvicorn only for `up`
    from toolexec.read_models import start_read_models
    from toolexec.stack import Stack

    started: list[ReadModels] = []

    async def read_models(settings: Settings, bootstrap: str) -> ReadModels:
        started.append(await start_read_models(settings, bootstrap))
        return started[-1]

    async with Stack(settings, read_models_factory=read_models, keep_broker=True) as stack, \
            serve_gateway(stack, started[0], settings) as gateway_url:
        events = _tool_events(tools, settings)
        await stack.publish_all(events)
        _report_rejections(events)
        broker = stack.embedded
        write_runtime(settings, {
            "kafka_bootstrap": stack.bootstrap, "database_url": settings.effective_database_url,
            "gateway_url": gateway_url,
            "broker_pid": broker.pid if broker else None,
            "broker_supervisor_pid": broker.supervisor_pid if broker else None})
        published = sum(1 for e in events if e.type == "tool.published")
        where = (f"embedded Tansu, supervisor pid {broker.supervisor_pid}, log archived in "
                 f"{settings.state_dir / 'log'}" if broker else "external")
        err.print(f"toolexec up: broker [bold]{stack.bootstrap}[/] ({escape(where)}), "
                  f"{published} tool(s) published, consumers running.", highlight=False)
        err.print(f"toolexec up: gateway [bold]{gateway_url}[/] (status page {gateway_url}/, "
                  f"API {gateway_url}/docs). Ctrl-C stops.", highlight=False)
        try:
            await stop.wait()
        finally:
            remove_runtime(settings)
    if broker is not None:
        err.print("toolexec up: stopped; the embedded broker keeps running with its log "
                  "(`toolexec broker stop` stops it)")
    else:
        err.print("toolexec up: stopped")


def _parse_params(pairs: list[str], params_json: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if params_json:
        loaded = json.loads(params_json)
        if not isinstance(loaded, dict):
            raise typer.BadParameter("--params must be a JSON object")
        params.update(loaded)
    for pair in pairs:
        if "=" not in pair:
            raise typer.BadParameter(f"-p expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    return params


def run(
    tool: Annotated[str, typer.Argument(help="TOOL or TOOL@RANGE")],
    param: Annotated[list[str], typer.Option("-p", "--param", help="key=value")] = [],  # noqa: B006
    params: Annotated[str | None, typer.Option("--params", help="parameters as JSON")] = None,
    lock: Annotated[Path | None, typer.Option("--lock", help="lockfile to pin the chain")] = None,
    token: Annotated[str | None, typer.Option("--token", help="capability token (JWT)")] = None,
    tools: Annotated[list[Path], typer.Option("--tools", help="extra tool directories")] = [],  # noqa: B006
    timeout: Annotated[float, typer.Option(help="seconds to wait for the result")] = 120.0,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Invoke a tool through the pipeline and print its result."""
    try:
        parameters = _parse_params(param, params)
        lockfile = json.loads(lock.read_text()) if lock else None
    except (ValueError, OSError) as exc:
        err.print(f"[red]bad usage:[/] {exc}")
        raise typer.Exit(2) from exc
    tool_id, _, version_range = tool.partition("@")
    from toolexec.broker_control import BrokerUnavailable
    from toolexec.client import InvocationNotDelivered, InvocationUnresolved

    settings = Settings()
    _warn_if_up_is_gone(settings)
    try:
        terminal = asyncio.run(_run(settings, tool_id, version_range or "*", parameters,
                                    lockfile, token, tools, timeout, quiet=as_json))
    except (InvocationNotDelivered, InvocationUnresolved,  # E3001 / E3002
            BrokerUnavailable) as error:  # E3801: the embedded broker did not start
        if as_json:
            out.print_json(data={"error": error.to_dict()})
        else:
            err.print(f"[red]{error.code}[/] {escape(error.message)}", highlight=False)
        raise typer.Exit(1) from None
    raise typer.Exit(_print_terminal(terminal, as_json))


async def _run(settings: Settings, tool_id: str, version_range: str, parameters: dict[str, Any],
               lockfile: dict[str, Any] | None, token: str | None, tools: list[Path],
               timeout: float, *, quiet: bool) -> Envelope:
    def progress(event: Envelope) -> None:
        if not quiet:
            err.print(f"[dim]{describe_progress(event)}[/]", highlight=False)

    return await invoke_tool(settings, tool_id, version_range, parameters, lockfile=lockfile,
                             token=token, tools=tools, timeout=timeout, progress=progress,
                             report_rejections=not quiet)


async def invoke_tool(settings: Settings, tool_id: str, version_range: str,
                      parameters: dict[str, Any], *, lockfile: dict[str, Any] | None = None,
                      token: str | None = None, tools: list[Path] | None = None,
                      timeout: float = 120.0, progress: Progress | None = None,
                      report_rejections: bool = False) -> Envelope:
    """Invoke a tool through the pipeline of the running `up` (found via
    .toolexec/runtime.json), or of an embedded stack started for this call when none
    runs; the tools under `tools` are published first. Returns the terminal event."""
    from toolexec.client import InvocationClient
    from toolexec.stack import Stack

    tools = tools or []
    runtime = read_runtime(settings)
    if runtime is not None:
        async with InvocationClient(runtime["kafka_bootstrap"]) as client:
            if tools:
                for event in _tool_events(tools, settings):
                    await client.send(event)
            return await client.invoke(tool_id, parameters, version_range=version_range,
                                       lockfile=lockfile, token=token, timeout=timeout,
                                       progress=progress)
    async with Stack(settings) as stack:
        events = _tool_events(tools, settings)
        await stack.publish_all(events)
        if report_rejections:
            _report_rejections(events)
        async with InvocationClient(stack.bootstrap) as client:
            return await client.invoke(tool_id, parameters, version_range=version_range,
                                       lockfile=lockfile, token=token, timeout=timeout,
                                       progress=progress)


def describe_progress(event: Envelope) -> str:
    """One line for people following an invocation on stderr."""
    data = event.data
    if event.type == "tool.chain.resolved":
        return "resolved  " + " -> ".join(f"{link.tool_id}@{link.version}" for link in
                                          data.chain) + "".join(f"\nwarning   {w}"
                                                                for w in data.warnings)
    if event.type == "tool.permission.decided":
        return f"authorized ({data.reason})" if data.decision == "allow" else f"denied: {data.reason}"
    if event.type == "tool.execution.started":
        return f"executing attempt {data.attempt} via {data.primitive} (sandbox: {data.sandbox})"
    if event.type == "tool.execution.finished":
        return f"finished  attempt {data.attempt}: {data.outcome} in {data.duration_ms:.1f} ms"
    return event.type


def _print_terminal(terminal: Envelope, as_json: bool) -> int:
    data = terminal.data
    if as_json:
        out.print_json(data=json.loads(data.model_dump_json()))
    elif terminal.type == "tool.invoke.completed":
        result = data.result
        out.print(result if isinstance(result, str) else json.dumps(result, indent=2),
                  markup=False, highlight=False)
    else:
        err.print(f"[red]{data.error.code}[/] {data.error.message}")
        if data.error.details:
            err.print(json.dumps(data.error.details, indent=2), markup=False, highlight=False)
    return 0 if terminal.type == "tool.invoke.completed" else 1


def publish(
    paths: Annotated[list[Path], typer.Argument(help="tool sources")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Validate and publish tools to a running system (tool.published / rejected)."""
    settings = Settings()
    for path in paths:
        if not path.exists():
            err.print(f"[red]bad usage:[/] {path} does not exist")
            raise typer.Exit(2)
    bootstrap = settings.kafka_bootstrap or _running_bootstrap(settings)
    if not bootstrap:
        status = runtime_status(settings)
        hint = f"{status.describe()}; " if status.state == "stale" else ""
        err.print(f"[red]E3001[/] no running toolexec found: {escape(hint)}start "
                  "`toolexec up` first or set TOOLEXEC_KAFKA_BOOTSTRAP", highlight=False)
        raise typer.Exit(1)
    if read_runtime(settings) is None:
        _warn_if_up_is_gone(settings)
    events = [e for e in _tool_events(paths, settings) if _from_paths(e, paths)]
    asyncio.run(_send_all(bootstrap, events))
    rejected = [e for e in events if e.type == "tool.publish.rejected"]
    if as_json:
        out.print_json(data=[{"type": e.type, **json.loads(e.data.model_dump_json())}
                             for e in events])
    else:
        for e in events:
            label = "published" if e.type == "tool.published" else "[red]rejected[/]"
            err.print(f"{label} {e.data.tool_id}@{e.data.version}")
        _report_rejections(events)
    raise typer.Exit(1 if rejected else 0)


def _warn_if_up_is_gone(settings: Settings) -> None:
    """Say so when the `up` of this state directory ended without stopping cleanly."""
    status = runtime_status(settings)
    if status.state == "stale" and not settings.kafka_bootstrap:
        err.print(f"[yellow]warning[/] {escape(status.describe())}; this command uses the "
                  "state directory's log without it", highlight=False)


def _running_bootstrap(settings: Settings) -> str | None:
    """The running `up`'s broker, else the state directory's embedded broker if it runs
    (a published tool waits in its log for the next `up`)."""
    from toolexec.broker_control import running_broker

    runtime = read_runtime(settings)
    if runtime is not None:
        return str(runtime["kafka_bootstrap"])
    broker = running_broker(settings)
    return broker.bootstrap if broker is not None else None


def _from_paths(event: Envelope, paths: list[Path]) -> bool:
    origin = getattr(event.data, "source", None) or getattr(event.data, "origin", None) or ""
    return any(str(origin).startswith(str(p.resolve())) or str(origin).startswith(str(p))
               for p in paths)


async def _send_all(bootstrap: str, events: list[Envelope]) -> None:
    from toolexec.client import InvocationClient

    async with InvocationClient(bootstrap) as client:
        for event in events:
            await client.send(event)
