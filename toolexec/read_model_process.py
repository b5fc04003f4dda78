"""The read models' runner in a child process, supervised by the process that needs it.

In `toolexec up` the read models fold every fact the pipeline writes. In a thread of
the pipeline's process they took a third of a core under the pipeline's interpreter
lock, at its CPU priority: a tool's run measured ~14 ms slower inside the stack than
alone, and the API throughput shared the lock the same way. In a process of its own
(`toolexec.read_model_child`), at a lower CPU priority, the folding takes what the
pipeline leaves; the read models are eventually consistent, and a reader who needs
its own write waits for it (`wait_caught_up_to`, a request over the pipe).

`RunnerProcess` has the surface the rest of `up` reads: `state`, `failure`,
`end_offsets()`, `wait_caught_up[_to]()`, `stop()`. The process dies with its parent
(end of file on its stdin; SIGTERM from the kernel on Linux); when it dies on its own
it is restarted with backoff, and its state says so meanwhile. Its rows need no
repair after a crash: every batch is one transaction with its offsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import structlog
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from pydantic import SecretStr

from toolexec.read_model_child import LINE_LIMIT, decode_ends, encode_ends
from toolexec.settings import Settings

log = structlog.get_logger(__name__)

CHILD_MODULE = "toolexec.read_model_child"
STOP_SECONDS = 15.0
RESTART_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
HEALTHY_SECONDS = 30.0
"""A process that ran this long before it died is restarted after the shortest delay."""
ANSWER_SLACK_SECONDS = 2.0
"""A bounded wait's answer comes from the child when its own bound ends: the parent
gives up only this much later."""
DEFAULT_PRIORITY: dict[str, Any] = {"nice": 10, "policy": "batch"}


class RunnerProcessDown(RuntimeError):
    """The read models' process is not running (it died and is being restarted)."""


class RunnerFailed(RuntimeError):
    """The runner in the child process failed or refused its log (its own words)."""


