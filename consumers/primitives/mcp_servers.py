"""MCP tools: `tools/call` on long-lived MCP servers, kept alive and reused.

Execution goes through the two primitives: a stdio server is a process started by
the subprocess primitive from the McpPlan's SubprocessPlan (`start_service`: same
materialised files, clean environment, rlimits and sandbox as any tool process),
speaking newline-delimited JSON-RPC on its stdin/stdout; a remote server (`sse`,
`streamable_http`) is reached at the endpoint the http primitive checked against the
network policy (`open_endpoint`, E3406) with its `${ENV}` headers resolved, and its
host resolved and checked against the operator's address rules (no loopback or
private address unless allowed, E3406) before the MCP SDK connects.

`definition` lists the server's tools (`tools/list`) on the connection calls use; a
plan carrying a `definition_hash` is called only while the tool's last listed
definition on that connection still has that hash (E3108 otherwise), so a server
restarted between the execute step's check and the call cannot slip another
definition in.

One connection per server version (`McpPlan.server_key`: tool id, version,
integrity) is shared by every call; a connection whose process exited or whose
stream ended is dropped and the next call starts a new one (a reused server found
gone while its tools are listed is started again at once: listing runs nothing).

Outcomes: a result becomes stdout as JSON (`structuredContent` when the server gave
one, else a lone text block as a string, else the content blocks); `isError` is
E3401 with the server's text; a JSON-RPC error is E3301 for invalid params and E3401
otherwise; a call past its timeout is E3402; a server that dies during a call is
E3404; one that cannot start is E3401 (E3402 when its handshake times out); an
unreachable remote server is E3502.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types
import structlog
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from consumers.primitives.file_store import ContentStore
from consumers.primitives.http_primitive import check_resolved_host, open_endpoint
from consumers.primitives.sandboxes import through_launcher
from consumers.primitives.service_process import ServiceProcess, start_service
from domain.definitions import announced_definition, definition_hash
from domain.errors import DefinitionChanged, ExecutionError, ToolexecError
from domain.model import McpPlan, PrimitiveOutcome
from domain.sandbox_policy import SandboxPolicy

log = structlog.get_logger(__name__)

SecretLookup = Callable[[str], str | None]
_LINE_LIMIT = 16 * 1024 * 1024
_INVALID_PARAMS = -32602
_CLIENT_INFO = mcp_types.Implementation(name="toolexec", version="0.1.0")
_MAX_LIST_PAGES = 100
_GONE = ("E3404", "E3502")  # the server's process exited / its connection ended


class McpServers:
    """The pool of live MCP server connections of one executor."""

    def __init__(self, store: ContentStore, work_root: Path, *, sandbox: str = "rlimits",
                 policy: SandboxPolicy | None = None) -> None:
        self._store = store
        self._work_root = work_root
        self._sandbox = through_launcher(sandbox, service=True)  # what servers really enter
        self._policy = policy or SandboxPolicy()
        self._connections: dict[str, _Connection] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def run(self, plan: McpPlan, params: Mapping[str, Any], *,
                  secrets: SecretLookup) -> PrimitiveOutcome:
        """Call the plan's tool with `params`; failures come back as outcomes."""
        started = time.perf_counter()
        sandbox = self._sandbox if plan.server is not None else "none"
        try:
            connection = await self._connection(plan, secrets)
            if plan.definition_hash is not None:
                if connection.listed is None:  # restarted since the check: list again
                    connection = await self._listed(plan, secrets, connection)
                _check_definition(plan, (connection.listed or {}).get(plan.tool_name))
            result = await connection.call(plan.tool_name, dict(params), plan.timeout_seconds)
        except ToolexecError as error:
            return PrimitiveOutcome(ok=False, error=error.to_dict(),
                                    duration_ms=_elapsed_ms(started), sandbox=sandbox)
        return _outcome(plan, result, _elapsed_ms(started), sandbox)

    async def definition(self, plan: McpPlan, *,
                         secrets: SecretLookup) -> Mapping[str, Any] | None:
        """The plan's tool as its server announces it now (`tools/list` on the
        connection calls use, started if need be), None when it announces no such tool."""
        connection = await self._listed(plan, secrets, await self._connection(plan, secrets))
        return (connection.listed or {}).get(plan.tool_name)

    async def _listed(self, plan: McpPlan, secrets: SecretLookup,
                      connection: _Connection) -> _Connection:
        """`connection` with its tools listed now. A server that served earlier calls
        and is found gone while listing (it died between calls, or is still dying: a
        killed process's threads exit before its parent can see it) is started again
        once: listing runs nothing on the server, so it is safe to repeat."""
        try:
            await connection.list_tools(plan.startup_timeout_seconds)
            return connection
        except ExecutionError as error:
            if not connection.reused or error.code not in _GONE:
                raise
            log.info("mcp.server_gone_while_listing", server=plan.server_key)
        connection = await self._connection(plan, secrets)
        await connection.list_tools(plan.startup_timeout_seconds)
        return connection

    def pid_of(self, server_key: str) -> int | None:
        """Pid of the live stdio server process for `server_key`, if any."""
        connection = self._connections.get(server_key)
        return None if connection is None or connection.process is None \
            else connection.process.pid

    async def aclose(self) -> None:
        """Stop every server process and close every remote connection."""
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)

    async def _connection(self, plan: McpPlan, secrets: SecretLookup) -> _Connection:
        lock = self._locks.setdefault(plan.server_key, asyncio.Lock())
        async with lock:
            current = self._connections.get(plan.server_key)
            if current is not None and current.alive():
                current.reused = True
                return current
            if current is not None:
                log.info("mcp.server_restart", server=plan.server_key)
                del self._connections[plan.server_key]
                await current.close()
            connection = _Connection(plan, await self._open_transport(plan, secrets))
            await connection.start(plan.startup_timeout_seconds)
            self._connections[plan.server_key] = connection
            return connection

    async def _open_transport(self, plan: McpPlan, secrets: SecretLookup) -> _Transport:
        if plan.server is not None:
            process = start_service(plan.server, store=self._store, work_root=self._work_root,
                                    sandbox=self._sandbox, policy=self._policy)
            return _Transport(_stdio_streams(process), process=process)
        assert plan.endpoint is not None
        url, headers, _revealed = open_endpoint(plan.endpoint, secrets)
        await check_resolved_host(url, self._policy.egress_allowed_networks)
        return _Transport(_remote_streams(plan, url, headers))


