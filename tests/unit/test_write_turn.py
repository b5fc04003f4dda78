"""Rebuild workers sharing a SQLite file take turns at writing through one lock."""

from __future__ import annotations

import asyncio
import multiprocessing

from projections.runner import WriteTurn
from tests.waiting import WAIT


async def test_a_second_writer_waits_for_the_turn_and_gets_it_once_released() -> None:
    lock = multiprocessing.get_context("spawn").Lock()
    first, second = WriteTurn(lock), WriteTurn(lock)
    await first.acquire()
    waiting = asyncio.create_task(second.acquire())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    first.release()
    await asyncio.wait_for(waiting, WAIT)
    assert not lock.acquire(block=False)  # the second holds it now
    second.release()
    assert lock.acquire(block=False)
    lock.release()


async def test_release_gives_back_only_a_turn_that_is_held() -> None:
    lock = multiprocessing.get_context("spawn").Lock()
    turn = WriteTurn(lock)
    turn.release()  # not held: nothing to give back
    await turn.acquire()
    turn.release()
    turn.release()  # twice: once given back
    assert lock.acquire(block=False)
    lock.release()
