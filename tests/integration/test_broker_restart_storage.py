"""The embedded broker on `s3://` storage comes back from a restart with its log,
its consumer groups' committed offsets, and on the same address."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.s3_store import s3_store, tansu_s3_env
from toolexec.embedded_broker import EmbeddedBroker

pytestmark = pytest.mark.integration

TOPIC = "restart.kept"


async def test_records_and_committed_offsets_survive_a_restart(tmp_path: Path) -> None:
    tp = TopicPartition(TOPIC, 0)
    with s3_store() as (endpoint, _):
        async with EmbeddedBroker({TOPIC: 1}, log_dir=tmp_path, storage_engine="s3://kept/",
                                  env=tansu_s3_env(endpoint)) as broker:
            bootstrap = broker.bootstrap
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
            await producer.start()
            try:
                for n in range(5):
                    await producer.send_and_wait(TOPIC, b"%d" % n)
            finally:
                await producer.stop()
            consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id="kept",
                                        enable_auto_commit=False)
            await consumer.start()
            try:
                consumer.assign([tp])
                await consumer.commit({tp: 3})
            finally:
                await consumer.stop()

            await broker.restart()

            assert broker.bootstrap == bootstrap
            reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id="kept",
                                      enable_auto_commit=False, fetch_max_wait_ms=100)
            await reader.start()
            try:
                reader.assign([tp])
                committed = await reader.committed(tp)
                ends = await reader.end_offsets([tp])
                await reader.seek_to_beginning(tp)
                records = await reader.getmany(tp, timeout_ms=5000)
            finally:
                await reader.stop()
    assert committed == 3
    assert ends == {tp: 5}
    assert [r.value for r in records.get(tp, [])] == [b"0", b"1", b"2", b"3", b"4"]