class _Transport:
    """Streams to a server, and the process behind them for stdio servers."""

    def __init__(self, streams: contextlib.AbstractAsyncContextManager[Any],
                 process: ServiceProcess | None = None) -> None:
        self.streams = streams
        self.process = process


class _Connection:
    """One initialised MCP session, held open by its own task until closed."""

    def __init__(self, plan: McpPlan, transport: _Transport) -> None:
        self._plan = plan
        self._transport = transport
        self.process = transport.process
        self._session: ClientSession | None = None
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._broken = False
        self.reused = False
        """True once a second request took this connection from the pool."""
        self.listed: dict[str, dict[str, Any]] | None = None
        """The tools of the last `tools/list`, by name, in their JSON form (None
        before the first)."""

    async def start(self, timeout: float) -> None:
        self._task = asyncio.create_task(self._hold())
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._ready)
        except TimeoutError:
            await self.close()
            raise ExecutionError(f"MCP server {self._plan.server_key} did not complete its "
                                 f"handshake within {timeout:g}s", code="E3402",
                                 details=self._details()) from None
        except ToolexecError as error:
            if self.process is not None:  # the server's last words explain the failure
                await self.process.stderr_settled(1.0)
                error.details["exit_code"] = await self.process.exit_code(1.0)
                error.details["stderr_tail"] = self.process.stderr_tail()
            await self.close()
            raise

    def alive(self) -> bool:
        if self._broken or self._task is None or self._task.done() or self._session is None:
            return False
        return self.process is None or self.process.alive()

    async def call(self, name: str, arguments: dict[str, Any],
                   timeout: float) -> mcp_types.CallToolResult:
        session = self._session
        if session is None or not self.alive():
            raise self._gone("before the call")
        try:
            async with asyncio.timeout(timeout):
                return await session.call_tool(name, arguments)
        except TimeoutError:
            raise ExecutionError(f"MCP tool {name} did not answer within {timeout:g}s",
                                 code="E3402", details={"mcp_tool": name,
                                                        "timeout_seconds": timeout}) from None
        except MCPError as error:
            if not self.alive() or error.code == mcp_types.CONNECTION_CLOSED:
                raise self._gone("during the call") from None
            code = "E3301" if error.code == _INVALID_PARAMS else "E3401"
            raise ExecutionError(f"MCP server refused {name}: {error.message}", code=code,
                                 details={"mcp_tool": name, "jsonrpc_code": error.code}) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError,
                httpx2.HTTPError) as error:
            raise self._gone("during the call", error) from None

    async def list_tools(self, timeout: float) -> None:
        """List the server's tools (every page) into `listed`."""
        session = self._session
        if session is None or not self.alive():
            raise self._gone("before listing its tools")
        listed: dict[str, dict[str, Any]] = {}
        cursor: str | None = None
        try:
            async with asyncio.timeout(timeout):
                for _ in range(_MAX_LIST_PAGES):
                    page = await session.list_tools(params=None if cursor is None else
                                                    mcp_types.PaginatedRequestParams(cursor=cursor))
                    for tool in page.tools:
                        listed.setdefault(tool.name, tool.model_dump(
                            mode="json", by_alias=True, exclude_none=True))
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except TimeoutError:
            raise ExecutionError(f"MCP server {self._plan.server_key} did not list its tools "
                                 f"within {timeout:g}s", code="E3402",
                                 details=self._details()) from None
        except MCPError as error:
            if not self.alive() or error.code == mcp_types.CONNECTION_CLOSED:
                raise self._gone("while listing its tools") from None
            raise ExecutionError(f"MCP server {self._plan.server_key} refused tools/list: "
                                 f"{error.message}", details=self._details()) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError,
                httpx2.HTTPError) as error:
            raise self._gone("while listing its tools", error) from None
        self.listed = listed

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), 5.0)
            if not self._task.done():
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
        if self.process is not None:
            await self.process.stop()

    async def _hold(self) -> None:
        try:
            async with self._transport.streams as (read, write), \
                    ClientSession(read, write, client_info=_CLIENT_INFO) as session:
                await session.initialize()
                self._session = session
                self._ready.set_result(None)
                await self._stop.wait()
        except Exception as error:  # boundary: a start failure becomes the starter's error
            if not self._ready.done():
                self._ready.set_exception(self._start_failure(error))
            else:
                log.info("mcp.connection_ended", server=self._plan.server_key, error=repr(error))
        finally:
            self._session = None
            if not self._ready.done():
                self._ready.set_exception(self._start_failure(None))

    def _start_failure(self, error: BaseException | None) -> ToolexecError:
        if isinstance(error, ToolexecError):
            return error
        remote = self.process is None
        return ExecutionError(
            f"MCP server {self._plan.server_key} could not be "
            f"{'reached' if remote else 'started'}: {_describe(error)}",
            code="E3502" if remote else "E3401", details=self._details())

    def _gone(self, when: str, error: BaseException | None = None) -> ExecutionError:
        self._broken = True
        remote = self.process is None
        what = "connection ended" if remote else "process exited"
        return ExecutionError(f"MCP server {self._plan.server_key}: {what} {when}"
                              + (f" ({_describe(error)})" if error is not None else ""),
                              code="E3502" if remote else "E3404", details=self._details())

    def _details(self) -> dict[str, Any]:
        details: dict[str, Any] = {"server": self._plan.server_key,
                                   "transport": self._plan.transport}
        if self.process is not None:
            details["stderr_tail"] = self.process.stderr_tail()
            details["exit_code"] = self.process.popen.returncode
        return details


