"""The embedded broker's supervisor: restarts with the log, cold starts from the archive
alone, one per state directory, refuses a damaged archive."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.cli_process import toolexec
from tests.integration.test_durable_log_restore import read_log
from tests.waiting import START_WAIT, WAIT
from toolexec.broker_control import (
    EXIT_STATE_GONE,
    BrokerState,
    BrokerUnavailable,
    ensure_broker,
    read_state,
    stop_broker,
)
from toolexec.embedded_broker import ensure_topics
from toolexec.log_archive import SEGMENT_MAGIC, LogArchive
from toolexec.settings import Settings

pytestmark = pytest.mark.integration

TOPICS = {"orders": 2}


@pytest.fixture
async def settings(tmp_path: Path) -> AsyncIterator[Settings]:
    configured = Settings(state_dir=tmp_path / ".toolexec")
    yield configured
    await asyncio.to_thread(stop_broker, configured)


async def until(condition: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(START_WAIT):  # some conditions are a broker (re)starting
        while not condition():
            await asyncio.sleep(0.05)
    assert condition(), what


def state(settings: Settings) -> BrokerState:
    current = read_state(settings.state_dir)
    assert current is not None
    return current


async def write_records(bootstrap: str, count: int = 30) -> None:
    await ensure_topics(bootstrap, TOPICS)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for n in range(count):
            await producer.send_and_wait("orders", b"order %d" % n, key=b"k%d" % n,
                                         partition=n % 2, headers=[("n", b"%d" % n)])
    finally:
        await producer.stop()


async def archived(settings: Settings, ends: dict[str, int]) -> None:
    await until(lambda: all(state(settings).data.get("archived", {}).get(k, 0) >= v
                            for k, v in ends.items()), f"archived {ends}")


async def append(bootstrap: str) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        return (await producer.send_and_wait("orders", b"later", partition=0)).offset
    finally:
        await producer.stop()


async def test_a_broker_killed_with_sigkill_comes_back_with_its_log_on_the_same_port(
        settings: Settings) -> None:
    broker = await ensure_broker(settings)
    await write_records(broker.bootstrap)
    tp = TopicPartition("orders", 1)
    committer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="billing",
                                 enable_auto_commit=False)
    await committer.start()
    committer.assign([tp])
    await committer.commit({tp: 9})
    await committer.stop()
    before = await read_log(broker.bootstrap, TOPICS)
    await archived(settings, {"orders/0": 15, "orders/1": 15})
    archive = LogArchive(settings.state_dir / "log", read_only=True)
    await until(lambda: "billing" in archive.groups(), "the commit archived")

    os.kill(state(settings).data["broker_pid"], signal.SIGKILL)
    await until(lambda: state(settings).incarnation == 2 and state(settings).status == "ready",
                "the broker restarted")

    after = await read_log(broker.bootstrap, TOPICS)
    reader = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="billing",
                              enable_auto_commit=False)
    await reader.start()
    committed = await reader.committed(tp)
    await reader.stop()
    assert state(settings).bootstrap == broker.bootstrap
    assert after == before
    assert committed == 9
    # offsets the dead broker may have acknowledged past the archive are never reused
    assert await append(broker.bootstrap) >= 15 + settings.broker_crash_offset_gap
    status = toolexec("broker", "status", "--json", cwd=settings.state_dir.parent)
    report = json.loads(status.stdout)
    assert report["running"] and report["restarts"] == 1 and report["mode"] == "gated"
    assert "exited" in report["last_restart_reason"]


async def test_a_stopped_broker_starts_again_from_the_state_directory_alone(
        settings: Settings) -> None:
    broker = await ensure_broker(settings)
    await write_records(broker.bootstrap)
    before = await read_log(broker.bootstrap, TOPICS)

    stopped = await asyncio.to_thread(stop_broker, settings)
    assert stopped is not None and stopped.data["clean_stop"] is True
    again = await ensure_broker(settings)

    assert await read_log(again.bootstrap, TOPICS) == before
    assert await append(again.bootstrap) == 15  # a clean stop leaves no gap
    assert state(settings).data["restore"]["records"] == 30


async def test_a_killed_supervisor_leaves_a_log_that_resumes_past_a_gap(
        settings: Settings) -> None:
    broker = await ensure_broker(settings)
    await write_records(broker.bootstrap)
    before = await read_log(broker.bootstrap, TOPICS)
    await archived(settings, {"orders/0": 15, "orders/1": 15})
    supervisor = state(settings).supervisor_pid
    assert supervisor is not None

    os.kill(supervisor, signal.SIGKILL)  # its Tansu dies with it
    await until(lambda: _gone(broker.process), "the supervisor is gone")
    again = await ensure_broker(settings)

    assert await read_log(again.bootstrap, TOPICS) == before
    assert await append(again.bootstrap) >= 15 + settings.broker_crash_offset_gap


async def test_one_supervisor_per_state_directory(settings: Settings) -> None:
    broker = await ensure_broker(settings)
    second = subprocess.run(
        [sys.executable, "-m", "toolexec.broker_supervisor", "--state-dir",
         str(settings.state_dir)], capture_output=True, text=True, timeout=WAIT)

    assert second.returncode == 3
    assert f"pid {broker.supervisor_pid}" in second.stderr
    assert state(settings).supervisor_pid == broker.supervisor_pid


async def test_a_supervisor_whose_state_directory_is_deleted_stops_and_writes_nothing(
        settings: Settings) -> None:
    """What it would archive has nowhere to go: it stops its broker and exits rather
    than serve a log no one can restore, and does not make the directory again."""
    broker = await ensure_broker(settings)
    await write_records(broker.bootstrap)
    tansu = state(settings).data["broker_pid"]
    assert broker.process is not None

    # moved away in one step, as a deletion looks to the supervisor (an `rmtree` here
    # would race with the supervisor's own writes into the directory it deletes)
    gone = settings.state_dir.with_name("deleted")
    settings.state_dir.rename(gone)
    try:
        await until(lambda: _gone(broker.process), "the supervisor stopped")

        assert broker.process.returncode == EXIT_STATE_GONE
        assert not settings.state_dir.exists()
        with pytest.raises(ProcessLookupError):
            os.kill(tansu, 0)
    finally:
        shutil.rmtree(gone, ignore_errors=True)


async def test_a_damaged_archive_is_refused_not_served(settings: Settings) -> None:
    broker = await ensure_broker(settings)
    await write_records(broker.bootstrap)
    await asyncio.to_thread(stop_broker, settings)
    segment = next((settings.state_dir / "log" / "topics" / "orders" / "0").glob("*.seg"))
    data = bytearray(segment.read_bytes())
    data[len(SEGMENT_MAGIC) + 12] ^= 0xFF  # inside the first record
    segment.write_bytes(bytes(data))

    with pytest.raises(BrokerUnavailable, match="damaged"):
        await ensure_broker(settings)
    assert state(settings).status == "failed"
    assert segment.name in state(settings).data["error"]


def _gone(process: subprocess.Popen[bytes] | None) -> bool:
    return process is None or process.poll() is not None


async def test_a_compaction_under_a_writer_loses_no_acknowledged_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From a cold start, a compaction forced while a producer writes on: every record
    the broker acknowledged is in the log afterwards, at its offset (the gate closes
    on the writer before the rest is archived)."""
    # the supervisor reads its settings from the environment: forced at 4 x 100 records
    monkeypatch.setenv("TOOLEXEC_BROKER_COMPACT_AFTER_RECORDS", "100")
    monkeypatch.setenv("TOOLEXEC_BROKER_COMPACT_QUIET_SECONDS", "3600")
    settings = Settings(state_dir=tmp_path / ".toolexec")
    broker = await ensure_broker(settings)
    acknowledged: dict[tuple[int, int], bytes] = {}
    try:
        await ensure_topics(broker.bootstrap, TOPICS)
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all",
                                    request_timeout_ms=2000, retry_backoff_ms=50)
        await producer.start()
        try:
            n = 0
            async with asyncio.timeout(START_WAIT * 4):
                while not (state(settings).data.get("compactions", 0) >= 1
                           and state(settings).status == "ready" and n > 600):
                    value = b"v%d" % n
                    try:
                        meta = await producer.send_and_wait("orders", value, partition=n % 2)
                    except Exception:  # noqa: BLE001 - the broker away for its restore
                        await asyncio.sleep(0.05)
                        continue
                    acknowledged[(meta.partition, meta.offset)] = value
                    n += 1
        finally:
            await producer.stop()
        log = await read_log(state(settings).bootstrap or broker.bootstrap, TOPICS)
    finally:
        await asyncio.to_thread(stop_broker, settings)
    held = {(r[1], r[2]): r[4] for r in log}
    assert state(settings).data.get("compactions", 0) >= 1
    missing = {place: value for place, value in acknowledged.items()
               if held.get(place) != value}
    assert missing == {}
