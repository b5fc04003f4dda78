"""The egress proxy: decides, outside the sandbox, every connection a script tool makes.

One `EgressSession` per run whose network policy allows some hosts. The sandbox
gets one end of a unix socket pair (`child_fd`); the egress relay inside it passes
each connection the tool opens to its proxy port over that pair
(consumers.primitives.egress_relay). For each connection the session reads one HTTP
proxy request — `CONNECT host:port` (any TCP stream; HTTPS clients use it) or an
absolute-form `http://` request — and then:

1. checks the destination against the tool's network policy (host in
   `allowed_domains`, port in `allowed_ports`; empty `allowed_ports` = none);
2. resolves the host itself and checks every address against the operator's rules
   (no loopback, link-local, private... unless `TOOLEXEC_EGRESS_ALLOWED_NETWORKS`
   allows it) — see domain.egress;
3. connects to the checked address (never to the name again, so a rebinding DNS
   answer cannot redirect it) and relays bytes both ways until either side closes.

A refusal is answered `403` with the E3406 reason in the body (and header
`X-Toolexec-Error: E3406`) and logged as `egress.refused`; an unreachable or
unresolvable destination `502`. A run holds at most MAX_CONNECTIONS connections at
once. Plain-HTTP requests are sent with
`Connection: close`, so each connection reaches exactly the one host it was checked
for. Everything a session holds is closed with the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import structlog

from domain.egress import (
    MAX_HEAD_BYTES,
    ProxyRequest,
    ProxyRequestInvalid,
    check_addresses,
    check_destination,
    parse_proxy_request,
)
from domain.errors import NetworkPolicyViolation
from domain.model import NetworkPolicy

log = structlog.get_logger(__name__)

CONNECT_TIMEOUT_SECONDS = 10.0
HEAD_TIMEOUT_SECONDS = 30.0
MAX_CONNECTIONS = 64
"""Connections one run may hold open at once; more are closed as they arrive, so a
tool cannot spend toolexec's file descriptors."""
_COPY_CHUNK = 65536


class EgressSession:
    """Serves the proxied connections of one run."""

    def __init__(self, policy: NetworkPolicy, allowed_networks: tuple[str, ...] = ()) -> None:
        self._policy = policy
        self._allowed = allowed_networks
        self._loop = asyncio.get_running_loop()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        parent.setblocking(False)
        self._channel = parent
        self._child: socket.socket | None = child
        self._tasks: set[asyncio.Task[None]] = set()
        self.refused: list[dict[str, Any]] = []
        self._loop.add_reader(parent.fileno(), self._receive)

    @property
    def child_fd(self) -> int:
        """The end handed to the sandbox (inheritable); closed here once spawned."""
        assert self._child is not None, "session already handed over"
        fd = self._child.fileno()
        self._child.set_inheritable(True)
        return fd

    def handed_over(self) -> None:
        """The sandbox holds its end now: drop ours."""
        if self._child is not None:
            self._child.close()
            self._child = None

    async def aclose(self) -> None:
        """Stop accepting and close every connection of the run."""
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._channel.fileno())
        self._channel.close()
        self.handed_over()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _receive(self) -> None:
        try:
            _, fds, _, _ = socket.recv_fds(self._channel, 16, 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            fds = []
        if not fds:  # every sandbox end is closed: nothing more will come
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._channel.fileno())
            return
        for fd in fds:
            try:
                connection = socket.socket(fileno=fd)
            except OSError:
                with contextlib.suppress(OSError):
                    socket.close(fd)
                continue
            if connection.type != socket.SOCK_STREAM or len(self._tasks) >= MAX_CONNECTIONS:
                connection.close()
                continue
            task = self._loop.create_task(self._serve(connection))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, connection: socket.socket) -> None:
        connection.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=connection, limit=MAX_HEAD_BYTES)
        try:
            try:
                async with asyncio.timeout(HEAD_TIMEOUT_SECONDS):
                    head = await reader.readuntil(b"\r\n\r\n")
                request = parse_proxy_request(head)
            except (ProxyRequestInvalid, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    TimeoutError) as error:
                await _answer(writer, 400, f"not a proxy request this proxy serves: {error}")
                return
            upstream = await self._open(request, writer)
            if upstream is None:
                return
            up_reader, up_writer = upstream
            if request.tunnel:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                up_writer.write(request.forward_head)
            await _relay(reader, writer, up_reader, up_writer)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _open(self, request: ProxyRequest, writer: asyncio.StreamWriter
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            check_destination(self._policy, request.host, request.port)
            infos = await self._loop.getaddrinfo(request.host, request.port,
                                                 type=socket.SOCK_STREAM)
            addresses = check_addresses((info[4][0] for info in infos), self._allowed,
                                        host=request.host)
        except NetworkPolicyViolation as refused:
            self.refused.append({"host": request.host, "port": request.port,
                                 "reason": refused.message})
            log.info("egress.refused", host=request.host, port=request.port,
                     reason=refused.message)
            await _answer(writer, 403, refused.message, code=refused.code)
            return None
        except OSError as error:  # name resolution failed
            await _answer(writer, 502, f"{request.host} cannot be resolved: {error}")
            return None
        for address in addresses:
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                    return await asyncio.open_connection(str(address), request.port)
            except (OSError, TimeoutError):
                continue
        await _answer(writer, 502, f"{request.host}:{request.port} is not reachable")
        return None


async def _answer(writer: asyncio.StreamWriter, status: int, message: str, *,
                  code: str | None = None) -> None:
    reasons = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}
    body = (message + "\n").encode("utf-8", "replace")
    head = [f"HTTP/1.1 {status} {reasons[status]}", "Content-Type: text/plain; charset=utf-8",
            f"Content-Length: {len(body)}", "Connection: close"]
    if code is not None:
        head.append(f"X-Toolexec-Error: {code}")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    with contextlib.suppress(OSError):
        await writer.drain()


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> None:
    async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while chunk := await source.read(_COPY_CHUNK):
                sink.write(chunk)
                await sink.drain()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                if sink.can_write_eof():
                    sink.write_eof()

    try:
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
    finally:
        up_writer.close()
        with contextlib.suppress(Exception):
            await up_writer.wait_closed()