@contextlib.asynccontextmanager
async def _stdio_streams(process: ServiceProcess) -> AsyncIterator[tuple[Any, Any]]:
    """Newline-delimited JSON-RPC over the process's stdout/stdin, as SDK streams."""
    loop = asyncio.get_running_loop()
    assert process.popen.stdout is not None and process.popen.stdin is not None
    reader = asyncio.StreamReader(limit=_LINE_LIMIT)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), process.popen.stdout)
    write_transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, process.popen.stdin)
    writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](16)

    async def pump_out() -> None:
        async with to_session:
            while line := await reader.readline():
                if not line.strip():
                    continue
                try:
                    message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except ValueError as error:
                    await to_session.send(error)
                    continue
                await to_session.send(SessionMessage(message))

    async def pump_in() -> None:
        async with from_session:
            async for item in from_session:
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                writer.write(data.encode() + b"\n")
                await writer.drain()

    tasks = [asyncio.create_task(pump_out()), asyncio.create_task(pump_in())]
    try:
        yield read_stream, write_stream
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        write_transport.close()
        read_transport.close()


@contextlib.asynccontextmanager
async def _remote_streams(plan: McpPlan, url: str,
                          headers: dict[str, str]) -> AsyncIterator[tuple[Any, Any]]:
    timeout = httpx2.Timeout(plan.startup_timeout_seconds, read=max(plan.timeout_seconds, 300.0))
    if plan.transport == "sse":
        async with sse_client(url, headers=headers, timeout=plan.startup_timeout_seconds) as streams:
            yield streams[0], streams[1]
        return
    async with httpx2.AsyncClient(headers=headers, timeout=timeout, trust_env=False,
                                  follow_redirects=False) as client, \
            streamable_http_client(url, http_client=client) as streams:
        yield streams[0], streams[1]


