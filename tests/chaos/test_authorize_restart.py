"""The consumers process stops after the authorize step's consumer group has consumed
(and committed) requests whose chain resolution it has not handled yet: kill -9 then a
restart, or a stalled replica whose partitions move to another one. The capability
tokens are read back from the log; every invocation is allowed and completes, once."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from contracts import topics
from contracts.kafka_binding import UndecodableRecord, decode
from tests.chaos.up_process import start_up, wait_until_up
from tests.log_reading import terminal_event_ids
from toolexec import keys
from toolexec.client import InvocationClient
from toolexec.embedded_broker import EmbeddedBroker

pytestmark = pytest.mark.chaos

BURST = 150
AT_RISK_TO_KILL = 20
AUTHORIZE_GROUP = "toolexec.pipeline"  # authorize shares it with resolve
PARTITIONS = 4
BROKER_TOPICS = {"toolexec.registry": 1, "toolexec.invocations": PARTITIONS,
                 "toolexec.circuits": 1, "toolexec.policies": 1, "toolexec.deadletter": 1}


def start_secured_up(bootstrap: str, state: Path, public_key: Path,
                     redis_url: str | None = None) -> subprocess.Popen[bytes]:
    shared = {"redis_url": redis_url} if redis_url else {}  # executor claims of replicas
    return start_up(bootstrap, state, require_auth="true",
                    token_public_keys=f'["{public_key}"]', session_timeout_ms="1000",
                    heartbeat_interval_ms="100", rebalance_timeout_ms="1000",
                    fetch_max_wait_ms="5", **shared)


@dataclass
class LogTail:
    """What the invocations log holds so far: where each request is, which invocations
    have a permission decision (or already failed)."""

    ids: set[str]
    requests: dict[str, tuple[int, int]] = field(default_factory=dict)
    decided: set[str] = field(default_factory=set)
    decisions: dict[str, set[tuple[str, str | None]]] = field(default_factory=dict)

    def add(self, record: object) -> None:
        try:
            event = decode(record.key, record.value, record.headers)  # type: ignore[attr-defined]
        except UndecodableRecord:
            return
        invocation = event.correlationid
        if invocation not in self.ids:
            return
        if event.type == "tool.invoke.requested":
            self.requests.setdefault(invocation, (record.partition, record.offset))  # type: ignore[attr-defined]
        elif event.type in ("tool.permission.decided", "tool.invoke.failed"):
            self.decided.add(invocation)
        if event.type == "tool.permission.decided":
            error = event.data.error.code if event.data.error else None
            self.decisions.setdefault(invocation, set()).add((event.data.decision, error))

    def at_risk(self, committed: dict[int, int]) -> set[str]:
        """Requests the authorize group has committed past, still without a decision: the
        chain.resolved that authorize decides on is at or past the committed offset."""
        return {i for i, (partition, offset) in self.requests.items()
                if offset < committed.get(partition, 0) and i not in self.decided}


async def read_log(bootstrap: str, tail: LogTail) -> None:
    """Fold the whole invocations log, as it is now, into `tail`."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topics.INVOCATIONS, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        async with asyncio.timeout(60):
            for tp in tps:
                while await consumer.position(tp) < ends[tp]:
                    batch = await consumer.getmany(tp, timeout_ms=200)
                    for record in batch.get(tp, ()):
                        tail.add(record)
    finally:
        await consumer.stop()


async def committed_offsets(bootstrap: str) -> dict[int, int]:
    """The authorize group's committed offsets (read without joining the group)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=AUTHORIZE_GROUP,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        found = {}
        for partition in range(PARTITIONS):
            offset = await consumer.committed(TopicPartition(topics.INVOCATIONS, partition))
            found[partition] = offset or 0
        return found
    finally:
        await consumer.stop()


def issue(tmp_path: Path) -> tuple[keys.KeyPair, str]:
    pair = keys.ensure_dev_keys(tmp_path / "issuer")
    token = keys.issue_token(keys.load_private_key(pair.private), subject="did:example:ada",
                             tools=[("append_id", "^1")], ttl_seconds=900, now=int(time.time()))
    return pair, token


async def wait_for_requests_at_risk(bootstrap: str, ids: list[str]) -> None:
    """Until the authorize group has committed past requests not decided on yet: their
    tokens are then in no consumer's memory but the current one."""
    async with asyncio.timeout(120):
        while True:
            tail = LogTail(set(ids))
            await read_log(bootstrap, tail)
            if len(tail.at_risk(await committed_offsets(bootstrap))) >= AT_RISK_TO_KILL:
                return


