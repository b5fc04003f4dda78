from __future__ import annotations

import asyncio
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from consumers.inflight import InFlight, PartitionWindow


@given(st.permutations(list(range(20))))
def test_commit_never_passes_an_unfinished_offset(order: list[int]) -> None:
    window = PartitionWindow()
    for offset in range(20):
        window.start(offset)
    done: set[int] = set()
    last = 0
    for offset in order:
        done.add(offset)
        position = window.finish(offset)
        if position is not None:
            assert position > last
            assert all(o in done for o in range(position))
            last = position
    assert last == 20


async def test_records_run_concurrently_and_commit_in_partition_order() -> None:
    inflight = InFlight(limit=8)
    commits: list[dict] = []
    release = {n: asyncio.Event() for n in range(3)}

    async def commit(offsets: dict) -> None:
        commits.append({tp.partition: pos for tp, pos in offsets.items()})

    for n in range(3):
        record = SimpleNamespace(topic="t", partition=0, offset=n)
        await inflight.submit(record, release[n].wait, commit)
    release[2].set()
    release[1].set()
    await asyncio.sleep(0)
    assert commits == []  # offset 0 still running: nothing may be committed
    release[0].set()
    await inflight.drain()
    assert commits[-1] == {0: 3}


async def test_limit_bounds_the_work_in_flight() -> None:
    inflight = InFlight(limit=2)
    running = 0
    peak = 0
    gate = asyncio.Event()

    async def work() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await gate.wait()
        running -= 1

    async def noop(offsets: dict) -> None:
        return None

    submitter = asyncio.create_task(_submit_all(inflight, work, noop, 5))
    await asyncio.sleep(0.01)
    assert peak == 2
    gate.set()
    await submitter
    await inflight.drain()
    assert peak == 2


async def _submit_all(inflight: InFlight, work, commit, count: int) -> None:
    for n in range(count):
        await inflight.submit(SimpleNamespace(topic="t", partition=1, offset=n), work, commit)


async def test_a_skipped_record_commits_only_after_the_records_before_it() -> None:
    import asyncio
    from types import SimpleNamespace

    from consumers.inflight import InFlight

    commits: list[dict] = []

    async def commit(positions: dict) -> None:
        commits.append({tp.partition: p for tp, p in positions.items()})

    release = asyncio.Event()
    inflight = InFlight(4)
    await inflight.submit(SimpleNamespace(topic="t", partition=0, offset=0),
                          release.wait, commit)
    await inflight.skip(SimpleNamespace(topic="t", partition=0, offset=1), commit)
    assert commits == []  # offset 0 still runs
    release.set()
    await inflight.drain()
    assert commits == [{0: 2}]
    await inflight.skip(SimpleNamespace(topic="t", partition=0, offset=2), commit)
    assert commits == [{0: 2}, {0: 3}]


async def test_immediate_work_runs_while_every_slot_is_busy_and_commits_in_order() -> None:
    inflight = InFlight(limit=1)
    commits: list[dict] = []
    release = asyncio.Event()

    async def commit(offsets: dict) -> None:
        commits.append({tp.partition: pos for tp, pos in offsets.items()})

    signals: list[str] = []

    async def signal() -> None:
        signals.append("cancel")

    await inflight.submit(SimpleNamespace(topic="t", partition=0, offset=0), release.wait, commit)
    await asyncio.wait_for(
        inflight.run_now(SimpleNamespace(topic="t", partition=0, offset=1), signal, commit), 5)
    assert signals == ["cancel"]
    assert commits == []  # offset 0 still runs: offset 1 is done but not committed past it
    release.set()
    await inflight.drain()
    assert commits == [{0: 2}]
