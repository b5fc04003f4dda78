"""FetchPacer: the short wait while work arrives, lengthening while runs wait, long idle."""

from __future__ import annotations

import asyncio

from consumers.runtime.fetch_pacing import FetchPacer


class Fetcher:
    """What the pacer sets on an aiokafka consumer: its fetcher's wait."""

    _fetch_max_wait_ms = 0


class Consumer:
    def __init__(self) -> None:
        self._fetcher = Fetcher()

    @property
    def wait(self) -> int:
        return self._fetcher._fetch_max_wait_ms


async def _until_wait(consumer: Consumer, wanted: int) -> None:
    async with asyncio.timeout(30):
        while consumer.wait != wanted:
            await asyncio.sleep(0.001)


async def test_the_busy_wait_lengthens_to_its_ceiling_while_nothing_arrives() -> None:
    consumer = Consumer()
    pacer = FetchPacer(1, 500, ceiling_ms=8, grow_seconds=0.002)
    pacer.attach(consumer)
    assert consumer.wait == 500  # idle
    pacer.busy()
    assert consumer.wait == 1
    seen = {consumer.wait}
    async with asyncio.timeout(30):
        while consumer.wait != 8:
            await asyncio.sleep(0.0005)
            seen.add(consumer.wait)
    assert seen <= {1, 2, 4, 8}  # doubling, never past the ceiling
    pacer.in_flight()  # runs still in flight: busy, at the wait reached
    assert consumer.wait == 8
    pacer.busy()  # a request arrived (or an answer went out): short again
    assert consumer.wait == 1
    await _until_wait(consumer, 8)


async def test_without_a_ceiling_the_busy_wait_stays_short() -> None:
    consumer = Consumer()
    pacer = FetchPacer(1, 500, grow_seconds=0.001)
    pacer.attach(consumer)
    pacer.busy()
    await asyncio.sleep(0.02)
    pacer.in_flight()
    assert consumer.wait == 1


async def test_a_pacer_past_its_linger_goes_to_the_long_wait() -> None:
    now = [0.0]
    consumer = Consumer()
    pacer = FetchPacer(1, 500, linger=2.0, ceiling_ms=4, clock=lambda: now[0])
    pacer.attach(consumer)
    pacer.busy()
    assert consumer.wait == 1
    now[0] = 2.5
    pacer.update()
    assert consumer.wait == 500