def _check_definition(plan: McpPlan, listed: Mapping[str, Any] | None) -> None:
    """Refuse (E3108) a call whose tool's definition on this connection is not the
    one the execute step checked."""
    announced = None if listed is None else definition_hash(announced_definition(listed))
    if announced != plan.definition_hash:
        raise DefinitionChanged(
            f"MCP tool {plan.tool_name}'s definition changed on {plan.server_key} after it "
            "was checked", details={"server": plan.server_key, "mcp_tool": plan.tool_name,
                                    "checked": plan.definition_hash, "announced": announced})


def _outcome(plan: McpPlan, result: mcp_types.CallToolResult, duration_ms: float,
             sandbox: str) -> PrimitiveOutcome:
    texts = [block.text for block in result.content if isinstance(block, mcp_types.TextContent)]
    if result.is_error:
        message = " ".join(texts) or "the MCP tool reported an error"
        return PrimitiveOutcome(ok=False, duration_ms=duration_ms, sandbox=sandbox, error={
            "code": "E3401", "message": f"MCP tool {plan.tool_name} failed: {message}",
            "details": {"mcp_tool": plan.tool_name, "server": plan.server_key, "is_error": True,
                        "content": texts}})
    if result.structured_content is not None:
        value: Any = result.structured_content
    elif len(result.content) == 1 and len(texts) == 1:
        value = texts[0]
    else:
        value = [block.model_dump(mode="json", by_alias=True, exclude_none=True)
                 for block in result.content]
    stdout = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    return PrimitiveOutcome(ok=True, stdout=stdout, exit_code=None, duration_ms=duration_ms,
                            sandbox=sandbox)


def _describe(error: BaseException | None) -> str:
    if error is None or (isinstance(error, MCPError)
                         and error.code == mcp_types.CONNECTION_CLOSED):
        return "it closed the connection"
    if isinstance(error, BaseExceptionGroup) and error.exceptions:
        return _describe(error.exceptions[0])
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _elapsed_ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
