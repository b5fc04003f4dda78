"""`toolexec mcp`: an MCP server (official SDK) that lets agents reach toolexec.

Tools:
- `search`  query the registry read model (tool ids, types, descriptions, tags);
- `load`    one tool's manifest, files and metadata from the registry read model
            (file contents too, read from the registry topic of the running system);
- `execute` `run` invokes a tool through the full event pipeline, exactly as
            `toolexec run` does (the running `up` found via .toolexec/runtime.json,
            else an embedded stack for the call), sending each progress report of the
            tool as an MCP progress notification when the call carries a progress
            token; `start` requests it without waiting and returns the invocation id,
            `status` answers an invocation's status, progress, timeline and (once
            ended) result by id, to the readers HTTP would answer (the same use case
            and rights, toolexec.usecases.readers): the MCP tasks pattern as two
            actions, since the SDK's server does not serve `tasks/*` (its types
            only); `sign` computes a tool source's canonical integrity; `lock`
            freezes a tool's verified chain to a lockfile;
- `approval` `list` the calls waiting for an approver; `approve` or `deny` one
            (`tool.approval.decided`, the approver's token needs the approve scope);
- `help`    what the tools do and how to call them.

Reads of the read models `up` folds (`search`, `load`, `execute` `status`; `approval`)
first wait, bounded, until the read model has folded the log as far as it was when
asked (`usecases.read_your_writes`): a `status` right after a `start`, of this
process or another, knows the invocation.

Every failure comes back as an MCP tool error (`isError`) whose structured content
and text are `{"error": {"code": "E3xxx", "message", "details"}}`. Served over stdio
by default, or streamable HTTP (`--http`, path `/mcp`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

import mcp_types
import structlog
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts.envelope import Envelope
from domain.approval import Verdict
from domain.errors import InvalidRequest, ToolexecError
from projections.database import make_engine, migrate
from toolexec import keys, rights
from toolexec.client import InvocationClient
from toolexec.runtime_file import read_runtime, running_bootstrap
from toolexec.settings import Settings, kafka_client_options
from toolexec.state_files import ensure_state_dir
from toolexec.usecases import approval, registry
from toolexec.usecases.authoring import lock_chain, source_integrity
from toolexec.usecases.invoke import (
    ToolSpec,
    check_parameters,
    completed_result,
    invoke_tool,
    submit_tool,
)
from toolexec.usecases.read_your_writes import read_after_writes
from toolexec.usecases.timeline import invocation_timeline

log = structlog.get_logger(__name__)

Progress = Callable[[Envelope], None]
FRONT_END = "urn:toolexec:mcp"

HELP = {
    "overview": (
        "toolexec runs tools (manifests plus content-addressed files) through an "
        "event-sourced pipeline: resolve -> authorize -> execute -> finalize. "
        "Tools: search (find tools), load (inspect one), execute (run | sign | lock), "
        "approval (list | approve | deny the calls waiting for an approver), "
        "help (this text). Errors carry E3xxx codes."),
    "search": "search(query, limit=10): tools best matching the query (name, tags, "
              "description, parameters; typos and partial words too), best first, each "
              "with a score and the fields it matched; `mode` says how they were ranked "
              "(lexical, or hybrid with semantic vectors). An empty query lists tools.",
    "load": "load(tool_id, version=None): the manifest, files (path, sha256, size, "
            "content when available) and metadata (integrity, lifecycle, versions).",
    "execute": (
        "execute(action, ...): action 'run' with tool_id, parameters (object), "
        "version_range ('*', '^1'...), lockfile (object), token (capability JWT), "
        "timeout, callback_url; returns the result or the failure's code, and sends the "
        "tool's progress reports as progress notifications when the call has a progress "
        "token. Action 'start' (same arguments) returns the invocation_id at once; action "
        "'status' with invocation_id answers its status, latest progress, checkpoints, "
        "timeline and, once ended, its result or error (poll it; with authorization on, "
        "token: the invocation's own subject, or the audit scope, as over HTTP: else "
        "E3203 / E3206). Action 'sign' with path "
        "(a tool source) returns its canonical integrity sha256:<hex>. Action 'lock' "
        "with tool_id and version_range freezes the verified chain to a lockfile "
        "(written to `path` when given)."),
    "approval": (
        "approval(action, ...): action 'list' gives the calls waiting for an approver "
        "(invocation_id, tool, agent, parameters, call_hash, expires_at); 'approve' or "
        "'deny' with invocation_id (and optionally reason, approved_hash: default the "
        "hash of the call waiting; token: a capability JWT with the approve scope when "
        "authorization is on). The call runs only if the approved hash is its own "
        "(else E3210); a denied call fails with E3208, an unanswered one with E3209."),
}


class GatewayError(InvalidRequest):
    """A request the gateway itself refuses (bad arguments): E3004, as the CLI and the
    HTTP gateway answer a malformed request."""


class Gateway:
    """The state behind the MCP tools: settings, tool directories, the read-model
    engine (opened on first use)."""

    def __init__(self, settings: Settings, tools: list[Path]) -> None:
        self.settings = settings
        self.tools = tools
        self._engine: AsyncEngine | None = None

    async def engine(self) -> AsyncEngine:
        if self._engine is None:
            runtime = read_runtime(self.settings) or {}
            url = runtime.get("database_url") or self.settings.effective_database_url
            if not self.settings.database_url:
                ensure_state_dir(self.settings.state_dir)
            engine = make_engine(url)
            await migrate(engine)
            self._engine = engine
        return self._engine

    async def close(self) -> None:
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    async def search(self, query: str, limit: int) -> dict[str, Any]:
        engine = await self.engine()
        await read_after_writes(self.settings, engine, "registry")
        found = await registry.search(engine, self.settings, query, limit)
        return {"query": query, **found}

    async def load(self, tool_id: str, version: str | None) -> dict[str, Any]:
        engine = await self.engine()
        await read_after_writes(self.settings, engine, "registry")
        tool, found = await registry.tool_version(engine, tool_id, version)
        texts = await registry.file_texts(self.settings, running_bootstrap(self.settings),
                                          tool_id, found["version"])
        return {
            "tool_id": tool_id, "version": found["version"], "manifest": found["manifest"],
            "files": [{**f, "content": texts.get(f["path"])} for f in found["files"]],
            "metadata": {
                "tool_type": found["tool_type"], "executor": found["executor"],
                "integrity": found["integrity"], "lifecycle": found["lifecycle"],
                "description": found["description"], "published_at": found["published_at"],
                "published_by": found["published_by"], "source": found["source"],
                "current_version": tool["current_version"], "tags": tool["tags"],
                "versions": [v["version"] for v in tool["versions"]]},
        }

    async def run(self, tool_id: str, parameters: Any, version_range: str,
                  lockfile: Any, token: str | None, timeout: float,
                  callback_url: str | None = None,
                  progress: Progress | None = None) -> dict[str, Any]:
        spec = ToolSpec.parse(f"{tool_id}@{version_range}")
        parameters = check_parameters(parameters, lockfile=lockfile,
                                      max_bytes=self.settings.max_parameter_bytes)
        terminal = await invoke_tool(self.settings, spec, parameters, lockfile=lockfile,
                                     token=token, tools=self.tools, timeout=timeout,
                                     progress=progress, callback_url=callback_url)
        return {"action": "run", **completed_result(terminal)}

    async def start(self, tool_id: str, parameters: Any, version_range: str,
                    lockfile: Any, token: str | None,
                    callback_url: str | None) -> dict[str, Any]:
        spec = ToolSpec.parse(f"{tool_id}@{version_range}")
        parameters = check_parameters(parameters, lockfile=lockfile,
                                      max_bytes=self.settings.max_parameter_bytes)
        invocation_id = await submit_tool(self.settings, spec, parameters, lockfile=lockfile,
                                          token=token, callback_url=callback_url)
        return {"action": "start", "status": "requested", "invocation_id": invocation_id}

    async def status(self, invocation_id: str | None, token: str | None) -> dict[str, Any]:
        if not invocation_id:
            raise GatewayError("action 'status' needs an invocation_id")
        reader = rights.caller(self.settings, token, read_runtime(self.settings))
        engine = await self.engine()
        await read_after_writes(self.settings, engine, "invocations")
        document = await invocation_timeline(engine, invocation_id, reader=reader)
        return {"action": "status", **document, "result": _parsed(document)}

    async def approvals(self, token: str | None) -> dict[str, Any]:
        capability = rights.caller(self.settings, token, read_runtime(self.settings))
        engine = await self.engine()
        await read_after_writes(self.settings, engine, "approvals")
        rows = await approval.list_pending(engine, capability)
        return {"action": "list", "approvals": rows, "count": len(rows)}

    async def decide(self, invocation_id: str, verdict: Verdict, reason: str | None,
                     approved_hash: str | None, token: str | None) -> dict[str, Any]:
        runtime = read_runtime(self.settings) or {}
        capability = rights.caller(self.settings, token, runtime)
        bootstrap = self.settings.kafka_bootstrap or runtime.get("kafka_bootstrap")
        if not bootstrap:
            raise ToolexecError("no running toolexec found: start `toolexec up` first or "
                                "set TOOLEXEC_KAFKA_BOOTSTRAP", code="E3001")
        engine = await self.engine()
        await read_after_writes(self.settings, engine, "approvals")
        row = await approval.waiting_call(engine, invocation_id)
        async with InvocationClient(
                bootstrap, client_options=kafka_client_options(self.settings),
                seal_to=keys.token_seal_public_key(self.settings)) as client:
            outcome = await approval.decide_approval(
                client, invocation_id, row, verdict=verdict, capability=capability,
                token=token, front_end=FRONT_END, reason=reason, approved_hash=approved_hash)
        return {"action": verdict, **outcome.to_dict()}

    def sign(self, path: str | None) -> dict[str, Any]:
        if not path:
            raise GatewayError("action 'sign' needs the path of a tool source")
        tool_id, version, integrity = source_integrity(Path(path))
        return {"action": "sign", "status": "signed", "tool_id": tool_id, "version": version,
                "integrity": integrity}

    def lock(self, tool_id: str, version_range: str, path: str | None) -> dict[str, Any]:
        dirs = self.tools or [self.settings.tools_dir]
        lockfile, warnings = lock_chain(tool_id, version_range, dirs)
        if path:
            try:
                Path(path).write_text(json.dumps(lockfile, indent=2, sort_keys=True) + "\n",
                                      encoding="utf-8")
            except OSError as error:
                raise GatewayError(f"cannot write {path}: {error.strerror or error}",
                                   details={"path": path}) from error
        return {"action": "lock", "status": "locked", "lockfile": lockfile,
                "warnings": warnings, "path": path}


def _parsed(document: dict[str, Any]) -> Any:
    """A completed invocation's result as the read model holds it (None otherwise, or
    when its summary was cut)."""
    if document["status"] != "completed" or document["result_summary"] is None:
        return None
    with contextlib.suppress(ValueError):
        return json.loads(document["result_summary"])
    return None


class ProgressRelay:
    """Forwards a tool's progress reports to the MCP caller, in order, as progress
    notifications: `progress` is the report's number (from 1, increasing even across
    attempts, as MCP requires), the message says the share done and the tool's words."""

    def __init__(self, context: Context) -> None:
        self._context = context
        self._reports: asyncio.Queue[Envelope | None] = asyncio.Queue()
        self._task = asyncio.create_task(self._forward())

    def __call__(self, event: Envelope) -> None:
        if event.type == "tool.execution.progressed":
            self._reports.put_nowait(event)

    async def _forward(self) -> None:
        while (event := await self._reports.get()) is not None:
            data: Any = event.data
            share = "" if data.fraction is None else f"{data.fraction:.0%} "
            with contextlib.suppress(Exception):  # the caller went away: the run goes on
                await self._context.report_progress(data.sequence + 1, None,
                                                    (share + data.message).strip())

    async def close(self) -> None:
        """Send what is queued, then stop."""
        self._reports.put_nowait(None)
        await self._task


