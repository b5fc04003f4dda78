from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from consumers.steps.cancellation import Cancellations, JobCancelled


async def test_work_of_an_invocation_not_cancelled_returns_its_result() -> None:
    cancels = Cancellations()
    cancels.request("other")

    async def work() -> str:
        return "done"

    assert await cancels.interruptible("mine", work()) == "done"


def _endless_work() -> tuple[Callable[[], Coroutine[Any, Any, None]], asyncio.Event, list[bool]]:
    """Work that waits forever once started, and notes when its cleanup is done."""
    started, cleaned = asyncio.Event(), []

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)
            cleaned.append(True)

    return work, started, cleaned


async def test_a_cancel_interrupts_running_work_and_waits_for_its_cleanup() -> None:
    cancels = Cancellations()
    work, started, cleaned = _endless_work()
    running = asyncio.create_task(cancels.interruptible("inv", work()))
    await started.wait()
    cancels.request("inv", "stop")
    with pytest.raises(JobCancelled) as raised:
        await running
    assert cleaned == [True]
    assert raised.value.to_dict() == {"code": "E3703", "message": "Job cancelled",
                                      "details": {"invocation_id": "inv", "reason": "stop"}}


async def test_work_of_an_already_cancelled_invocation_never_runs() -> None:
    cancels = Cancellations()
    cancels.request("inv")
    ran = []

    async def work() -> None:
        ran.append(True)

    with pytest.raises(JobCancelled):
        await cancels.interruptible("inv", work())
    assert ran == []


def test_the_set_of_cancelled_ids_is_bounded_oldest_first() -> None:
    cancels = Cancellations(capacity=2)
    for invocation in ("a", "b", "c"):
        cancels.request(invocation)
    assert [cancels.is_cancelled(i) for i in ("a", "b", "c")] == [False, True, True]


async def test_cancelling_the_caller_cancels_the_work_after_its_cleanup_not_as_a_job_cancel(
) -> None:
    cancels = Cancellations()
    work, started, cleaned = _endless_work()
    running = asyncio.create_task(cancels.interruptible("inv", work()))
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert cleaned == [True]
    assert not cancels.is_cancelled("inv")


async def test_a_repeated_cancel_does_not_interrupt_the_cleanup_of_the_first() -> None:
    cancels = Cancellations()
    started, cleaning, cleaned = asyncio.Event(), asyncio.Event(), []

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaning.set()
            for _ in range(3):
                await asyncio.sleep(0)
            cleaned.append(True)

    running = asyncio.create_task(cancels.interruptible("inv", work()))
    await started.wait()
    cancels.request("inv")
    await cleaning.wait()
    cancels.request("inv", "again")
    with pytest.raises(JobCancelled):
        await running
    assert cleaned == [True]


async def test_work_that_ends_before_the_cancel_keeps_its_result() -> None:
    cancels = Cancellations()

    async def work() -> str:
        return "done"

    assert await cancels.interruptible("inv", work()) == "done"
    cancels.request("inv")
    with pytest.raises(JobCancelled):
        await cancels.interruptible("inv", work())
