"""How the producer-side client waits for an invocation's terminal event
(toolexec.client._terminal)."""

from __future__ import annotations

import asyncio

import pytest

from contracts.envelope import Envelope
from toolexec.client import InvocationUnresolved, _terminal


async def wait(waiter: asyncio.Future[Envelope], seconds: float, *, shared: bool) -> Envelope:
    loop = asyncio.get_running_loop()
    return await _terminal(waiter, "inv-1", loop.time() + seconds, seconds, shared=shared)


@pytest.mark.parametrize("shared", [True, False])
def test_the_terminal_event_is_returned(shared: bool) -> None:
    async def scenario() -> object:
        waiter: asyncio.Future[Envelope] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, waiter.set_result, "terminal")
        return await wait(waiter, 5, shared=shared)

    assert asyncio.run(scenario()) == "terminal"


@pytest.mark.parametrize("shared", [True, False])
def test_no_terminal_event_in_time_is_E3002(shared: bool) -> None:
    async def scenario() -> asyncio.Future[Envelope]:
        waiter: asyncio.Future[Envelope] = asyncio.get_running_loop().create_future()
        with pytest.raises(InvocationUnresolved) as unresolved:
            await wait(waiter, 0.01, shared=shared)
        assert unresolved.value.code == "E3002"
        assert unresolved.value.details == {"invocation_id": "inv-1", "delivered": True}
        return waiter

    waiter = asyncio.run(scenario())
    assert waiter.cancelled() is not shared  # a local run's future outlives the caller


def test_a_stopped_run_is_reported_not_raised_as_a_cancellation() -> None:
    async def scenario() -> None:
        waiter: asyncio.Future[Envelope] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, waiter.cancel)
        with pytest.raises(InvocationUnresolved, match="stopped"):
            await wait(waiter, 5, shared=True)

    asyncio.run(scenario())


def test_the_callers_own_cancellation_goes_through() -> None:
    async def scenario() -> None:
        waiter: asyncio.Future[Envelope] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(wait(waiter, 5, shared=True))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not waiter.cancelled()

    asyncio.run(scenario())
