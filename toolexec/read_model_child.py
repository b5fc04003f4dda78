"""The read models' runner as a process of its own: `python -m toolexec.read_model_child`.

Started by `toolexec.read_model_process.RunnerProcess` (one per `toolexec up` and per
embedded stack that runs read models), so that folding the facts never shares the
pipeline's interpreter lock or its CPU priority: the parent keeps the engine its
readers use, this process writes.

Its stdin and stdout are a line protocol with the parent (JSON, one object a line):

- the first line in is the start order: the settings (secrets included: a pipe, never
  the command line or an environment a tool could see), the bootstrap servers, the
  parent's pid and the CPU priority to take;
- then requests, each answered with its `id`: `end_offsets`, `wait` (until the rows
  include every record before `ends`, or before the log end now when `ends` is null),
  `lags` (the per-record lags since the last ask); `stop` ends it in order (the batch
  in flight rolls back);
- out: `{"state": ..., "failure": ...}` when the runner's state changes (the first one
  once it runs), and the answers.

It dies with its parent: end of file on stdin stops it in order, and on Linux the
kernel sends it SIGTERM when the parent goes (PR_SET_PDEATHSIG), which does the same.
Its logs go to the stderr it inherits, where the parent's go.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

import structlog
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from projections.database import make_engine
from projections.runner import ProjectionRunner
from toolexec.logs import configure_logging
from toolexec.settings import Settings

log = structlog.get_logger(__name__)

STATE_POLL_SECONDS = 0.2
"""How often the runner's state is compared with the last one reported (a string
compare: the state only changes on a failure, a divergence or a rebuild)."""
LINE_LIMIT = 1 << 20
_PR_SET_PDEATHSIG = 1


def encode_ends(ends: Mapping[TopicPartition, int]) -> list[list[Any]]:
    """Partition ends as JSON: [[topic, partition, offset], ...]."""
    return [[tp.topic, tp.partition, offset] for tp, offset in ends.items()]


def decode_ends(rows: list[list[Any]]) -> dict[TopicPartition, int]:
    return {TopicPartition(str(topic), int(p)): int(offset) for topic, p, offset in rows}


def take_priority(priority: Mapping[str, Any]) -> None:
    """Lower this process's CPU priority: `nice` added, and `policy` ("batch", "idle"
    or "other") as its scheduling policy where the platform has it."""
    os.nice(int(priority.get("nice", 0)))
    policy = {"batch": getattr(os, "SCHED_BATCH", None), "idle": getattr(os, "SCHED_IDLE", None)
              }.get(str(priority.get("policy", "other")))
    if policy is not None:
        os.sched_setscheduler(0, policy, os.sched_param(0))


def die_with_parent(parent_pid: int) -> None:
    """SIGTERM this process when its parent goes (Linux); exit now if it already went."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:
        raise SystemExit(0)


class ChildServer:
    """Runs one `ProjectionRunner` and answers the parent's requests over the pipes."""

    def __init__(self, runner: ProjectionRunner, reader: asyncio.StreamReader) -> None:
        self._runner = runner
        self._reader = reader
        self._reported: tuple[str, str | None] | None = None
        self._requests: set[asyncio.Task[None]] = set()

    async def serve(self, stopping: asyncio.Event) -> None:
        """Answer requests until `stop`, end of file or `stopping` is set."""
        watch = asyncio.create_task(self._report_state())
        read = asyncio.create_task(self._read_requests())
        stopped = asyncio.create_task(stopping.wait())
        try:
            await asyncio.wait({read, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (watch, read, stopped, *self._requests):
                task.cancel()
            await asyncio.gather(watch, read, stopped, *self._requests, return_exceptions=True)

    async def _read_requests(self) -> None:
        while line := await self._reader.readline():
            request = json.loads(line)
            if request.get("op") == "stop":
                return
            task = asyncio.create_task(self._answer(request))
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)

    async def _answer(self, request: dict[str, Any]) -> None:
        try:
            result = await self._perform(request)
        except KafkaError as error:
            send({"id": request["id"], "error": str(error) or type(error).__name__})
        else:
            send({"id": request["id"], "ok": result})

    async def _perform(self, request: dict[str, Any]) -> Any:
        op = request["op"]
        if op == "end_offsets":
            return encode_ends(await self._runner.end_offsets())
        if op == "wait":
            timeout = float(request["timeout"])
            if request.get("ends") is None:
                return await self._runner.wait_caught_up(timeout)
            return await self._runner.wait_caught_up_to(decode_ends(request["ends"]), timeout)
        if op == "lags":
            lags = list(self._runner.stats.lags)
            self._runner.stats.lags.clear()
            return lags
        raise ValueError(f"unknown request {op!r}")

    async def _report_state(self) -> None:
        while True:
            failure = self._runner.failure
            now = (self._runner.state, None if failure is None else repr(failure)[:500])
            if now != self._reported:
                self._reported = now
                send({"state": now[0], "failure": now[1]})
            await asyncio.sleep(STATE_POLL_SECONDS)


_to_parent = sys.stdout


def keep_stdout_for_the_parent() -> None:
    """Only `send` writes to the pipe the parent reads: whatever else would print to
    stdout (a library, say) goes to stderr, with the logs."""
    global _to_parent
    _to_parent = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())


def send(message: dict[str, Any]) -> None:
    """One line to the parent (small and infrequent: a blocking write is fine)."""
    _to_parent.write(json.dumps(message) + "\n")
    _to_parent.flush()


async def _stdin_reader() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def settings_from(order: Mapping[str, Any]) -> Settings:
    """The parent's settings as it sent them (validated again: the same checks hold)."""
    return Settings.model_validate(order["settings"])


async def run(order: Mapping[str, Any] | None = None) -> None:
    """Read the start order, run the runner, serve until told to stop or orphaned."""
    reader = await _stdin_reader()
    if order is None:
        order = json.loads(await reader.readline())
    die_with_parent(int(order["parent"]))
    take_priority(order.get("priority", {}))
    settings = settings_from(order)
    configure_logging(settings)
    from toolexec.read_models import build_runner  # after logging: it logs while building

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    engine = make_engine(settings.effective_database_url)
    runner = build_runner(settings, str(order["bootstrap"]), engine)
    try:
        await runner.start()
        await ChildServer(runner, reader).serve(stopping)
    finally:
        await runner.stop()
        await engine.dispose()


def main() -> None:
    # Ctrl-C in a terminal reaches the whole process group: the parent decides when
    # the read models stop (after the pipeline), so this process ignores it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    keep_stdout_for_the_parent()
    with contextlib.suppress(BrokenPipeError):
        asyncio.run(run())


if __name__ == "__main__":
    main()
