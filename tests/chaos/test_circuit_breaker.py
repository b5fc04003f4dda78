"""An external HTTP service failing 100% trips its breaker; recovery goes through
half-open (spec 12.5.1, issue 6 chaos test 1). Real broker, real HTTP server.

The breaker's timeout is an hour of the stack's clock, which the test moves past it:
the breaker turns half-open when the test says, never because a busy machine took
longer than the timeout over the calls the test makes while it is open."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from contracts import topics
from contracts.envelope import Envelope
from contracts.kafka_binding import UndecodableRecord, decode
from tests.waiting import WAIT
from toolexec import stack as stack_module
from toolexec.client import InvocationClient
from toolexec.publishing import publish_event
from toolexec.settings import Settings
from toolexec.sources import load_builtin_sources, load_source
from toolexec.stack import Stack

pytestmark = pytest.mark.chaos

FAILURE_THRESHOLD = 3
SUCCESS_THRESHOLD = 2
TIMEOUT_SECONDS = 3600


@dataclass
class FlakyService:
    """A local HTTP service that answers 503 until it is made healthy; counts requests."""

    healthy: bool = False
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                with service.lock:
                    service.requests += 1
                status, body = (200, b'{"ok": true}') if service.healthy else (503, b"down")
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


@contextlib.contextmanager
def serving(service: FlakyService) -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), service.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


def flaky_tool(directory: Path, port: int, service_id: str) -> Path:
    path = directory / "flaky_api.yaml"
    path.write_text(
        "tool_id: flaky_api\nversion: \"1.0.0\"\ntool_type: api\nexecutor: http_client\n"
        "description: Calls a local service that fails on purpose.\n"
        f"config:\n  method: GET\n  url_template: \"http://127.0.0.1:{port}/ping\"\n"
        f"external_service: {service_id}\n"
        "circuit_breaker_config:\n"
        f"  failure_threshold: {FAILURE_THRESHOLD}\n  success_threshold: {SUCCESS_THRESHOLD}\n"
        f"  timeout_seconds: {TIMEOUT_SECONDS}\n  half_open_max_calls: 1\n"
        "network_policy:\n  allowed_domains: [\"127.0.0.1\"]\n"
        f"  allowed_ports: [{port}]\n"
    )
    return path


@dataclass
class CircuitLog:
    """Every circuit.state.changed of one service, read from toolexec.circuits."""

    bootstrap: str
    service_id: str
    events: list[Envelope] = field(default_factory=list)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def follow(self) -> None:
        consumer = AIOKafkaConsumer(topics.CIRCUITS, bootstrap_servers=self.bootstrap,
                                    group_id=None, auto_offset_reset="earliest",
                                    fetch_max_wait_ms=20)
        await consumer.start()
        try:
            async for record in consumer:
                with contextlib.suppress(UndecodableRecord):
                    event = decode(record.key, record.value, record.headers)
                    if event.partitionkey == self.service_id:
                        self.events.append(event)
                        self._arrived.set()
        finally:
            await consumer.stop()

    async def wait_for(self, count: int, timeout: float = WAIT) -> list[Envelope]:
        async with asyncio.timeout(timeout):
            while len(self.events) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return self.events[:count]

    def path(self) -> list[tuple[str, str]]:
        return [(e.data.from_state, e.data.to_state) for e in self.events]


@contextlib.asynccontextmanager
async def following(log: CircuitLog) -> AsyncIterator[CircuitLog]:
    task = asyncio.create_task(log.follow())
    try:
        yield log
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def view_shows(stack: Stack, service_id: str, state: str, since: datetime) -> None:
    """Wait until the stack's circuit view has folded the transition seen on the topic."""
    async with asyncio.timeout(WAIT):
        while not (stack.circuits.state(service_id).state == state
                   and stack.circuits.state(service_id).since == since):
            await asyncio.sleep(0.01)


def half_open_at(opened: Envelope) -> datetime:
    """A moment safely after the breaker opened by `opened` turns half-open."""
    return opened.data.since + timedelta(seconds=TIMEOUT_SECONDS, milliseconds=100)


