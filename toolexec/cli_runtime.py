"""CLI commands that talk to a running system: up, run, publish."""

from __future__ import annotations

import asyncio
import json
import signal
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from domain.errors import InvalidRequest
from domain.request_limits import (
    DEFAULT_MAX_PARAMETER_BYTES,
    PayloadRejected,
    check_request_payload,
    strict_json_loads,
)
from toolexec.cli_output import fail, fail_with
from toolexec.runtime_file import (
    acquire_up_lock,
    read_runtime,
    remove_runtime,
    replace_stale_runtime,
    runtime_status,
    write_runtime,
)
from toolexec.settings import Settings, fetch_waits, kafka_client_options
from toolexec.sources import bash_syntax_check, collect_sources

if TYPE_CHECKING:
    from contracts.envelope import Envelope
    from domain.model import ToolSource
    from domain.registry import RegistryView
    from domain.scopes import Need
    from toolexec.client import InvocationClient, Progress
    from toolexec.publishing import Publication
    from toolexec.read_models import ReadModels

# The client, the stack and the publishing code (Kafka, FastStream, SQLAlchemy) are
# imported by the commands that use them, so that `toolexec --help` starts quickly.

err = Console(stderr=True)
out = Console()

REGISTRY_CATCH_UP_SECONDS = 10.0  # a restarted `up` reads the registry already in its log


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("run")(run)
    app.command("publish")(publish)


def _publications(sources: list[ToolSource], known: dict[str, str], registry: RegistryView,
                  settings: Settings, published_by: str | None = None) -> list[Publication]:
    """What publishing `sources` to `registry` does (pins, no-ops, rejections)."""
    from toolexec.publishing import plan_publications

    return plan_publications(sources, registry, now=datetime.now(UTC),
                             published_by=published_by, bash_syntax=bash_syntax_check,
                             known_tools=known, limits=settings.publication_limits,
                             max_record_bytes=settings.max_message_bytes)


@dataclass
class _Found:
    """The sources a running system publishes (built-ins first), their tool types, and
    the rejections of sources that could not be read."""

    sources: list[ToolSource]
    known: dict[str, str]
    unreadable: list[Publication]


def _sources(tool_dirs: list[Path], settings: Settings) -> _Found:
    from toolexec.publishing import unreadable

    now = datetime.now(UTC)
    refused: list[Publication] = []
    sources = collect_sources(tool_dirs, settings, on_error=lambda error: refused.append(
        unreadable(str(error.details.get("path", "")), error, now)))
    known = {str(s.manifest.get("tool_id")): str(s.manifest.get("tool_type")) for s in sources}
    return _Found(sources, known, refused)


async def _publish_to_stack(stack: Any, tool_dirs: list[Path], settings: Settings,
                            token: str | None = None,
                            check_rights: bool = False) -> list[Publication]:
    """Plan the tools of `tool_dirs` (and the built-ins) against the stack's registry
    view once it has read the registry topic, then publish what is new."""
    from toolexec import rights

    capability = rights.caller(settings, token) if check_rights else None
    found = _sources(tool_dirs, settings)
    await stack.registry.catch_up(REGISTRY_CATCH_UP_SECONDS)
    publications = found.unreadable + _publications(
        found.sources, found.known, stack.registry, settings,
        published_by=capability.subject if capability else None)
    rights.demand(capability, _needs(publications))
    await stack.publish_all(p.event for p in publications if p.event is not None)
    return publications


async def _publish_to_running(client: InvocationClient, runtime: dict[str, Any],
                              found: _Found, settings: Settings,
                              token: str | None) -> list[Publication]:
    """Plan `sources` against the running system's registry as its log holds it, check the
    caller's publish rights when authorization is on, then send what is new."""
    from toolexec import rights
    from toolexec.registry_reads import published_versions

    capability = rights.caller(settings, token, runtime)
    registry = await published_versions(str(runtime["kafka_bootstrap"]),
                                        settings.publication_limits,
                                        client_options=kafka_client_options(settings))
    publications = found.unreadable + _publications(
        found.sources, found.known, registry, settings,
        published_by=capability.subject if capability else None)
    rights.demand(capability, _needs(publications))
    for publication in publications:
        if publication.event is not None:
            await client.send(publication.event)
    return publications


