"""A Kafka-protocol relay: `python -m toolexec.kafka_relay --listen HOST:PORT --origin HOST:PORT`.

The embedded broker's gate (`toolexec.broker_gate`). Each client connection gets a
connection of its own to the broker, so one client's waiting request (a long-poll
fetch, a JoinGroup waiting for its rebalance) never holds up another's (`tansu proxy`
0.6 forwards every client over a pool of four broker connections, one request each:
under a few consumer groups heartbeats queued past their session timeout).

Bytes are relayed as they come, framed only to find each request's api key and each
response's correlation id; the responses that name brokers (Metadata,
FindCoordinator, DescribeCluster) are held whole and the broker's address in them is
replaced by the relay's (`toolexec.kafka_addresses`).

A waiting fetch is answered when records arrive, as Kafka does (Tansu holds every
fetch for its full wait, so its consumers had to poll every millisecond): a classic
fetch waiting `HOLD_FROM_MS` or more is held here. The relay asks the broker for it
(with a 1 ms wait, answered at once when records are there) only when records may be
there: it knows each partition's end from the fetch answers it relays, until a
produce to that partition is acknowledged through it (`toolexec.kafka_fetches`,
`Wakeups`). A produce that reaches the broker by another way wakes no one: its
records come with the fetch's wait, as before. Requests behind a held fetch on the
same connection wait for its answer (a broker answers a connection in order).

With `--notify-fd FD` (a pipe's writing end) the relay also tells there which
partitions produces were acknowledged to (`ProduceBell`, one write per turn of its
event loop): the embedded broker's supervisor archives the log when told, instead of
polling it.

The process runs until it is signalled; stopping it drops every client connection,
and the port then refuses connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping

from toolexec.kafka_addresses import REWRITTEN_KEYS, Address, rewrite_response
from toolexec.kafka_fetches import (
    API_VERSIONS,
    FETCH,
    PRODUCE,
    FetchWait,
    Place,
    cap_fetch_version,
    read_fetch,
    read_fetch_answer,
    read_produce,
)

CHUNK = 256 * 1024
PIPE_BUF = 4096  # POSIX: a pipe write up to this size is never split
REQUEST_HEAD = 12  # size, api_key, api_version, correlation_id
RESPONSE_HEAD = 8  # size, correlation_id
HOLD_FROM_MS = 10
"""A fetch waiting this long or longer is held by the relay (shorter ones are polls
the client chose, relayed as they are)."""
ASK_WAIT_MS = 1
"""The wait of the relay's own asks for a held fetch: Tansu answers one with records
at once, and one with no wait at all without reading the log (always empty)."""


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
        """What to send on for `chunk`, in one piece."""
        return b"".join(self.pieces(chunk))

    def pieces(self, chunk: bytes) -> Iterator[bytes]:
        """What to send on for `chunk`: bytes passed through, and each held frame
        (transformed) as a piece of its own. Lazy: a held frame's `transform` runs as
        its piece is reached, so the consumer may act on it before the next frame is
        read."""
        i, n = 0, len(chunk)
        while i < n:
            if self._left:
                take = min(self._left, n - i)
                if self._held is not None:
                    self._held += chunk[i:i + take]
                else:
                    yield chunk[i:i + take]
                self._left -= take
                i += take
                if not self._left and self._held is not None:
                    yield self._release()
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
                if not self._left:
                    yield self._release()
            else:
                yield head

    def _release(self) -> bytes:
        assert self._held is not None
        frame, self._held = bytes(self._held), None
        return self._transform(frame)


Generation = tuple[int, int]
"""(produces of unknown partitions, produces to the partition) acknowledged so far."""


class Wakeups:
    """What one relay knows of the log: the produces acknowledged through it, per
    partition, the fetches waiting for them, and each partition's end as the last
    fetch answer told it (valid until the next produce to the partition)."""

    def __init__(self) -> None:
        self._counts: dict[Place, int] = {}
        self._everything = 0
        self._ends: dict[Place, tuple[int, Generation]] = {}
        self._waiting: dict[Place, set[asyncio.Event]] = {}

    def mark(self, places: Iterable[Place]) -> dict[Place, Generation]:
        """The generation of each of `places` now."""
        return {place: (self._everything, self._counts.get(place, 0)) for place in places}

    def learn(self, ends: Mapping[Place, int], mark: Mapping[Place, Generation]) -> None:
        """`ends` were read by a fetch asked at `mark`: kept for the partitions no
        produce has reached since."""
        now = self.mark(ends)
        for place, end in ends.items():
            if mark.get(place) == now[place]:
                self._ends[place] = (end, now[place])

    def at_end(self, offsets: Mapping[Place, int]) -> bool:
        """Whether no records can be there for a fetch from `offsets`: each
        partition's end is known and not beyond its offset."""
        now = self.mark(offsets)
        for place, offset in offsets.items():
            known = self._ends.get(place)
            if known is None or known[1] != now[place] or offset < known[0]:
                return False
        return bool(offsets)

    def produced(self, places: frozenset[Place] | None) -> None:
        """A produce to `places` (None: unknown) was acknowledged: wake their fetches."""
        if places is None:
            self._everything += 1
            for events in self._waiting.values():
                for event in events:
                    event.set()
            return
        for place in places:
            self._counts[place] = self._counts.get(place, 0) + 1
            for event in self._waiting.get(place, ()):
                event.set()

    async def wait(self, mark: Mapping[Place, Generation], seconds: float) -> None:
        """Until a produce to one of `mark`'s partitions after it, or `seconds`."""
        if self.mark(mark) != mark:
            return
        event = asyncio.Event()
        for place in mark:
            self._waiting.setdefault(place, set()).add(event)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), seconds)
        finally:
            for place in mark:
                waiters = self._waiting.get(place)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiting[place]


