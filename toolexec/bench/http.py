"""A tiny keep-alive HTTP/1.1 server for `toolexec bench`, run as its own process.

`python -m toolexec.bench.http` listens on 127.0.0.1 (a free port), prints the port on
one stdout line and answers every GET with a small JSON body until stdin closes. It
runs in a process of its own so that serving requests never competes for the GIL with
the pipeline or the load generator it is measured against.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys

HOST = "127.0.0.1"


class EchoProtocol(asyncio.Protocol):
    """Answers each complete request head with `{"path": <path>, "ok": true}`."""

    def __init__(self) -> None:
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while b"\r\n\r\n" in self._buffer:
            head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
            self._answer(head)

    def _answer(self, head: bytes) -> None:
        assert self._transport is not None
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        path = parts[1].decode("latin-1") if len(parts) > 1 else "/"
        body = json.dumps({"path": path, "ok": True}).encode()
        self._transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


async def serve() -> None:
    """Serve until stdin reaches end of file (the parent closed it or died)."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(EchoProtocol, HOST, 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    await loop.run_in_executor(None, sys.stdin.read)
    server.close()
    with contextlib.suppress(Exception):
        await server.wait_closed()


if __name__ == "__main__":
    asyncio.run(serve())