def _needs(publications: list[Publication]) -> list[Need]:
    return [p.need for p in publications if p.event is not None]


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
        publications = await _publish_to_stack(stack, tools, settings)
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
        try:
            await stop.wait()
        finally:
            remove_runtime(settings)
    if broker is not None:
        err.print("toolexec up: stopped; the embedded broker keeps running with its log "
                  "(`toolexec broker stop` stops it)")
    else:
        err.print("toolexec up: stopped")


def _parse_params(pairs: list[str], params_json: str | None,
                  max_bytes: int = DEFAULT_MAX_PARAMETER_BYTES) -> dict[str, Any]:
    """`--params` (strict JSON: no NaN, Infinity or lone surrogates) merged with each
    `-p key=value` (the value read as strict JSON, else taken as text). Raises
    PayloadRejected (E3004) for `--params` that is not strict JSON, or parameters past
    `max_bytes`."""
    params: dict[str, Any] = {}
    if params_json:
        loaded = strict_json_loads(params_json)
        if not isinstance(loaded, dict):
            raise InvalidRequest("--params must be a JSON object",
                                 details={"params": params_json[:200]})
        params.update(loaded)
    for pair in pairs:
        if "=" not in pair:
            raise InvalidRequest(f"-p expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            params[key] = strict_json_loads(value)
        except PayloadRejected:
            params[key] = value
    check_request_payload(params, max_bytes=max_bytes)
    return params


def _read_lockfile(path: Path | None) -> dict[str, Any] | None:
    """The lockfile at `path` (InvalidRequest when it cannot be read as a JSON object)."""
    if path is None:
        return None
    try:
        loaded = strict_json_loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise InvalidRequest(f"cannot read the lockfile {path}: {error.strerror or error}",
                             details={"path": str(path)}) from None
    except PayloadRejected as error:
        raise InvalidRequest(f"the lockfile {path} is not JSON: {error.message}",
                             details={"path": str(path)}) from None
    if not isinstance(loaded, dict):
        raise InvalidRequest(f"the lockfile {path} is not a JSON object",
                             details={"path": str(path)})
    return loaded


def _require_existing(paths: list[Path]) -> None:
    for path in paths:
        if not path.exists():
            raise InvalidRequest(f"{path} does not exist", details={"path": str(path)})


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
    """Invoke a tool through the pipeline and print its result. With authorization on,
    the token must also hold the publish scope for tools of `--tools` not yet published."""
    from domain.errors import ToolexecError

    settings = Settings()
    try:
        parameters = _parse_params(param, params, settings.max_parameter_bytes)
        lockfile = _read_lockfile(lock)
        _require_existing(tools)
    except ToolexecError as error:  # E3004: a malformed request, bad usage
        fail_with(error, as_json)
    tool_id, _, version_range = tool.partition("@")
    from toolexec.broker_control import BrokerUnavailable
    from toolexec.client import InvocationNotDelivered, InvocationUnresolved

    _warn_if_up_is_gone(settings)
    try:
        terminal = asyncio.run(_run(settings, tool_id, version_range or "*", parameters,
                                    lockfile, token or settings.token, tools, timeout,
                                    quiet=as_json))
    except (InvocationNotDelivered, InvocationUnresolved,  # E3001 / E3002
            BrokerUnavailable,  # E3801: the embedded broker did not start
            ToolexecError) as error:
        fail_with(error, as_json)
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
    runs; the tools under `tools` are published first (with authorization on, `token`
    must hold the publish scope for each new one). Returns the terminal event. Raises
    AuthorizationError when the token may not publish them."""
    from contracts.fact_signature import FactVerifier
    from toolexec import keys, rights
    from toolexec.client import InvocationClient
    from toolexec.stack import Stack

    tools = tools or []
    runtime = read_runtime(settings)
    if runtime is not None:
        async with InvocationClient(runtime["kafka_bootstrap"], fetch_waits=fetch_waits(settings),
                                    verifier=FactVerifier(keys.fact_verify_keys(settings)),
                                    client_options=kafka_client_options(settings)) as client:
            if tools:
                await _publish_to_running(client, runtime, _sources(tools, settings),
                                          settings, token)
            return await client.invoke(tool_id, parameters, version_range=version_range,
                                       lockfile=lockfile, token=token, timeout=timeout,
                                       progress=progress)
    async with Stack(settings) as stack:
        publications = await _publish_to_stack(stack, tools, settings, token,
                                               check_rights=rights.auth_required(settings))
        if report_rejections:
            _report_rejections(publications)
        async with InvocationClient(stack.bootstrap, pipeline=stack.pipeline,
                                    verifier=stack.verifier, fetch_waits=fetch_waits(settings),
                                    client_options=kafka_client_options(settings)) as client:
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
    token: Annotated[str | None, typer.Option(
        "--token", help="capability token (JWT) with the publish scope; default "
        "TOOLEXEC_TOKEN (needed when authorization is on)")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Validate and publish tools to a running system (tool.published / rejected).

    Each new version is pinned to the executor version active now; a version already
    published with the same contents is left as it is, with other contents rejected
    (E3103). With authorization on, the token needs the publish scope on each tool
    (admin for runtimes, primitives and MCP servers)."""
    from domain.errors import ToolexecError

    settings = Settings()
    try:
        _require_existing(paths)
    except ToolexecError as error:
        fail_with(error, as_json)
    bootstrap = settings.kafka_bootstrap or _running_bootstrap(settings)
    if not bootstrap:
        status = runtime_status(settings)
        hint = f"{status.describe()}; " if status.state == "stale" else ""
        fail("E3001", f"no running toolexec found: {hint}start `toolexec up` first or set "
             "TOOLEXEC_KAFKA_BOOTSTRAP", as_json)
    runtime = read_runtime(settings)
    if runtime is None:
        _warn_if_up_is_gone(settings)
    every = _sources(paths, settings)
    found = _Found([s for s in every.sources if _from_paths(s.origin, paths)], every.known,
                   [p for p in every.unreadable if _from_paths(p.source.origin, paths)])
    try:
        publications = asyncio.run(_publish_sources(
            {**(runtime or {}), "kafka_bootstrap": bootstrap}, found, settings,
            token or settings.token))
    except ToolexecError as error:
        fail(error.code, error.message, as_json, error.details)
    _report_publications(publications, as_json)
    raise typer.Exit(1 if any(p.status == "rejected" for p in publications) else 0)


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


async def _publish_sources(runtime: dict[str, Any], found: _Found, settings: Settings,
                           token: str | None) -> list[Publication]:
    from toolexec.client import InvocationClient

    async with InvocationClient(str(runtime["kafka_bootstrap"]),
                                client_options=kafka_client_options(settings)) as client:
        return await _publish_to_running(client, runtime, found, settings, token)


def _report_publications(publications: list[Publication], as_json: bool) -> None:
    if as_json:
        out.print_json(data=[_publication_json(p) for p in publications])
        return
    for p in publications:
        label = {"published": "published", "unchanged": "unchanged",
                 "rejected": "[red]rejected[/]"}[p.status]
        pin = f" on {p.executor_pin}" if p.executor_pin else ""
        err.print(f"{label} {escape(f'{p.tool_id}@{p.version}{pin}')}", highlight=False)
    _report_rejections(publications)


def _publication_json(p: Publication) -> dict[str, Any]:
    if p.event is not None:
        return {"type": p.event.type, **json.loads(p.event.data.model_dump_json())}
    pin = p.executor_pin
    return {"type": "unchanged", "tool_id": p.tool_id, "version": p.version,
            "integrity": p.integrity,
            "executor_pin": None if pin is None else {"tool_id": pin.tool_id,
                                                      "version": pin.version,
                                                      "integrity": pin.integrity}}


def _from_paths(origin: str, paths: list[Path]) -> bool:
    return any(str(origin).startswith(str(p.resolve())) or str(origin).startswith(str(p))
               for p in paths)
