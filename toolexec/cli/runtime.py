"""CLI commands that talk to a running system: up, run, publish."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from domain.errors import ToolexecError
from toolexec.cli.output import echo_json, fail_with

if TYPE_CHECKING:
    from contracts.envelope import Envelope
    from toolexec.publishing import Publication
    from toolexec.settings import Settings

# The settings, the use cases, the client, the stack and the publishing code (Kafka,
# FastStream, SQLAlchemy) are imported by the commands that use them, so that
# `toolexec --help` starts quickly.

err = Console(stderr=True)
out = Console()


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("run")(run)
    app.command("publish")(publish)


def _report_rejections(publications: list[Publication]) -> None:
    for publication in publications:
        if publication.status == "rejected" and publication.event is not None:
            data = publication.event.data
            err.print(f"[yellow]rejected[/] {escape(data.origin)} ({data.error.code}): "
                      + "; ".join(escape(f"{i.path}: {i.message}") for i in data.issues),
                      highlight=False)


def up(
    tools: Annotated[list[Path], typer.Option("--tools", help="extra tool directories")] = [],  # noqa: B006
    gateway_port: Annotated[int | None, typer.Option(
        "--gateway-port", min=0, max=65535,
        help="HTTP gateway port (default TOOLEXEC_GATEWAY_PORT, 0 = a free port)")] = None,
) -> None:
    """Run the whole system (embedded default: broker, consumers, read models, HTTP
    gateway); Ctrl-C stops it."""
    import asyncio

    from toolexec.broker_control import BrokerUnavailable
    from toolexec.keys import trust_store
    from toolexec.runtime_file import acquire_up_lock, replace_stale_runtime, runtime_status
    from toolexec.settings import Settings

    settings = Settings()
    if gateway_port is not None:
        settings = settings.model_copy(update={"gateway_port": gateway_port})
    try:
        trust_store(settings)  # a bad trust store entry stops `up` before anything starts
    except ToolexecError as error:
        fail_with(error, False)
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
    import asyncio

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    from toolexec.broker_control import state_gone_error
    from toolexec.runtime_file import remove_runtime, write_runtime
    from toolexec.system import running_system  # FastAPI, uvicorn, Kafka only for `up`

    async with running_system(settings, tools) as system:
        stack, gateway_url, publications = system.stack, system.gateway_url, system.publications
        _report_rejections(publications)
        broker = stack.embedded
        write_runtime(settings, {
            "kafka_bootstrap": stack.bootstrap, "database_url": settings.effective_database_url,
            "gateway_url": gateway_url, "require_auth": settings.auth_required,
            "broker_pid": broker.pid if broker else None,
            "broker_supervisor_pid": broker.supervisor_pid if broker else None})
        published = sum(1 for p in publications if p.status == "published")
        unchanged = sum(1 for p in publications if p.status == "unchanged")
        where = (f"embedded Tansu, supervisor pid {broker.supervisor_pid}, log archived in "
                 f"{settings.state_dir / 'log'}" if broker else "external")
        err.print(f"toolexec up: broker [bold]{stack.bootstrap}[/] ({escape(where)}), "
                  f"{published} tool(s) published ({unchanged} already there), "
                  "consumers running.", highlight=False)
        err.print(f"toolexec up: gateway [bold]{gateway_url}[/] (status page {gateway_url}/, "
                  f"API {gateway_url}/docs). Ctrl-C stops.", highlight=False)
        gone = asyncio.create_task(stack.state_gone.wait())
        gone.add_done_callback(lambda _: stop.set())
        try:
            await stop.wait()
        finally:
            gone.cancel()
            remove_runtime(settings)
    if stack.state_gone.is_set():
        raise state_gone_error(settings.state_dir)
    if broker is not None:
        err.print("toolexec up: stopped; the embedded broker keeps running with its log "
                  "(`toolexec broker stop` stops it)")
    else:
        err.print("toolexec up: stopped")


def run(
    tool: Annotated[str, typer.Argument(help="TOOL or TOOL@RANGE")],
    param: Annotated[list[str], typer.Option("-p", "--param", help="key=value")] = [],  # noqa: B006
    params: Annotated[str | None, typer.Option("--params", help="parameters as JSON")] = None,
    lock: Annotated[Path | None, typer.Option("--lock", help="lockfile to pin the chain")] = None,
    token: Annotated[str | None, typer.Option("--token", help="capability token (JWT)")] = None,
    tools: Annotated[list[Path], typer.Option("--tools", help="extra tool directories")] = [],  # noqa: B006
    timeout: Annotated[float, typer.Option(help="seconds to wait for the result")] = 120.0,
    callback_url: Annotated[str | None, typer.Option(
        "--callback-url", help="also POST the result there, signed (a host of "
        "TOOLEXEC_CALLBACK_HOSTS)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Invoke a tool through the pipeline and print its result. With authorization on,
    the token must also hold the publish scope for tools of `--tools` not yet published."""
    import asyncio

    from toolexec.settings import Settings
    from toolexec.usecases.invoke import ToolSpec, invoke_tool, parse_parameters, read_lockfile

    settings = Settings()
    try:
        spec = ToolSpec.parse(tool)
        parameters = parse_parameters(param, params, settings.max_parameter_bytes)
        lockfile = read_lockfile(lock)
    except ToolexecError as error:  # E3004: a malformed request, bad usage
        fail_with(error, as_json)
    from toolexec.broker_control import BrokerUnavailable

    _warn_if_up_is_gone(settings)

    def progress(event: Envelope) -> None:
        if not as_json:
            err.print(f"[dim]{describe_progress(event)}[/]", highlight=False)

    try:
        terminal = asyncio.run(invoke_tool(
            settings, spec, parameters, lockfile=lockfile, token=token or settings.token,
            tools=tools, timeout=timeout, progress=progress,
            on_published=None if as_json else _report_rejections, callback_url=callback_url))
    except (BrokerUnavailable,  # E3801: the embedded broker did not start
            ToolexecError) as error:  # E3001 / E3002 / E3004 / E32xx ...
        fail_with(error, as_json)
    raise typer.Exit(_print_terminal(terminal, as_json))


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
    if event.type == "tool.execution.progressed":
        share = "" if data.fraction is None else f"{data.fraction:.0%} "
        return f"progress  {share}{escape(data.message)}"
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
    token: Annotated[str | None, typer.Option(
        "--token", help="capability token (JWT) with the publish scope; default "
        "TOOLEXEC_TOKEN (needed when authorization is on)")] = None,
    sign_key: Annotated[Path | None, typer.Option(
        "--sign-key", help="publisher's Ed25519 private key (PEM, `toolexec keys new`): "
        "sign each new version's integrity")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Validate and publish tools to a running system (tool.published / rejected).

    Each new version is pinned to the executor version active now; a version already
    published with the same contents is left as it is, with other contents rejected
    (E3103). With authorization on, the token needs the publish scope on each tool
    (admin for runtimes, primitives and MCP servers)."""
    import asyncio

    from toolexec.runtime_file import read_runtime
    from toolexec.settings import Settings
    from toolexec.usecases.publish import publish_paths

    settings = Settings()
    if read_runtime(settings) is None:
        _warn_if_up_is_gone(settings)
    try:
        publications = asyncio.run(publish_paths(paths, settings, token or settings.token,
                                                 sign_key))
    except ToolexecError as error:
        fail_with(error, as_json)
    _report_publications(publications, as_json)
    raise typer.Exit(1 if any(p.status == "rejected" for p in publications) else 0)


def _warn_if_up_is_gone(settings: Settings) -> None:
    """Say so when the `up` of this state directory ended without stopping cleanly."""
    from toolexec.runtime_file import runtime_status

    status = runtime_status(settings)
    if status.state == "stale" and not settings.kafka_bootstrap:
        err.print(f"[yellow]warning[/] {escape(status.describe())}; this command uses the "
                  "state directory's log without it", highlight=False)


def _report_publications(publications: list[Publication], as_json: bool) -> None:
    from toolexec.usecases.publish import publication_json

    if as_json:
        echo_json([publication_json(p) for p in publications])
        return
    for p in publications:
        label = {"published": "published", "unchanged": "unchanged",
                 "rejected": "[red]rejected[/]"}[p.status]
        pin = f" on {p.executor_pin}" if p.executor_pin else ""
        data = p.event.data if p.event is not None else None
        signature = getattr(data, "publisher_signature", None)
        pin += f", signed by {signature.key_id}" if signature is not None else ""
        name = f"{p.tool_id}@{p.version}" if p.tool_id else p.source.origin  # unreadable
        err.print(f"{label} {escape(name + pin)}", highlight=False)
    _report_rejections(publications)
