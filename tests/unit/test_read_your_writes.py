"""The waiting logic of read-your-writes outside `up` (toolexec.usecases.read_your_writes):
when stored positions reach the log's ends, when the bound passes, when the read model
follows another log."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from toolexec.usecases.read_your_writes import on_another_log, reached, wait_for_positions

ENDS = {("toolexec.requests", 0): 3, ("toolexec.invocations", 0): 9,
        ("toolexec.invocations", 1): 0}


def test_positions_at_or_past_every_end_are_reached() -> None:
    assert reached({("toolexec.requests", 0): 3, ("toolexec.invocations", 0): 9}, ENDS)
    assert reached({("toolexec.requests", 0): 4, ("toolexec.invocations", 0): 12,
                    ("toolexec.invocations", 1): 2}, ENDS)


def test_one_partition_behind_or_never_folded_is_not_reached() -> None:
    assert not reached({("toolexec.requests", 0): 2, ("toolexec.invocations", 0): 9}, ENDS)
    assert not reached({("toolexec.requests", 0): 3}, ENDS)  # invocations/0 never folded
    assert not reached({}, ENDS)


def test_empty_partitions_need_no_stored_position() -> None:
    assert reached({}, {("toolexec.invocations", 1): 0})
    assert reached({}, {})


def test_a_read_model_of_another_cluster_is_on_another_log() -> None:
    assert on_another_log("cluster-a", "cluster-b")
    assert not on_another_log("cluster-a", "cluster-a")
    assert not on_another_log(None, "cluster-a")  # nothing folded yet: no cluster stored
    assert not on_another_log("cluster-a", None)  # a broker that names no cluster


def _moving(steps: list[Mapping[tuple[str, int], int]]) -> Iterator[Mapping[tuple[str, int], int]]:
    yield from steps
    while True:
        yield steps[-1]


async def test_the_wait_ends_once_the_positions_reach_the_ends() -> None:
    folds = _moving([{}, {("toolexec.requests", 0): 3},
                     {("toolexec.requests", 0): 3, ("toolexec.invocations", 0): 9}])
    asked = 0

    async def positions() -> Mapping[tuple[str, int], int]:
        nonlocal asked
        asked += 1
        return next(folds)

    assert await wait_for_positions(positions, ENDS, timeout=600, poll=0.001)
    assert asked == 3  # it read until the third fold, and no further


async def test_the_wait_ends_when_the_bound_passes() -> None:
    asked = 0

    async def positions() -> Mapping[tuple[str, int], int]:
        nonlocal asked
        asked += 1
        return {("toolexec.requests", 0): 3}  # `up` stopped: invocations never move

    assert not await wait_for_positions(positions, ENDS, timeout=0.05, poll=0.001)
    assert asked >= 2  # it did wait, then gave up


async def test_no_bound_left_reads_the_positions_once() -> None:
    asked: list[bool] = []

    async def positions() -> Mapping[tuple[str, int], int]:
        asked.append(True)
        return {}

    assert not await wait_for_positions(positions, ENDS, timeout=0)
    assert await wait_for_positions(positions, {}, timeout=0)
    assert len(asked) == 2
