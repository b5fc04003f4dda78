"""Which fetch waits each profile's consumers use: long behind the embedded broker's
gate (it answers a waiting fetch when records arrive), short straight to Tansu while
work is in flight, the profile's own against Kafka; explicit settings win."""

from __future__ import annotations

from toolexec.settings import IDLE_FETCH_WAIT_MS, Settings, consumer_kwargs, fetch_waits


def test_behind_the_gate_consumers_wait_long_busy_or_idle() -> None:
    settings = Settings()
    assert settings.gate_wakes_fetches
    assert fetch_waits(settings) == (IDLE_FETCH_WAIT_MS, IDLE_FETCH_WAIT_MS)
    assert fetch_waits(Settings(fetch_idle_wait_ms=2000)) == (2000, 2000)


def test_straight_to_tansu_busy_consumers_poll() -> None:
    settings = Settings(broker_compact_after_records=0)
    assert not settings.gate_wakes_fetches
    assert fetch_waits(settings) == (1, IDLE_FETCH_WAIT_MS)


def test_kafka_keeps_the_production_waits() -> None:
    settings = Settings(kafka_bootstrap="kafka:9092")
    assert not settings.gate_wakes_fetches
    assert consumer_kwargs(settings)["fetch_max_wait_ms"] == 100


def test_an_explicit_wait_wins() -> None:
    assert consumer_kwargs(Settings(fetch_max_wait_ms=7))["fetch_max_wait_ms"] == 7
