"""Stopping a Kafka client of a gone broker: its failures are not the caller's, a
cancellation of the caller still is."""

from __future__ import annotations

import asyncio

import pytest

from contracts.kafka_clients import close_quietly


async def _stop_that_lets_out_a_cancellation() -> None:
    # what aiokafka's fetcher does when stopped while a fetch waits to retry
    inner = asyncio.create_task(asyncio.sleep(3600))
    await asyncio.sleep(0)
    inner.cancel()
    await inner


async def _stop_that_fails() -> None:
    raise ConnectionError("broker gone")


async def test_a_client_s_own_cancellation_and_errors_are_absorbed() -> None:
    await close_quietly(_stop_that_lets_out_a_cancellation())
    await close_quietly(_stop_that_fails())


async def test_a_cancellation_of_the_caller_is_raised() -> None:
    started = asyncio.Event()

    async def slow_stop() -> None:
        started.set()
        await asyncio.sleep(3600)

    task = asyncio.create_task(close_quietly(slow_stop()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