def _ok(payload: dict[str, Any]) -> mcp_types.CallToolResult:
    text = json.dumps(payload, ensure_ascii=False, default=str)
    return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=text)],
                                    structured_content=json.loads(text))


def _error(error: ToolexecError) -> mcp_types.CallToolResult:
    body = {"error": {"code": error.code, "message": error.message,
                      "details": dict(error.details or {})}}
    text = json.dumps(body, ensure_ascii=False, default=str)
    return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=text)],
                                    structured_content=json.loads(text), is_error=True)


async def _guarded(work: Any) -> mcp_types.CallToolResult:
    """Run one tool's work; toolexec errors and an unreachable store become tool errors."""
    try:
        return _ok(await work())
    except ToolexecError as error:
        return _error(error)
    except (SQLAlchemyError, OSError) as error:  # boundary: the read-model store is down
        return _error(ToolexecError(f"projection store unavailable: {error}"[:500],
                                    code="E3001"))
    except Exception as error:  # boundary: the agent gets a coded error, the log the cause
        log.exception("gateway.mcp.unexpected_error")
        return _error(ToolexecError(f"toolexec could not serve the request: "
                                    f"{type(error).__name__}", code="E3001"))


class CodedMCPServer(MCPServer):
    """An MCP server whose argument errors carry a code too: arguments that do not
    match a tool's input schema answer `{"error": {"code": "E3004", ...}}` rather than
    the SDK's pydantic text."""

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as error:
            if not isinstance(error.__cause__, ValidationError):
                raise
            problems = [{"loc": [str(part) for part in e["loc"]], "msg": e["msg"],
                         "type": e["type"]} for e in error.__cause__.errors()]
            return _error(GatewayError(f"arguments of {name!r} do not match its input schema",
                                       details={"errors": problems}))


