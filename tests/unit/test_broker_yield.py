"""The embedded broker yields the cores while subprocess tools run (toolexec.broker_yield)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from domain.model import HttpPlan, PrimitiveOutcome, SubprocessPlan
from toolexec import broker_control
from toolexec.broker_control import SupervisedBroker
from toolexec.broker_yield import BrokerYield, YieldingRunner, next_loop_turn, set_threads_policy
from toolexec.settings import Settings

THREADS_SCRIPT = """
import sys, threading
threading.Thread(target=sys.stdin.read, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


def recorder() -> tuple[list[tuple[int, int]], Callable[[int, int], None]]:
    calls: list[tuple[int, int]] = []
    return calls, lambda pid, policy: calls.append((pid, policy))


def test_the_broker_is_batch_while_any_tool_runs_and_normal_after_the_last() -> None:
    calls, set_policy = recorder()
    reads: list[int] = []

    def pids() -> list[int]:
        reads.append(1)
        return [11, 12]

    broker = BrokerYield(pids, set_policy=set_policy)
    with broker.tool_running():
        assert calls == [(11, os.SCHED_BATCH), (12, os.SCHED_BATCH)]
        with broker.tool_running():  # a second tool: nothing to switch
            pass
        assert len(calls) == 2
    assert calls[2:] == [(11, os.SCHED_OTHER), (12, os.SCHED_OTHER)]
    assert len(reads) == 1  # read when the first tool starts only


def test_a_failing_run_gives_the_cores_back() -> None:
    calls, set_policy = recorder()
    broker = BrokerYield(lambda: [7], set_policy=set_policy)
    with pytest.raises(RuntimeError), broker.tool_running():
        raise RuntimeError("tool failed")
    assert calls == [(7, os.SCHED_BATCH), (7, os.SCHED_OTHER)]


def test_the_processes_switched_back_are_those_switched_to_batch() -> None:
    """A broker restarted while a tool ran: the one that yielded gets its policy back."""
    calls, set_policy = recorder()
    serving = [[1], [2]]
    broker = BrokerYield(lambda: serving.pop(0), set_policy=set_policy)
    with broker.tool_running():
        pass
    with broker.tool_running():
        pass
    assert calls == [(1, os.SCHED_BATCH), (1, os.SCHED_OTHER),
                     (2, os.SCHED_BATCH), (2, os.SCHED_OTHER)]


def test_every_thread_of_a_process_is_switched() -> None:
    child = subprocess.Popen([sys.executable, "-c", THREADS_SCRIPT], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        threads = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(threads) == 2
        set_threads_policy(child.pid, os.SCHED_BATCH)
        assert {os.sched_getscheduler(t) for t in threads} == {os.SCHED_BATCH}
        set_threads_policy(child.pid, os.SCHED_OTHER)
        assert {os.sched_getscheduler(t) for t in threads} == {os.SCHED_OTHER}
    finally:
        child.communicate("")


def test_a_gone_process_is_skipped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    set_threads_policy(child.pid, os.SCHED_BATCH)  # no error


class FakeRunner:
    sandbox = "rlimits"

    def __init__(self, broker: BrokerYield, seen: list[bool]) -> None:
        self._broker = broker
        self._seen = seen

    async def run(self, plan: Any, params: Mapping[str, Any], *,
                  secrets: Callable[[str], str | None],
                  session: Any = None) -> PrimitiveOutcome:
        self._seen.append(self._broker._running > 0)
        return PrimitiveOutcome(ok=True)


def test_only_subprocess_plans_hold_the_yield() -> None:
    calls, set_policy = recorder()
    broker = BrokerYield(lambda: [5], set_policy=set_policy)
    seen: list[bool] = []
    runner = YieldingRunner(FakeRunner(broker, seen), broker)
    subprocess_plan = SubprocessPlan(argv=("true",))
    http_plan = HttpPlan(method="GET", url_template="http://127.0.0.1:1/")

    async def both() -> None:
        await runner.run(subprocess_plan, {}, secrets=lambda name: None)
        await runner.run(http_plan, {}, secrets=lambda name: None)

    asyncio.run(both())
    assert seen == [True, False]
    assert calls == [(5, os.SCHED_BATCH), (5, os.SCHED_OTHER)]
    assert runner.sandbox == "rlimits"


class Later:
    """A deferral the test runs by hand."""

    def __init__(self) -> None:
        self.calls: list[Callable[[], None]] = []
        self.cancelled = 0

    def __call__(self, call: Callable[[], None]) -> Later:
        self.calls.append(call)
        return self

    def cancel(self) -> None:
        self.cancelled += 1

    def run(self) -> None:
        self.calls.pop(0)()


def test_the_switch_to_batch_is_made_when_its_deferred_turn_comes() -> None:
    calls, set_policy = recorder()
    reads: list[int] = []
    later = Later()
    broker = BrokerYield(lambda: reads.append(1) or [3], set_policy=set_policy, defer=later)
    with broker.tool_running():
        assert calls == [] and reads == []  # nothing on the run's path
        later.run()
        assert calls == [(3, os.SCHED_BATCH)]
    assert calls == [(3, os.SCHED_BATCH), (3, os.SCHED_OTHER)]
    assert later.cancelled == 0


def test_a_run_that_ends_before_the_deferred_switch_switches_nothing() -> None:
    calls, set_policy = recorder()
    later = Later()
    broker = BrokerYield(lambda: [3], set_policy=set_policy, defer=later)
    with broker.tool_running():
        pass
    assert later.cancelled == 1
    assert calls == []


def test_in_a_runner_the_switch_comes_once_the_run_awaits() -> None:
    calls, set_policy = recorder()
    broker = BrokerYield(lambda: [9], set_policy=set_policy, defer=next_loop_turn)
    seen: list[list[tuple[int, int]]] = []

    class Spawning:
        sandbox = "rlimits"

        async def run(self, plan: Any, params: Mapping[str, Any], *,
                      secrets: Callable[[str], str | None],
                      session: Any = None) -> PrimitiveOutcome:
            seen.append(list(calls))  # the spawn: before any switch
            await asyncio.sleep(0)  # the tool runs
            seen.append(list(calls))
            return PrimitiveOutcome(ok=True)

    runner = YieldingRunner(Spawning(), broker)
    asyncio.run(runner.run(SubprocessPlan(argv=("true",)), {}, secrets=lambda name: None))
    assert seen == [[], [(9, os.SCHED_BATCH)]]
    assert calls == [(9, os.SCHED_BATCH), (9, os.SCHED_OTHER)]


def test_the_broker_processes_are_read_again_only_when_the_state_file_is_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(state_dir=tmp_path)
    broker = SupervisedBroker(settings, "127.0.0.1:1", supervisor_pid=1, started_here=False)
    assert broker.processes() == []  # no state file yet
    parsed: list[int] = []
    real_read = broker_control.read_state

    def counting_read(state_dir: Path) -> Any:
        parsed.append(1)
        return real_read(state_dir)

    monkeypatch.setattr(broker_control, "read_state", counting_read)
    broker_control.write_state(tmp_path, {"broker_pid": 41, "gate_pid": 42})
    assert broker.processes() == [41, 42]
    assert broker.processes() == [41, 42]
    assert len(parsed) == 1
    broker_control.write_state(tmp_path, {"broker_pid": 43})  # a restarted broker
    assert broker.processes() == [43]
    assert len(parsed) == 2
