"""The pipeline links the fact batches it appends to a partition: a reader of the
partition checks all of them with one Ed25519 verification."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

import contracts.fact_signature as fact_signature
from contracts import topics
from contracts.fact_signature import CE_PREFIX, FactVerifier, Verdict, batch_link, forget_checked
from toolexec.client import InvocationClient
from toolexec.publishing import publish_event
from toolexec.settings import Settings
from toolexec.sources import load_builtin_sources, load_source
from toolexec.stack import TOPIC_PARTITIONS, Stack

pytestmark = pytest.mark.integration

TOOLS = Path(__file__).parent / "tools"
PARTITIONS = TOPIC_PARTITIONS[topics.REQUESTS]
INVOCATIONS = 6


def _ids_on_partition(partition: int, count: int) -> list[str]:
    ids: list[str] = []
    while len(ids) < count:
        candidate = str(uuid.uuid4())
        if DefaultPartitioner()(candidate.encode(), list(range(PARTITIONS)), []) == partition:
            ids.append(candidate)
    return ids


async def _facts(bootstrap: str, partition: int, at_least: int) -> list:
    tp = TopicPartition(topics.INVOCATIONS, partition)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest", fetch_max_wait_ms=100)
    await consumer.start()
    consumer.assign([tp])
    records: list = []
    try:
        async with asyncio.timeout(120):
            while len(records) < at_least:
                batch = await consumer.getmany(tp, timeout_ms=500)
                records.extend(batch.get(tp, []))
    finally:
        await consumer.stop()
    return records


async def test_one_verification_checks_every_fact_the_pipeline_appended_to_a_partition(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = _ids_on_partition(1, INVOCATIONS)
    async with Stack(Settings(state_dir=tmp_path / "state", tools_dir=tmp_path / "none",
                              user_tools_dir=None)) as stack:
        now = datetime.now(UTC)
        for source in load_builtin_sources() + [load_source(TOOLS / "py_echo")]:
            await stack.publish(publish_event(source, now=now))
        async with InvocationClient(stack.bootstrap, verifier=stack.verifier) as client:
            for invocation_id in ids:  # one after the other: a batch per step at least
                terminal = await client.invoke("py_echo", {"text": "x"}, timeout=120,
                                               invocation_id=invocation_id)
                assert terminal.type == "tool.invoke.completed"
        records = await _facts(stack.bootstrap, 1, at_least=INVOCATIONS * 5)
        raw_keys = stack.verifier.raw_keys()

    batches: list[dict[str, bytes]] = []
    for record in records:
        headers = dict(record.headers)
        if not batches or headers[CE_PREFIX + "sig"] != batches[-1][CE_PREFIX + "sig"]:
            batches.append(headers)
    assert len(batches) >= INVOCATIONS * 2
    for before, after in zip(batches, batches[1:], strict=False):
        link = batch_link([(name, before[name]) for name in
                           (CE_PREFIX + "sigkid", CE_PREFIX + "sigset", CE_PREFIX + "sig")])
        assert after[CE_PREFIX + "sigset"].decode().split(".")[-1] == link

    verifications = 0
    real_verify_key = fact_signature.VerifyKey

    class Counting(real_verify_key):  # type: ignore[misc, valid-type]
        def verify(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal verifications
            verifications += 1
            return super().verify(*args, **kwargs)

    monkeypatch.setattr(fact_signature, "VerifyKey", Counting)
    forget_checked()  # a reader in another process: it signed none of them
    assert FactVerifier.from_raw(raw_keys).verify_all(records) == [Verdict.VALID] * len(records)
    assert verifications == 1
