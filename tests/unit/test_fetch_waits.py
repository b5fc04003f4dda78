"""Which fetch waits each profile's consumers use. Embedded behind the gate (the
default), a consumer that follows new records is woken by them: it waits long, busy or
idle; readers that read a partition to its end keep the profile's short wait, which
they would otherwise wait out. Straight to Tansu (no gate) the busy wait is a poll;
Kafka's own waits in production; explicit settings win."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolexec.broker_control import SUPERVISOR_MODULE, state_path
from toolexec.settings import (
    IDLE_FETCH_WAIT_MS,
    WOKEN_BUSY_WAIT_MS,
    Settings,
    consumer_kwargs,
    fetch_waits,
)


def test_behind_the_gate_followers_are_woken_and_readers_to_the_end_poll(
        tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    assert settings.gate_wakes_fetches
    assert fetch_waits(settings) == (WOKEN_BUSY_WAIT_MS, IDLE_FETCH_WAIT_MS)
    assert consumer_kwargs(settings)["fetch_max_wait_ms"] == 1
    assert fetch_waits(Settings(state_dir=tmp_path, fetch_idle_wait_ms=2000)) == (
        WOKEN_BUSY_WAIT_MS, 2000)
    assert fetch_waits(Settings(state_dir=tmp_path, fetch_idle_wait_ms=50)) == (50, 50)


def test_straight_to_tansu_followers_poll_while_busy(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, broker_compact_after_records=0)
    assert not settings.gate_wakes_fetches
    assert fetch_waits(settings) == (1, IDLE_FETCH_WAIT_MS)


def test_kafka_keeps_the_production_waits() -> None:
    settings = Settings(kafka_bootstrap="kafka:9092")
    assert not settings.gate_wakes_fetches
    assert consumer_kwargs(settings)["fetch_max_wait_ms"] == 100
    assert fetch_waits(settings) == (100, IDLE_FETCH_WAIT_MS)


def test_an_explicit_wait_wins() -> None:
    assert consumer_kwargs(Settings(fetch_max_wait_ms=7))["fetch_max_wait_ms"] == 7
    assert fetch_waits(Settings(fetch_max_wait_ms=7)) == (7, IDLE_FETCH_WAIT_MS)


@pytest.fixture
def supervisor_like() -> Iterator[int]:
    """A process whose command line names the supervisor's module (what a state file's
    `supervisor_pid` is checked against)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                                SUPERVISOR_MODULE])
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


def _serving(state_dir: Path, pid: int, mode: str) -> None:
    path = state_path(state_dir)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"supervisor_pid": pid, "status": "ready", "mode": mode}))


def test_a_running_broker_straight_to_tansu_is_polled_whatever_the_settings(
        tmp_path: Path, supervisor_like: int) -> None:
    """A broker started with compactions off serves without a gate: a client with the
    default settings must not wait for a wake-up that never comes."""
    _serving(tmp_path, supervisor_like, "direct")
    assert fetch_waits(Settings(state_dir=tmp_path)) == (1, IDLE_FETCH_WAIT_MS)


def test_a_running_broker_behind_its_gate_wakes_whatever_the_settings(
        tmp_path: Path, supervisor_like: int) -> None:
    _serving(tmp_path, supervisor_like, "gated")
    settings = Settings(state_dir=tmp_path, broker_compact_after_records=0)
    assert fetch_waits(settings) == (WOKEN_BUSY_WAIT_MS, IDLE_FETCH_WAIT_MS)


def test_a_stale_state_file_leaves_the_rule(tmp_path: Path) -> None:
    _serving(tmp_path, 2**22 + 1, "direct")  # above any pid this kernel gives out
    assert fetch_waits(Settings(state_dir=tmp_path)) == (WOKEN_BUSY_WAIT_MS,
                                                         IDLE_FETCH_WAIT_MS)
