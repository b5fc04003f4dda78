"""The callback deliverer on a real broker and read model, with the facts written
directly to the log: an outcome already recorded on `toolexec.callbacks` is not sent
again, even when the facts' offsets were never committed (a deliverer that crashed
between its record and its commit, or a new owner after a rebalance)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from cryptography.hazmat.primitives.asymmetric import ed25519
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts.envelope import Envelope, new_envelope
from contracts.events import InvokeCompleted, InvokeRequested
from contracts.fact_signature import FactSigner, FactVerifier
from contracts.kafka_binding import encode, send_event
from tests.integration.test_status_snapshot import fold
from tests.projection_db import *  # noqa: F403 - fixtures
from toolexec.callback_delivery import (
    CallbackDeliverer,
    CallbackPolicy,
    RequestNotFolded,
    outcome_event,
    read_model_lookup,
)
from toolexec.callback_delivery import Delivery as Outcome
from toolexec.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[str]]]:
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            paths.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", paths
    server.shutdown()


def _terminal(invocation_id: str) -> Envelope:
    data = InvokeCompleted(invocation_id=invocation_id, tool_id="hello", version="1.0.0",
                           result={"ok": True}, duration_ms=1.0, attempts=1)
    return new_envelope(data, source="urn:test", partitionkey=invocation_id,
                        correlationid=invocation_id, causationid=f"cause-{invocation_id}",
                        time=datetime.now(UTC))


def _request(invocation_id: str, url: str) -> Envelope:
    data = InvokeRequested(invocation_id=invocation_id, tool_id="hello", callback_url=url)
    return new_envelope(data, source="urn:test", partitionkey=invocation_id,
                        correlationid=invocation_id, id=f"req-{invocation_id}",
                        time=datetime.now(UTC))


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_recorded_outcome_is_not_sent_again(
        engine: AsyncEngine, kafka_bootstrap: str, receiver: tuple[str, list[str]],
        tmp_path: Path) -> None:
    url, posts = receiver
    tag = uuid.uuid4().hex[:8]
    sent, recorded = f"inv-sent-{tag}", f"inv-recorded-{tag}"
    await fold(engine, [_request(recorded, f"{url}/{recorded}"),
                        _request(sent, f"{url}/{sent}")])
    key = ed25519.Ed25519PrivateKey.generate()
    signer = FactSigner(key)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        already = _terminal(recorded)
        # Its outcome is on the log, but no deliverer committed the facts' offsets.
        await send_event(producer, outcome_event(already, "127.0.0.1",
                                                 Outcome(attempts=1, status_code=200)))
        for terminal in (already, _terminal(sent)):  # one partition: in this order
            await send_event(producer, terminal, record=signer.sign([encode(terminal)])[0],
                             partition=0)
    finally:
        await producer.stop()

    async def caught_up(timeout: float) -> bool:
        return True  # every request was folded before the deliverer started

    settings = Settings(state_dir=tmp_path / "state")
    deliverer = CallbackDeliverer(
        settings, kafka_bootstrap, lookup=read_model_lookup(engine, caught_up),
        publish=lambda envelope: asyncio.sleep(0), verifier=FactVerifier([key.public_key()]),
        policy=CallbackPolicy(hosts=("127.0.0.1",), secret=b"0123456789abcdef"),
        group=f"test-callbacks-{tag}")
    async with deliverer:
        for _ in range(1200):
            if f"/{sent}" in posts:
                break
            await asyncio.sleep(0.1)
    assert posts.count(f"/{sent}") == 1
    assert f"/{recorded}" not in posts


async def test_a_request_the_read_model_has_not_folded_is_waited_for_not_skipped(
        engine: AsyncEngine) -> None:
    tag = uuid.uuid4().hex[:8]
    waiting, absent = f"inv-late-{tag}", f"inv-absent-{tag}"

    async def behind(timeout: float) -> bool:
        return False  # the model did not catch up within the wait

    with pytest.raises(RequestNotFolded):  # the batch is handled again, nothing lost
        await read_model_lookup(engine, behind)(waiting)
    await fold(engine, [_request(waiting, "https://hooks.example.net/late")])
    assert await read_model_lookup(engine, behind)(waiting) == "https://hooks.example.net/late"

    async def caught_up(timeout: float) -> bool:
        return True

    assert await read_model_lookup(engine, caught_up)(absent) is None  # no such request