def build_server(gateway: Gateway) -> MCPServer:
    """The MCP server exposing search, load, execute and help over `gateway`."""
    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[None]:
        try:
            yield None
        finally:  # the engine is opened again on the next use
            await gateway.close()

    server = CodedMCPServer("toolexec", version="0.1.0", instructions=HELP["overview"],
                            lifespan=lifespan)

    @server.tool(description=HELP["search"])
    async def search(query: str = "", limit: int = 10) -> mcp_types.CallToolResult:
        return await _guarded(lambda: gateway.search(query, limit))

    @server.tool(description=HELP["load"])
    async def load(tool_id: str, version: str | None = None) -> mcp_types.CallToolResult:
        return await _guarded(lambda: gateway.load(tool_id, version))

    @server.tool(description=HELP["execute"])
    async def execute(action: Literal["run", "start", "status", "sign", "lock"],
                      ctx: Context, tool_id: str | None = None,
                      parameters: dict[str, Any] | None = None, version_range: str = "*",
                      lockfile: dict[str, Any] | None = None, token: str | None = None,
                      path: str | None = None, timeout: float = 120.0,
                      callback_url: str | None = None,
                      invocation_id: str | None = None) -> mcp_types.CallToolResult:
        async def work() -> dict[str, Any]:
            if action == "sign":
                return gateway.sign(path)
            if action == "status":
                return await gateway.status(invocation_id, token)
            if not tool_id:
                raise GatewayError(f"action {action!r} needs a tool_id")
            if action == "lock":
                return gateway.lock(tool_id, version_range, path)
            if action == "start":
                return await gateway.start(tool_id, parameters or {}, version_range,
                                           lockfile, token, callback_url)
            relay = ProgressRelay(ctx)
            try:
                return await gateway.run(tool_id, parameters or {}, version_range, lockfile,
                                         token, timeout, callback_url, relay)
            finally:
                await relay.close()
        return await _guarded(work)

    @server.tool(description=HELP["approval"])
    async def approval(action: Literal["list", "approve", "deny"],
                       invocation_id: str | None = None, reason: str | None = None,
                       approved_hash: str | None = None,
                       token: str | None = None) -> mcp_types.CallToolResult:
        async def work() -> dict[str, Any]:
            if action == "list":
                return await gateway.approvals(token)
            if not invocation_id:
                raise GatewayError(f"action {action!r} needs an invocation_id")
            return await gateway.decide(invocation_id, action, reason, approved_hash, token)
        return await _guarded(work)

    @server.tool(name="help", description="How to use toolexec's MCP tools.")
    def help_(topic: str | None = None) -> str:
        if topic is None:
            return "\n\n".join(HELP.values())
        return HELP.get(topic, f"unknown topic {topic!r}; topics: {', '.join(HELP)}")

    return server
