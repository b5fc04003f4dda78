"""Which fetch waits each profile's consumers use. Embedded behind the gate (the
default), a consumer that follows new records is woken by them: it waits long, busy or
idle; readers that read a partition to its end keep the profile's short wait, which
they would otherwise wait out. Straight to Tansu (no gate) the busy wait is a poll;
Kafka's own waits in production; explicit settings win."""

from __future__ import annotations

from toolexec.settings import (
    IDLE_FETCH_WAIT_MS,
    WOKEN_BUSY_WAIT_MS,
    Settings,
    consumer_kwargs,
    fetch_waits,
)


def test_behind_the_gate_followers_are_woken_and_readers_to_the_end_poll() -> None:
    settings = Settings()
    assert settings.gate_wakes_fetches
    assert fetch_waits(settings) == (WOKEN_BUSY_WAIT_MS, IDLE_FETCH_WAIT_MS)
    assert consumer_kwargs(settings)["fetch_max_wait_ms"] == 1
    assert fetch_waits(Settings(fetch_idle_wait_ms=2000)) == (WOKEN_BUSY_WAIT_MS, 2000)
    assert fetch_waits(Settings(fetch_idle_wait_ms=50)) == (50, 50)


def test_straight_to_tansu_followers_poll_while_busy() -> None:
    settings = Settings(broker_compact_after_records=0)
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
