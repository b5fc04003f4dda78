"""The whole pipeline against a real Tansu broker and real tool processes."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import gzip
import http.server
import json
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from contracts import topics
from contracts.envelope import Envelope
from contracts.kafka_binding import UndecodableRecord, decode
from tests.waiting import WAIT, eventually
from toolexec.client import InvocationClient
from toolexec.publishing import publish_event
from toolexec.settings import Settings
from toolexec.sources import load_builtin_sources, load_source
from toolexec.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

TOOLS = Path(__file__).parent / "tools"


class _EchoHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = json.dumps({"path": self.path, "ok": True}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def http_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _api_tool(tmp: Path, host: str) -> Path:
    path = tmp / "lookup_api.yaml"
    path.write_text(
        "tool_id: lookup_api\nversion: \"1.0.0\"\ntool_type: api\nexecutor: http_client\n"
        "description: Looks a word up on the local test server.\n"
        f"config:\n  method: GET\n  url_template: \"http://{host}/lookup/{{word}}\"\n"
        "parameters:\n  type: object\n  properties:\n    word: {type: string}\n"
        "  required: [word]\n"
        f"network_policy:\n  allowed_domains: [\"127.0.0.1\"]\n  allowed_ports: [{host.split(':')[1]}]\n"
    )
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory, http_server: str) -> AsyncIterator[Stack]:
    state = tmp_path_factory.mktemp("state")
    # rlimits: some tools here report to files on the host (process-group checks read
    # host pids); the bubblewrap sandbox has its own tests (tests/security).
    settings = Settings(state_dir=state, tools_dir=state / "none", user_tools_dir=None,
                        egress_allowed_networks=["127.0.0.1/32"],  # the local API server
                        sandbox="rlimits")
    async with Stack(settings, group_prefix=f"t{uuid.uuid4().hex[:6]}") as running:
        now = datetime.now(UTC)
        sources = load_builtin_sources() + [
            load_source(p) for p in sorted(TOOLS.iterdir()) if p.is_dir()
        ] + [load_source(_api_tool(state, http_server))]
        for source in sources:
            event = publish_event(source, now=now)
            assert event.type == "tool.published", event.data
            await running.publish(event)
        yield running


@pytest_asyncio.fixture(loop_scope="module")
async def client(stack: Stack) -> AsyncIterator[InvocationClient]:
    async with InvocationClient(stack.bootstrap, verifier=stack.verifier) as c:
        yield c


def _error(event: Envelope) -> tuple[str, dict]:
    assert event.type == "tool.invoke.failed", event.data
    return event.data.error.code, event.data.error.details


async def test_python_script_tool_runs_end_to_end(client: InvocationClient) -> None:
    event = await client.invoke("py_echo", {"text": "ab", "times": 2})
    assert event.type == "tool.invoke.completed", event.data
    assert event.data.result == {"echo": "abab", "keys": 2}
    assert event.data.version == "1.0.0"


async def test_bash_script_tool_runs_end_to_end(client: InvocationClient) -> None:
    event = await client.invoke("sh_upper", {"text": "quiet words"})
    assert event.type == "tool.invoke.completed", event.data
    assert "QUIET WORDS" in event.data.result["upper"]


async def test_api_tool_calls_the_local_server(client: InvocationClient) -> None:
    event = await client.invoke("lookup_api", {"word": "a b/c"})
    assert event.type == "tool.invoke.completed", event.data
    assert event.data.result == {"path": "/lookup/a%20b%2Fc", "ok": True}


async def test_unknown_tool_fails_with_E3101(client: InvocationClient) -> None:
    code, _ = _error(await client.invoke("no_such_tool", {}))
    assert code == "E3101"


async def test_unknown_version_fails_with_E3102(client: InvocationClient) -> None:
    code, details = _error(await client.invoke("py_echo", {"text": "x"}, version_range="^9"))
    assert code == "E3102"


async def test_bad_parameters_fail_with_E3301_listing_every_violation(
        client: InvocationClient) -> None:
    code, details = _error(await client.invoke("py_echo", {"text": "x" * 60, "times": 0,
                                                           "extra": 1}))
    assert code == "E3301"
    assert len(details["issues"]) == 3


async def test_timeout_kills_the_whole_process_group(client: InvocationClient,
                                                     tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    code, _ = _error(await client.invoke("sleeper", {"pidfile": str(pidfile)}))
    assert code == "E3402"
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2
    # SIGKILLed processes exit asynchronously: every one of them goes, however loaded.
    await eventually(lambda: not [pid for pid in pids if _running(pid)],
                     f"the tool's process group {pids} killed")


def _running(pid: int) -> bool:
    """Alive and not a zombie (killed orphans stay zombies where PID 1 does not reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


async def test_memory_hog_fails_with_E3403(client: InvocationClient) -> None:
    code, _ = _error(await client.invoke("hog", {}))
    assert code == "E3403"


async def test_hostile_parameter_reaches_the_tool_verbatim(client: InvocationClient,
                                                           tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = f"; rm -rf /tmp/x $(touch {marker}) `touch {marker}` | touch {marker}"
    event = await client.invoke("hostile_echo", {"cmd": hostile})
    assert event.type == "tool.invoke.completed", event.data
    assert event.data.result["cmd"] == hostile
    assert event.data.result["argv"] == []
    assert not marker.exists()


async def test_a_tampered_publication_never_enters_the_registry(
        stack: Stack, client: InvocationClient) -> None:
    source = load_source(TOOLS / "py_echo")
    source = dataclasses.replace(source, manifest={**source.manifest, "tool_id": "tamper_me"})
    event = publish_event(source, now=datetime.now(UTC))
    evil = gzip.compress(b"print('owned')", mtime=0)
    files = [f.model_copy(update={"content_b64gz": base64.b64encode(evil).decode()})
             if f.path == "main.py" else f for f in event.data.files]
    await stack.publish(_with_data(event, event.data.model_copy(update={"files": files})))
    code, details = _error(await client.invoke("tamper_me", {"text": "x"}))
    assert code == "E3101" and details["tool_id"] == "tamper_me"  # nothing ran
    refusal = stack.registry.refusal("tamper_me", "1.0.0")
    assert refusal is not None and refusal.code == "E3105" and "main.py" in refusal.message


def _with_data(event: Envelope, data: object) -> Envelope:
    from contracts.envelope import new_envelope

    return new_envelope(data, source=event.source, partitionkey=event.partitionkey,
                        correlationid=event.correlationid, id=str(uuid.uuid4()),
                        time=event.time)


@pytest.mark.parametrize("topic", [topics.REQUESTS, topics.INVOCATIONS])
async def test_undecodable_record_is_dead_lettered_and_the_pipeline_goes_on(
        stack: Stack, client: InvocationClient, topic: str) -> None:
    key = f"garbage-{uuid.uuid4()}".encode()
    producer = AIOKafkaProducer(bootstrap_servers=stack.bootstrap)
    await producer.start()
    try:
        headers = [("ce_type", b"tool.invoke.requested")]
        await producer.send_and_wait(topic, b"\x00not json", key=key, headers=headers)
    finally:
        await producer.stop()
    event = await client.invoke("py_echo", {"text": "after"})
    assert event.type == "tool.invoke.completed", event.data
    record = await _find_deadletter(stack.bootstrap, key)
    document = decode(record.key, record.value, record.headers).data
    assert document.error.code == "E3004"
    assert document.topic == topic


async def _find_deadletter(bootstrap: str, key: bytes) -> Any:
    consumer = AIOKafkaConsumer(topics.DEADLETTER, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        async with asyncio.timeout(WAIT):
            while True:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    for record in records:
                        if record.key == key:
                            return record
    finally:
        await consumer.stop()


async def test_each_invocation_ends_with_exactly_one_terminal_event(
        stack: Stack, client: InvocationClient) -> None:
    ids = [str(uuid.uuid4()) for _ in range(20)]
    results = await asyncio.gather(*(client.invoke("py_echo", {"text": i[:4]}, invocation_id=i)
                                     for i in ids))
    assert [r.data for r in results if r.type != "tool.invoke.completed"] == []
    terminals = await _terminal_counts(stack.bootstrap, set(ids))
    assert terminals == {i: 1 for i in ids}


async def _terminal_counts(bootstrap: str, ids: set[str]) -> dict[str, int]:
    consumer = AIOKafkaConsumer(topics.INVOCATIONS, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest")
    await consumer.start()
    counts: dict[str, int] = {}
    try:
        ends = await consumer.end_offsets(list(consumer.assignment()))
        done = {tp: False for tp in ends}
        while not all(done.values()):
            batch = await consumer.getmany(timeout_ms=500)
            for tp, records in batch.items():
                for record in records:
                    if record.offset >= ends[tp] - 1:
                        done[tp] = True
                    try:
                        env = decode(record.key, record.value, record.headers)
                    except UndecodableRecord:
                        continue
                    if env.type in ("tool.invoke.completed", "tool.invoke.failed") \
                            and env.correlationid in ids:
                        counts[env.correlationid] = counts.get(env.correlationid, 0) + 1
            for tp in ends:
                if ends[tp] == 0 or await consumer.position(tp) >= ends[tp]:
                    done[tp] = True
    finally:
        await consumer.stop()
    return counts