class RunnerProcess:
    """Starts, supervises and talks to the read models' runner process."""

    def __init__(self, settings: Settings, bootstrap: str, *, name: str = "read-models",
                 priority: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self._settings = settings
        self._bootstrap = bootstrap
        self._priority = dict(DEFAULT_PRIORITY if priority is None else priority)
        self._process: asyncio.subprocess.Process | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._state = "not started"
        self._failure: str | None = None
        self._up = asyncio.Event()
        self._stopping = False
        self._supervisor: asyncio.Task[None] | None = None
        self.restarts = 0

    # -- what `up` reads ---------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """The running child's pid (None while it is down)."""
        return self._process.pid if self._process is not None and self._up.is_set() else None

    @property
    def state(self) -> str:
        """"running", or why the runner is not simply following its log."""
        return self._state

    @property
    def failure(self) -> BaseException | None:
        """Why the read models are not following the log now (None when they are or
        while they rebuild)."""
        if not self._up.is_set():
            return RunnerProcessDown(self._state)
        return None if self._failure is None else RunnerFailed(self._failure)

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Start the process and wait until its runner runs; then supervise it."""
        await self._spawn()
        self._supervisor = asyncio.create_task(self._supervise(), name=f"supervise-{self.name}")

    async def _spawn(self) -> None:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", CHILD_MODULE, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, limit=LINE_LIMIT)
        self._process = process
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(self._start_order()).encode() + b"\n")
        await process.stdin.drain()
        first = await process.stdout.readline()
        if not first:
            code = await process.wait()
            self._process = None
            raise RunnerProcessDown(f"the read models' process exited ({code}) while starting")
        self._take(json.loads(first))
        self._up.set()
        log.debug("read_models.process_started", pid=process.pid)

    def _start_order(self) -> dict[str, Any]:
        return {"settings": settings_document(self._settings), "bootstrap": self._bootstrap,
                "parent": os.getpid(), "priority": self._priority}

    async def _supervise(self) -> None:
        """Read the child's lines; when it dies unasked, restart it with backoff."""
        failures = 0
        while not self._stopping:
            began = time.monotonic()
            code = await self._read_until_exit()
            if self._stopping:
                return
            self._went_down(f"failed: read-model process exited ({code}); restarting")
            if time.monotonic() - began >= HEALTHY_SECONDS:
                failures = 0
            log.error("read_models.process_died", code=code, restarts=self.restarts)
            while not self._stopping:
                await asyncio.sleep(RESTART_SECONDS[min(failures, len(RESTART_SECONDS) - 1)])
                failures += 1
                if self._stopping:
                    return
                try:
                    await self._spawn()
                except (OSError, RunnerProcessDown, ValueError) as error:
                    log.error("read_models.restart_failed", error=str(error))
                    continue
                self.restarts += 1
                log.warning("read_models.process_restarted", pid=self.pid, restarts=self.restarts)
                break

    async def _read_until_exit(self) -> int:
        process = self._process
        assert process is not None and process.stdout is not None
        while line := await process.stdout.readline():
            try:
                message = json.loads(line)
            except ValueError:
                log.warning("read_models.process_said", line=line[:200].decode(errors="replace"))
                continue
            self._take(message)
        return await process.wait()

    def _take(self, message: dict[str, Any]) -> None:
        if "state" in message:
            self._state, self._failure = str(message["state"]), message.get("failure")
            return
        future = self._pending.pop(int(message["id"]), None)
        if future is None or future.done():
            return
        if "error" in message:
            future.set_exception(KafkaError(message["error"]))
        else:
            future.set_result(message["ok"])

    def _went_down(self, why: str) -> None:
        self._up.clear()
        self._state, self._failure = why, why
        self._process = None
        for future in self._pending.values():
            if not future.done():
                future.set_exception(RunnerProcessDown(why))
        self._pending.clear()

    async def stop(self) -> None:
        """Stop the runner in order (a batch in flight rolls back) and reap the process."""
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                assert process.stdin is not None
                process.stdin.write(b'{"op": "stop"}\n')
                await process.stdin.drain()
                process.stdin.close()
            try:
                async with asyncio.timeout(STOP_SECONDS):
                    await process.wait()
            except TimeoutError:
                log.error("read_models.process_stop_timeout", pid=process.pid)
                process.kill()
                await process.wait()
        if self._supervisor is not None:
            await asyncio.gather(self._supervisor, return_exceptions=True)
            self._supervisor = None
        self._went_down("stopped")

    # -- requests ----------------------------------------------------------------------
    async def _ask(self, op: str, **fields: Any) -> Any:
        """One request to the running child; RunnerProcessDown when it is not running."""
        process = self._process
        if not self._up.is_set() or process is None or process.stdin is None:
            raise RunnerProcessDown(self._state)
        self._next_id += 1
        ask_id = self._next_id
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[ask_id] = future
        try:
            process.stdin.write(json.dumps({"id": ask_id, "op": op, **fields}).encode() + b"\n")
            await process.stdin.drain()
        except (ConnectionError, RuntimeError) as error:
            self._pending.pop(ask_id, None)
            raise RunnerProcessDown(str(error)) from error
        try:
            return await future
        finally:
            self._pending.pop(ask_id, None)

    async def _ask_across_restarts(self, within: float, op: str, **fields: Any) -> Any:
        """`_ask`, waiting (`within` seconds, plus the time an answer takes to come
        back) for a process that is down to be back."""
        async with asyncio.timeout(within + ANSWER_SLACK_SECONDS):
            while True:
                await self._up.wait()
                with contextlib.suppress(RunnerProcessDown):
                    return await self._ask(op, **fields)
                if self._stopping:
                    raise RunnerProcessDown("stopped")

    async def end_offsets(self) -> dict[TopicPartition, int]:
        """The log end of every partition the runner reads, now (KafkaError when the
        broker does not answer; waits for a restarting process up to the caller's
        timeout)."""
        return decode_ends(await self._ask_across_restarts(STOP_SECONDS, "end_offsets"))

    async def wait_caught_up_to(self, ends: Mapping[TopicPartition, int],
                                timeout: float) -> bool:
        """Wait (bounded) until the rows include every record before `ends`."""
        return await self._wait(encode_ends(ends), timeout)

    async def wait_caught_up(self, timeout: float = 10.0) -> bool:
        """Wait (bounded) until the rows include every record in the log right now."""
        return await self._wait(None, timeout)

    async def _wait(self, ends: list[list[Any]] | None, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        try:
            return bool(await self._ask_across_restarts(
                timeout, "wait", ends=ends, timeout=max(deadline - time.monotonic(), 0.0)))
        except (TimeoutError, RunnerProcessDown, KafkaError):
            return False

    async def take_lags(self) -> list[float]:
        """Seconds from log timestamp to commit of every record applied since the last
        call (the bench's lag figure)."""
        return [float(lag) for lag in await self._ask("lags")]


def settings_document(settings: Settings) -> dict[str, Any]:
    """`settings` as JSON the child validates back, secrets revealed (they travel over
    the child's stdin only) and the log level this process logs at."""
    document = settings.model_dump(mode="json")
    for name, value in settings:
        if isinstance(value, SecretStr):
            document[name] = value.get_secret_value()
    document["log_level"] = _effective_log_level(settings)
    return document


def _effective_log_level(settings: Settings) -> str:
    import logging

    level = logging.getLevelName(logging.getLogger().level)
    return level if level in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"} else \
        settings.log_level
