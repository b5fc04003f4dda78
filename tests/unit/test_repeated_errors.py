"""A Kafka client's error repeated on every retry is logged once per outage."""

from __future__ import annotations

import logging

from toolexec.logs import RepeatedErrors


def entry(name: str, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)


def test_repeats_of_one_client_error_are_dropped_until_reset() -> None:
    quiet = RepeatedErrors()
    passed = [quiet.filter(entry("aiokafka.client", "Unable connect to node %s", n))
              for n in range(1000)]
    assert passed.count(True) == 1
    assert quiet.filter(entry("aiokafka.client", "Unable to update metadata from %s", [1]))

    quiet.reset()  # the broker is back: the next outage is reported again
    assert quiet.filter(entry("aiokafka.client", "Unable connect to node %s", 1))


def test_a_long_outage_gets_a_count_line_now_and_then() -> None:
    quiet = RepeatedErrors(summary_seconds=0.0)
    quiet.filter(entry("aiokafka", "broken"))
    summary = entry("aiokafka", "broken")
    assert quiet.filter(summary)
    assert "and 1 times more" in str(summary.msg)


def test_records_of_other_loggers_pass() -> None:
    quiet = RepeatedErrors()
    assert all(quiet.filter(entry("toolexec.stack", "same")) for _ in range(3))