class _Connection:
    """One client connection and its own connection to the broker."""

    def __init__(self, relay: Relay, client_out: asyncio.StreamWriter,
                 origin_out: asyncio.StreamWriter) -> None:
        self.relay = relay
        self.client_out = client_out
        self.origin_out = origin_out
        self.rewritten: dict[bytes, tuple[int, int]] = {}  # correlation -> (api key, version)
        self.produces: dict[bytes, frozenset[Place] | None] = {}  # correlation -> places
        self._to_hold: tuple[FetchWait, bytes] | None = None
        self._asked: bytes | None = None  # correlation id of the relay's own ask
        self._answer: asyncio.Future[bytes] | None = None
        self._answer_due = False
        self._empty: tuple[object, Mapping[Place, Generation], bytes] | None = None
        self._fetched: set[Place] = set()  # every partition fetched on this connection
        self._answered: dict[Place, Generation] = {}  # their generations at the last answer
        self.requests = FrameScanner(REQUEST_HEAD, self._holds_request, self._request)
        self.responses = FrameScanner(RESPONSE_HEAD, self._holds_response, self._response)

    # requests

    def _holds_request(self, head: bytes) -> bool:
        api_key = int.from_bytes(head[4:6], "big")
        if api_key in REWRITTEN_KEYS or api_key == API_VERSIONS:
            self.rewritten[head[8:12]] = (api_key, int.from_bytes(head[6:8], "big"))
            return False
        return api_key in (FETCH, PRODUCE)

    def _request(self, frame: bytes) -> bytes:
        api_key = int.from_bytes(frame[4:6], "big")
        version = int.from_bytes(frame[6:8], "big")
        correlation = frame[8:12]
        if api_key == PRODUCE:
            produced = read_produce(frame, version)
            if produced is None:
                self.produces[correlation] = None
            elif produced.acks == 0:  # no answer will come: wake as it goes
                self.relay.produced(produced.places)
            else:
                self.produces[correlation] = produced.places
            return frame
        fetch = read_fetch(frame, version)
        if (fetch is None or fetch.in_session or fetch.min_bytes <= 0 or not fetch.offsets
                or fetch.max_wait_ms < HOLD_FROM_MS):
            return frame
        self._to_hold = (fetch, frame)
        return b""

    async def pump_requests(self, source: asyncio.StreamReader) -> None:
        """Client to broker; a held fetch is served before the next request is read
        (a broker answers a connection's requests in order)."""
        while chunk := await source.read(CHUNK):
            for piece in self.requests.pieces(chunk):
                if piece:
                    self.origin_out.write(piece)
                if self._to_hold is not None:
                    fetch, frame = self._to_hold
                    self._to_hold = None
                    await self.origin_out.drain()
                    await self._serve(fetch, frame)
            await self.origin_out.drain()

    async def _serve(self, fetch: FetchWait, frame: bytes) -> None:
        """Answer a held fetch: asked of the broker only when records may be there,
        else once a produce reaches one of its partitions or its wait is over. A
        produce to another partition this connection fetched before (since its last
        answer) ends the wait too, empty: the client may be waiting to fetch that one
        (aiokafka sends no fetch to a broker while one is in flight there)."""
        loop = asyncio.get_running_loop()
        wakeups = self.relay.wakeups
        version = int.from_bytes(frame[6:8], "big")
        deadline = loop.time() + fetch.max_wait_ms / 1000
        ask = fetch.with_wait(frame, ASK_WAIT_MS)
        asked = (version, fetch.key)
        self._fetched.update(fetch.offsets)
        answer: bytes | None = None
        over = False  # the wait is over: the next answer is the answer
        while True:
            mark = wakeups.mark(fetch.offsets)
            if wakeups.at_end(fetch.offsets):
                if not over and loop.time() < deadline:
                    others = {place: self._answered.get(place, generation)
                              for place, generation
                              in wakeups.mark(self._fetched.difference(fetch.offsets)).items()}
                    await wakeups.wait({**mark, **others}, deadline - loop.time())
                    if wakeups.mark(fetch.offsets) != mark:
                        continue  # a produce landed here: ask
                answer = answer or self._same_as_before(asked, mark, frame[8:12])
                if answer is not None:
                    break  # nothing came here: the empty answer stands
                over = True
            answer = await self._ask(ask)
            read = read_fetch_answer(answer, version)
            if read is None:
                break
            wakeups.learn(read.ends, mark)  # the next fetch, from those ends, may wait here
            if read.found:
                break
            unchanged = wakeups.mark(fetch.offsets) == mark
            if unchanged:
                self._empty = (asked, mark, answer)
            if over or loop.time() >= deadline or (
                    unchanged and not wakeups.at_end(fetch.offsets)):
                break  # the wait is over, or empty yet records should be there
        self.client_out.write(answer)
        self._answered = wakeups.mark(self._fetched)
        await self.client_out.drain()

    def _same_as_before(self, asked: object, mark: Mapping[Place, Generation],
                        correlation: bytes) -> bytes | None:
        """The broker's last empty answer to this very request when no produce has
        reached its partitions since (an idle consumer asks the same every wait)."""
        if self._empty is None:
            return None
        before, then, answer = self._empty
        if before != asked or then != mark:
            return None
        return answer[:4] + correlation + answer[8:]

    async def _ask(self, frame: bytes) -> bytes:
        self._asked = frame[8:12]
        self._answer = asyncio.get_running_loop().create_future()
        self.origin_out.write(frame)
        await self.origin_out.drain()
        return await self._answer

    # responses

    def _holds_response(self, head: bytes) -> bool:
        correlation = head[4:8]
        if correlation in self.produces:
            self.relay.produced(self.produces.pop(correlation))
            return False
        if correlation == self._asked:
            self._asked = None
            self._answer_due = True
            return True
        return correlation in self.rewritten

    def _response(self, frame: bytes) -> bytes:
        if self._answer_due:
            return frame
        api_key, version = self.rewritten.pop(frame[4:8])
        if api_key == API_VERSIONS:
            return cap_fetch_version(frame, version)
        return rewrite_response(frame, api_key, version, origin=self.relay.origin,
                                public=self.relay.listen)

    async def pump_responses(self, source: asyncio.StreamReader) -> None:
        """Broker to client; the answers to the relay's own asks go to `_serve`."""
        while chunk := await source.read(CHUNK):
            for piece in self.responses.pieces(chunk):
                if self._answer_due:
                    self._answer_due = False
                    assert self._answer is not None
                    self._answer.set_result(piece)
                else:
                    self.client_out.write(piece)
            await self.client_out.drain()