async def at_risk_now(bootstrap: str, ids: list[str]) -> set[str]:
    tail = LogTail(set(ids))
    await read_log(bootstrap, tail)
    return tail.at_risk(await committed_offsets(bootstrap))


async def assert_every_invocation_allowed_once(bootstrap: str, ids: list[str], results: list,
                                               ledger: Path) -> None:
    outcomes = Counter(r.type if r.type == "tool.invoke.completed" else r.data.error.code
                       for r in results)
    assert outcomes == {"tool.invoke.completed": len(ids)}, outcomes
    after = LogTail(set(ids))
    await read_log(bootstrap, after)
    assert {i: after.decisions.get(i) for i in ids} == {i: {("allow", None)} for i in ids}
    terminals = await terminal_event_ids(bootstrap, set(ids))
    assert {i: len(terminals.get(i, ())) for i in ids} == {i: 1 for i in ids}
    assert Counter(ledger.read_text().split()) == Counter(ids)


def invoke_all(client: InvocationClient, ids: list[str], token: str,
               ledger: Path) -> list[asyncio.Task]:
    return [asyncio.create_task(client.invoke(
        "append_id", {"id": i, "ledger": str(ledger)}, invocation_id=i, token=token,
        timeout=240)) for i in ids]


async def test_tokens_survive_a_kill_9_between_request_and_resolution(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    state = tmp_path / "state"
    state.mkdir()
    pair, token = issue(tmp_path)
    ids = [str(uuid.uuid4()) for _ in range(BURST)]
    async with EmbeddedBroker(BROKER_TOPICS, log_dir=tmp_path) as broker:
        process = start_secured_up(broker.bootstrap, state, pair.public)
        try:
            await wait_until_up(process, state)
            async with InvocationClient(broker.bootstrap) as client:
                tasks = invoke_all(client, ids, token, ledger)
                await wait_for_requests_at_risk(broker.bootstrap, ids)
                process.send_signal(signal.SIGKILL)
                process.wait()
                at_risk = await at_risk_now(broker.bootstrap, ids)
                process = start_secured_up(broker.bootstrap, state, pair.public)
                results = await asyncio.gather(*tasks)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
        assert len(at_risk) >= AT_RISK_TO_KILL  # the restart fell between request and decision
        await assert_every_invocation_allowed_once(broker.bootstrap, ids, results, ledger)


async def test_tokens_survive_partitions_moving_from_a_stalled_replica(
        tmp_path: Path, redis_url: str) -> None:
    ledger = tmp_path / "ledger.txt"
    states = [tmp_path / "a", tmp_path / "b"]
    for state in states:
        state.mkdir()
    pair, token = issue(tmp_path)
    ids = [str(uuid.uuid4()) for _ in range(BURST)]
    async with EmbeddedBroker(BROKER_TOPICS, log_dir=tmp_path) as broker:
        first = start_secured_up(broker.bootstrap, states[0], pair.public, redis_url)
        second = None
        try:
            await wait_until_up(first, states[0])
            async with InvocationClient(broker.bootstrap) as client:
                tasks = invoke_all(client, ids, token, ledger)
                await wait_for_requests_at_risk(broker.bootstrap, ids)
                first.send_signal(signal.SIGSTOP)  # a long pause: its session expires
                at_risk = await at_risk_now(broker.bootstrap, ids)
                second = start_secured_up(broker.bootstrap, states[1], pair.public, redis_url)
                await wait_until_up(second, states[1])
                # The second replica takes every partition, then the first comes back
                # and the group rebalances once more.
                await asyncio.sleep(5)
                first.send_signal(signal.SIGCONT)
                results = await asyncio.gather(*tasks)
        finally:
            first.send_signal(signal.SIGCONT)
            for process in (first, second):
                if process is not None:
                    process.send_signal(signal.SIGTERM)
                    process.wait(timeout=30)
        assert len(at_risk) >= AT_RISK_TO_KILL
        await assert_every_invocation_allowed_once(broker.bootstrap, ids, results, ledger)
