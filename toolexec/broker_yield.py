"""The embedded broker yields the cores to running subprocess tools.

Tansu wakes several of its threads per Kafka request, and the consumers waiting for a
tool's end (the pipeline's requests consumer, an external producer's facts consumer)
poll it every millisecond while it runs. On the few cores the embedded profile shares
with the tools, each of those wake-ups preempted the running tool: traced over the
bench's sequential invocations, ~17 preemptions per run of its trivial tool and 3.7 ms
of the tool's life spent waiting after them (a bare spawn: 1.2 ms).

While at least one subprocess tool runs, every thread of the broker is scheduled
`SCHED_BATCH`: the same share of the cores, but a wake-up no longer preempts the tool;
it waits for a free core or the next tick. Once no tool runs, it is `SCHED_OTHER`
again, so the hops of an invocation (the write-ahead produce, the terminal fact, the
fetches that carry them) keep the normal policy: a broker that is batch all the time
made those hops slower when the cores were busy and cost API invocations (no
subprocess, so never switched here) throughput. A broker under a real-time or idle
policy is left as it is.

The switch to batch is off the run's path: it is deferred (`defer`, in a stack the
event loop's next turn, by then the runner has sent its spawn and awaits the tool),
so the run does not wait for the broker's processes to be read and its threads
listed and switched; a run that ends before the deferred switch happened cancels it.
The switch back stays on the path, before the run's terminal fact is produced: the
threads are listed again then (a thread the broker started meanwhile inherited batch).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from consumers.ports import PrimitiveRunner, ToolSession
from domain.model import HttpPlan, McpPlan, PrimitiveOutcome, SubprocessPlan

SWITCHED = (os.SCHED_OTHER, os.SCHED_BATCH)


def set_threads_policy(pid: int, policy: int) -> None:
    """Every thread of process `pid` that runs under SCHED_OTHER or SCHED_BATCH to
    `policy`; best effort (the process may be gone or not ours)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for name in threads:
        tid = int(name)
        with contextlib.suppress(OSError):
            if os.sched_getscheduler(tid) in SWITCHED:
                os.sched_setscheduler(tid, policy, os.sched_param(0))


class Deferred(Protocol):
    """A call scheduled for later (an `asyncio.Handle`)."""

    def cancel(self) -> None: ...


def at_once(call: Callable[[], None]) -> None:
    """Run `call` now (no deferral)."""
    call()


def next_loop_turn(call: Callable[[], None]) -> Deferred:
    """Run `call` at the running event loop's next turn."""
    return asyncio.get_running_loop().call_soon(call)


class BrokerYield:
    """Counts the subprocess tools running; the broker's processes (`pids()`, read
    when the switch to batch is made) are batch while any runs. `defer` schedules
    that switch (the default: at once; a stack defers it to the loop's next turn)."""

    def __init__(self, pids: Callable[[], Iterable[int]], *,
                 set_policy: Callable[[int, int], None] = set_threads_policy,
                 defer: Callable[[Callable[[], None]], Deferred | None] = at_once) -> None:
        self._pids = pids
        self._set_policy = set_policy
        self._defer = defer
        self._running = 0
        self._pending: Deferred | None = None
        self._yielding: tuple[int, ...] = ()

    @contextlib.contextmanager
    def tool_running(self) -> Iterator[None]:
        """Around one tool's run."""
        self._running += 1
        if self._running == 1:
            self._pending = self._defer(self._to_batch)
        try:
            yield
        finally:
            self._running -= 1
            if self._running == 0:
                if self._pending is not None:  # ended before the switch was made
                    self._pending.cancel()
                    self._pending = None
                self._apply(os.SCHED_OTHER)
                self._yielding = ()

    def _to_batch(self) -> None:
        self._pending = None
        if self._running > 0:
            self._yielding = tuple(self._pids())
            self._apply(os.SCHED_BATCH)

    def _apply(self, policy: int) -> None:
        for pid in self._yielding:
            self._set_policy(pid, policy)


class YieldingRunner:
    """A primitive runner (consumers.ports.PrimitiveRunner) whose subprocess runs hold
    `broker_yield`; HTTP and MCP plans run as they are."""

    def __init__(self, runner: PrimitiveRunner, broker_yield: BrokerYield) -> None:
        self._runner = runner
        self._yield = broker_yield

    @property
    def sandbox(self) -> str:
        return self._runner.sandbox

    async def run(self, plan: SubprocessPlan | HttpPlan | McpPlan, params: Mapping[str, Any],
                  *, secrets: Callable[[str], str | None],
                  session: ToolSession | None = None) -> PrimitiveOutcome:
        if not isinstance(plan, SubprocessPlan):
            return await self._runner.run(plan, params, secrets=secrets, session=session)
        with self._yield.tool_running():
            return await self._runner.run(plan, params, secrets=secrets, session=session)
