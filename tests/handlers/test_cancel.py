"""Cancellation (`tool.invoke.cancel.requested`) of runs at every stage."""

from __future__ import annotations

import asyncio

from domain.model import PrimitiveOutcome
from tests.handlers.conftest import Harness
from tests.handlers.test_steps import seal_variant
from tests.waiting import WAIT


def _retrying_echo(harness: Harness, attempts: int = 3) -> str:
    tool = harness.registry.get("py_echo", "1.0.0")
    harness.registry.add(seal_variant(tool, version="1.3.0",
                                      retry_policy={"max_attempts": attempts}))
    return "1.3.0"


async def _start(harness: Harness, invocation: str, **kwargs) -> asyncio.Task[str]:
    task = asyncio.create_task(harness.request("py_echo", {"text": "x"},
                                               invocation_id=invocation, **kwargs))
    await asyncio.wait_for(harness.runner.running.wait(), WAIT)
    return task


async def test_cancel_of_a_running_attempt_interrupts_it_and_fails_with_E3703(
        harness: Harness) -> None:
    harness.runner.blocking = True
    task = await _start(harness, "inv-running")
    await harness.cancel("inv-running", reason="user asked")
    await asyncio.wait_for(task, WAIT)
    assert harness.runner.interrupted == 1
    finished = harness.of("inv-running", "tool.execution.finished")
    assert [(f.data.outcome, f.data.error.code, f.data.final) for f in finished] == [
        ("failure", "E3703", True)]
    failed = harness.terminal("inv-running").data
    assert (failed.error.code, failed.error.message) == ("E3703", "Job cancelled")
    assert failed.error.details["reason"] == "user asked"


async def test_cancel_seen_before_the_permission_decision_never_starts_the_tool(
        harness: Harness) -> None:
    await harness.cancel("inv-early")
    await harness.request("py_echo", {"text": "x"}, invocation_id="inv-early")
    assert harness.runner.plans == []
    assert harness.of("inv-early", "tool.execution.started") == []
    failed = harness.terminal("inv-early").data
    assert (failed.error.code, failed.stage) == ("E3703", "execute")


async def test_cancel_of_a_finished_invocation_publishes_nothing(harness: Harness) -> None:
    await harness.request("py_echo", {"text": "x"}, invocation_id="inv-done")
    before = len(harness.of("inv-done"))
    await harness.cancel("inv-done")
    after = harness.of("inv-done")
    assert len(after) == before + 1 and after[-1].type == "tool.invoke.cancel.requested"
    assert harness.terminal("inv-done").type == "tool.invoke.completed"


async def test_cancel_during_an_attempt_stops_the_retries(harness: Harness) -> None:
    version = _retrying_echo(harness)
    harness.runner.blocking = True
    task = await _start(harness, "inv-retry", version_range=version)
    await harness.cancel("inv-retry")
    await asyncio.wait_for(task, WAIT)
    assert len(harness.runner.plans) == 1
    assert harness.terminal("inv-retry").data.error.code == "E3703"


async def test_cancel_during_the_retry_backoff_runs_no_further_attempt(
        harness: Harness) -> None:
    version = _retrying_echo(harness)
    harness.runner.queue.append(PrimitiveOutcome(ok=False, error={"code": "E3502",
                                                                  "message": "unavailable"}))
    harness.sleeps_block = True
    task = asyncio.create_task(harness.request("py_echo", {"text": "x"}, version_range=version,
                                               invocation_id="inv-backoff"))
    await asyncio.wait_for(harness.backing_off.wait(), WAIT)
    await harness.cancel("inv-backoff")
    await asyncio.wait_for(task, WAIT)
    assert len(harness.runner.plans) == 1
    finished = harness.of("inv-backoff", "tool.execution.finished")
    assert [(f.data.attempt, f.data.final) for f in finished] == [(1, False)]
    failed = harness.terminal("inv-backoff").data
    assert (failed.error.code, failed.stage) == ("E3703", "execute")


async def test_a_cancel_does_not_touch_other_invocations(harness: Harness) -> None:
    await harness.cancel("inv-other")
    invocation = await harness.request("py_echo", {"text": "x"})
    assert harness.terminal(invocation).type == "tool.invoke.completed"