@dataclass
class ShiftedClock:
    """The stack's clock: the real time plus a shift that only the test makes."""

    shift: timedelta = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.shift

    def move_to(self, moment: datetime) -> None:
        """From now on the clock reads `moment` or later."""
        self.shift = max(self.shift, moment - datetime.now(UTC))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> ShiftedClock:
    shifted = ShiftedClock()
    monkeypatch.setattr(stack_module, "utc_now", shifted)
    return shifted


def failure_of(event: Envelope) -> tuple[str, str]:
    assert event.type == "tool.invoke.failed", event.data
    return event.data.error.code, event.data.stage


async def test_failing_service_trips_the_breaker_and_recovers_through_half_open(
        tmp_path: Path, clock: ShiftedClock) -> None:
    service_id = f"flaky-{uuid.uuid4().hex[:8]}"
    flaky = FlakyService()
    settings = Settings(state_dir=tmp_path, tools_dir=tmp_path / "none", user_tools_dir=None,
                        egress_allowed_networks=["127.0.0.1/32"])  # the flaky local service
    with serving(flaky) as port:
        async with Stack(settings) as stack, \
                following(CircuitLog(stack.bootstrap, service_id)) as circuit_log, \
                InvocationClient(stack.bootstrap, verifier=stack.verifier) as client:
            now = datetime.now(UTC)
            for source in load_builtin_sources() + [load_source(flaky_tool(tmp_path, port,
                                                                            service_id))]:
                await stack.publish(publish_event(source, now=now))

            async def call() -> Envelope:
                return await client.invoke("flaky_api", {}, timeout=WAIT)

            # The service fails: after failure_threshold failures the breaker opens.
            for _ in range(FAILURE_THRESHOLD):
                assert failure_of(await call()) == ("E3502", "execute")
            (opened,) = await circuit_log.wait_for(1)
            assert circuit_log.path() == [("closed", "open")]
            assert opened.data.failure_count == FAILURE_THRESHOLD
            assert flaky.requests == FAILURE_THRESHOLD
            await view_shows(stack, service_id, "open", opened.data.since)

            # Open: calls fail fast with E3501 and never reach the service.
            for _ in range(3):
                refused = await call()
                assert failure_of(refused) == ("E3501", "execute")
                assert refused.data.error.details["service_id"] == service_id
            assert flaky.requests == FAILURE_THRESHOLD
            assert clock() < opened.data.since + timedelta(seconds=TIMEOUT_SECONDS)

            # After the timeout one canary goes through; it fails, so the breaker reopens.
            clock.move_to(half_open_at(opened))
            assert failure_of(await call()) == ("E3502", "execute")
            assert flaky.requests == FAILURE_THRESHOLD + 1
            *_, reopened = await circuit_log.wait_for(3)
            assert circuit_log.path()[1:] == [("open", "half_open"), ("half_open", "open")]
            await view_shows(stack, service_id, "open", reopened.data.since)
            assert failure_of(await call()) == ("E3501", "execute")
            assert flaky.requests == FAILURE_THRESHOLD + 1

            # The service heals: after the timeout, success_threshold canaries close it.
            flaky.healthy = True
            clock.move_to(half_open_at(reopened))
            for _ in range(SUCCESS_THRESHOLD):
                assert (await call()).type == "tool.invoke.completed"
            *_, closed = await circuit_log.wait_for(5)
            assert circuit_log.path()[3:] == [("open", "half_open"), ("half_open", "closed")]
            assert closed.data.success_count == SUCCESS_THRESHOLD
            await view_shows(stack, service_id, "closed", closed.data.since)
            completed = await call()
            assert completed.type == "tool.invoke.completed", completed.data
            assert completed.data.result == {"ok": True}
            assert flaky.requests == FAILURE_THRESHOLD + 1 + SUCCESS_THRESHOLD + 1
            assert len(circuit_log.events) == 5
