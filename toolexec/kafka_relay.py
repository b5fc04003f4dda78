"""A Kafka-protocol relay: `python -m toolexec.kafka_relay --listen HOST:PORT --origin HOST:PORT`.

The embedded broker's gate (`toolexec.broker_gate`). Each client connection gets a
connection of its own to the broker, so one client's waiting request (a long-poll
fetch, a JoinGroup waiting for its rebalance) never holds up another's (`tansu proxy`
0.6 forwards every client over a pool of four broker connections, one request each:
under a few consumer groups heartbeats queued past their session timeout).

Bytes are relayed as they come, framed only to find each request's api key and each
response's correlation id; the responses that name brokers (Metadata,
FindCoordinator, DescribeCluster) are held whole and the broker's address in them is
replaced by the relay's (`toolexec.kafka_addresses`). The process runs until it is
signalled; stopping it drops every client connection, and the port then refuses
connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable

from toolexec.kafka_addresses import REWRITTEN_KEYS, Address, rewrite_response

CHUNK = 256 * 1024
REQUEST_HEAD = 12  # size, api_key, api_version, correlation_id
RESPONSE_HEAD = 8  # size, correlation_id


class ProtocolError(ValueError):
    """A frame shorter than its own header."""


class FrameScanner:
    """Follows the frames of one direction of a connection as chunks arrive.

    `inspect(head)` sees the first `head_size` bytes of each frame and says whether the
    frame is to be held whole; `transform(frame)` then returns what is sent instead.
    Every other byte passes on as it came."""

    def __init__(self, head_size: int, inspect: Callable[[bytes], bool],
                 transform: Callable[[bytes], bytes]) -> None:
        self.head_size = head_size
        self._inspect = inspect
        self._transform = transform
        self._head = bytearray()
        self._left = 0  # bytes of the current frame still to come
        self._held: bytearray | None = None

    def feed(self, chunk: bytes) -> bytes:
        out: list[bytes] = []
        i, n = 0, len(chunk)
        while i < n:
            if self._left:
                take = min(self._left, n - i)
                if self._held is not None:
                    self._held += chunk[i:i + take]
                else:
                    out.append(chunk[i:i + take])
                self._left -= take
                i += take
                if not self._left:
                    self._end_frame(out)
                continue
            take = min(self.head_size - len(self._head), n - i)
            self._head += chunk[i:i + take]
            i += take
            if len(self._head) < self.head_size:
                break
            head = bytes(self._head)
            self._head.clear()
            self._left = 4 + int.from_bytes(head[:4], "big", signed=True) - self.head_size
            if self._left < 0:
                raise ProtocolError(f"a frame of {self._left + self.head_size} bytes")
            if self._inspect(head):
                self._held = bytearray(head)
            else:
                out.append(head)
            if not self._left:
                self._end_frame(out)
        return b"".join(out)

    def _end_frame(self, out: list[bytes]) -> None:
        if self._held is not None:
            out.append(self._transform(bytes(self._held)))
            self._held = None


class Relay:
    """Listens on `listen` and relays each connection to `origin`, advertising
    `listen` in place of `origin`."""

    def __init__(self, listen: Address, origin: Address) -> None:
        self.listen = listen
        self.origin = origin
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, *self.listen,
                                                  reuse_address=True)

    async def serve_forever(self) -> None:
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _connection(self, client_in: asyncio.StreamReader,
                          client_out: asyncio.StreamWriter) -> None:
        try:
            origin_in, origin_out = await asyncio.open_connection(*self.origin)
        except OSError:
            client_out.close()
            return
        pending: dict[bytes, tuple[int, int]] = {}  # correlation id -> (api key, version)

        def note_request(head: bytes) -> bool:
            api_key = int.from_bytes(head[4:6], "big")
            if api_key in REWRITTEN_KEYS:
                pending[head[8:12]] = (api_key, int.from_bytes(head[6:8], "big"))
            return False

        def is_rewritten(head: bytes) -> bool:
            return head[4:8] in pending

        def rewrite(frame: bytes) -> bytes:
            api_key, version = pending.pop(frame[4:8])
            return rewrite_response(frame, api_key, version, origin=self.origin,
                                    public=self.listen)

        requests = FrameScanner(REQUEST_HEAD, note_request, bytes)
        responses = FrameScanner(RESPONSE_HEAD, is_rewritten, rewrite)
        pumps = [asyncio.create_task(_pump(client_in, origin_out, requests)),
                 asyncio.create_task(_pump(origin_in, client_out, responses))]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            for writer in (origin_out, client_out):
                writer.close()
            for pump in pumps:
                with contextlib.suppress(asyncio.CancelledError, OSError, ProtocolError):
                    await pump


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                scanner: FrameScanner) -> None:
    while chunk := await source.read(CHUNK):
        data = scanner.feed(chunk)
        if data:
            sink.write(data)
            await sink.drain()


def _address(text: str) -> Address:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _main(listen: Address, origin: Address) -> None:
    relay = Relay(listen, origin)
    await relay.start()
    print(f"relaying {listen[0]}:{listen[1]} -> {origin[0]}:{origin[1]}", flush=True)
    await relay.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolexec.kafka_relay",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=_address, required=True, help="HOST:PORT")
    parser.add_argument("--origin", type=_address, required=True, help="HOST:PORT")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args.listen, args.origin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