class Relay:
    """Listens on `listen` and relays each connection to `origin`, advertising
    `listen` in place of `origin`. A classic fetch that waits `HOLD_FROM_MS` or more
    is held here and answered as soon as a produce through this relay lands in one
    of its partitions."""

    def __init__(self, listen: Address, origin: Address, *,
                 bell: ProduceBell | None = None) -> None:
        self.listen = listen
        self.origin = origin
        self.wakeups = Wakeups()
        self.bell = bell
        self._server: asyncio.Server | None = None

    def produced(self, places: frozenset[Place] | None) -> None:
        """A produce to `places` (None: unknown) was acknowledged through the relay."""
        self.wakeups.produced(places)
        if self.bell is not None:
            self.bell.ring(places)

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
        connection = _Connection(self, client_out, origin_out)
        pumps = [asyncio.create_task(connection.pump_requests(client_in)),
                 asyncio.create_task(connection.pump_responses(origin_in))]
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


class ProduceBell:
    """Tells whoever reads the other end of a pipe which partitions produces were
    acknowledged to: one write per turn of the event loop however many landed in
    it, a line `PARTITION TOPIC` per partition (`*` when some produce's partitions
    could not be read). When the pipe is full the news is kept and told as `*` by the
    next write that goes through; a reader gone for good silences the bell."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd: int | None = fd
        self._places: set[Place] = set()
        self._everything = False
        self._due = False

    def ring(self, places: frozenset[Place] | None) -> None:
        if self.fd is None:
            return
        if places is None or any(_unsayable(topic) for topic, _ in places):
            self._everything = True  # a name no broker takes cannot add lines of its own
        else:
            self._places |= places
        if not self._due:
            self._due = True
            asyncio.get_running_loop().call_soon(self._write)

    def _write(self) -> None:
        self._due = False
        if self.fd is None:
            return
        news = b"*\n" if self._everything else b"".join(
            b"%d %s\n" % (partition, topic.encode()) for topic, partition in self._places)
        if len(news) > PIPE_BUF:  # one write, never split: so many partitions are everything
            news = b"*\n"
        try:
            os.write(self.fd, news)
        except BlockingIOError:  # full: whatever it cannot hold goes as everything
            self._everything = True
            return
        except OSError:  # the reader is gone (its supervisor restarts the gate)
            os.close(self.fd)
            self.fd = None
        self._places.clear()
        self._everything = False


def _unsayable(topic: str) -> bool:
    return " " in topic or "\n" in topic


def read_news(chunk: bytes) -> tuple[set[Place], bool]:
    """The partitions a `ProduceBell` told in `chunk` (whole lines), and whether it
    told everything."""
    places: set[Place] = set()
    everything = False
    for line in chunk.split(b"\n"):
        if line == b"*":
            everything = True
        elif line:
            partition, _, topic = line.partition(b" ")
            try:
                places.add((topic.decode(), int(partition)))
            except ValueError:
                everything = True
    return places, everything


def _address(text: str) -> Address:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _main(listen: Address, origin: Address, notify_fd: int | None) -> None:
    relay = Relay(listen, origin, bell=ProduceBell(notify_fd) if notify_fd is not None else None)
    await relay.start()
    print(f"relaying {listen[0]}:{listen[1]} -> {origin[0]}:{origin[1]}", flush=True)
    await relay.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolexec.kafka_relay",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=_address, required=True, help="HOST:PORT")
    parser.add_argument("--origin", type=_address, required=True, help="HOST:PORT")
    parser.add_argument("--notify-fd", type=int, metavar="FD",
                        help="a pipe to tell which partitions produces were acknowledged to")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args.listen, args.origin, args.notify_fd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
