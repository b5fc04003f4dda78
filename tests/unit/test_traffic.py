"""Per-tool traffic buckets the status page charts (`domain.traffic`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.traffic import Ending, percentile, traffic

START = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
HOUR = START + timedelta(hours=1)


def at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


def test_buckets_count_rate_latency_and_errors_per_tool() -> None:
    endings = [Ending(at(1), "echo", False, 10.0), Ending(at(2), "echo", False, 30.0),
               Ending(at(3), "echo", True, 5.0, "E3401"),
               Ending(at(4), "echo", True, 7.0, "E3703"),  # cancelled: not an error
               Ending(at(61), "fetch", False, 100.0)]
    series = traffic(endings, start=START, end=HOUR)

    assert sorted(series) == ["echo", "fetch"]
    assert len(series["echo"]) == 60
    first = series["echo"][0]
    assert (first.ended, first.errors, first.error_rate) == (4, 1, 0.25)
    assert first.per_second == pytest.approx(4 / 60)
    assert (first.p50_ms, first.p95_ms) == (7.0, 30.0)
    assert series["echo"][1].ended == 0 and series["echo"][1].error_rate is None
    assert series["fetch"][1].ended == 1 and series["fetch"][1].start == at(60)


def test_endings_outside_the_window_are_left_out() -> None:
    series = traffic([Ending(at(-1), "echo", False, 1.0), Ending(HOUR, "echo", False, 1.0)],
                     start=START, end=HOUR)
    assert series == {}


def test_an_empty_window_is_refused() -> None:
    with pytest.raises(ValueError):
        traffic([], start=HOUR, end=START)


def test_nearest_rank_percentile() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([float(v) for v in range(1, 101)], 0.95) == 95.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.0


endings_strategy = st.lists(st.builds(
    Ending, at=st.integers(-100, 3700).map(at), tool_id=st.sampled_from(["a", "b", "c"]),
    failed=st.booleans(), duration_ms=st.none() | st.floats(0, 1e6),
    error_code=st.sampled_from([None, "E3401", "E3703"])), max_size=60)


@given(endings_strategy)
def test_every_ending_in_the_window_lands_in_exactly_one_bucket(endings: list[Ending]) -> None:
    series = traffic(endings, start=START, end=HOUR)
    inside = [e for e in endings if START <= e.at < HOUR]
    assert sum(b.ended for buckets in series.values() for b in buckets) == len(inside)
    assert sum(b.errors for buckets in series.values() for b in buckets) == sum(
        e.is_error for e in inside)


@given(endings_strategy)
def test_percentiles_are_ordered_and_within_the_durations(endings: list[Ending]) -> None:
    for tool, buckets in traffic(endings, start=START, end=HOUR).items():
        for bucket in buckets:
            durations = [e.duration_ms for e in endings if e.tool_id == tool
                         and bucket.start <= e.at < bucket.start + timedelta(seconds=60)
                         and e.duration_ms is not None]
            if not durations:
                assert bucket.p50_ms is None and bucket.p95_ms is None
                continue
            assert min(durations) <= bucket.p50_ms <= bucket.p95_ms <= max(durations)
            assert bucket.error_rate is not None and 0 <= bucket.error_rate <= 1
