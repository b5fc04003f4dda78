"""Which fetch waits each profile's consumers use: embedded, short while busy (readers
that read to a partition's end must not wait out a long fetch) and long while idle
(the gate wakes an idle consumer when records arrive); Kafka's own in production;
explicit settings win."""

from __future__ import annotations

from toolexec.settings import IDLE_FETCH_WAIT_MS, Settings, consumer_kwargs, fetch_waits


def test_embedded_consumers_poll_while_busy_and_wait_long_while_idle() -> None:
    assert fetch_waits(Settings()) == (1, IDLE_FETCH_WAIT_MS)
    assert fetch_waits(Settings(broker_compact_after_records=0)) == (1, IDLE_FETCH_WAIT_MS)
    assert fetch_waits(Settings(fetch_idle_wait_ms=2000)) == (1, 2000)


def test_kafka_keeps_the_production_waits() -> None:
    settings = Settings(kafka_bootstrap="kafka:9092")
    assert consumer_kwargs(settings)["fetch_max_wait_ms"] == 100
    assert fetch_waits(settings) == (100, IDLE_FETCH_WAIT_MS)


def test_an_explicit_wait_wins() -> None:
    assert consumer_kwargs(Settings(fetch_max_wait_ms=7))["fetch_max_wait_ms"] == 7
