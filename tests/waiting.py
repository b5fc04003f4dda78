"""Waiting on a condition in tests: the bound only stops a hang, it is never a timing
being asserted (conditions normally hold much sooner)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

WAIT = 120.0
START_WAIT = 300.0
"""For a process such as `toolexec up` to start: at load 20+ on 2 cores one took over
120 s (its broker, supervisor, migrations and consumers all start)."""


def until(predicate: Any, what: str, timeout: float = WAIT, interval: float = 0.2) -> Any:
    """Poll `predicate()` until it returns a truthy value; that value. Fails naming
    `what` when `timeout` seconds pass first."""
    for value in _polled(predicate, what, timeout):
        if value:
            return value
        time.sleep(interval)


async def eventually(predicate: Callable[[], Any], what: str, timeout: float = WAIT,
                     interval: float = 0.01) -> Any:
    """`until` for asyncio tests: polls without blocking the loop, whose own tasks may
    be what makes the condition hold."""
    for value in _polled(predicate, what, timeout):
        if value:
            return value
        await asyncio.sleep(interval)


def _polled(predicate: Callable[[], Any], what: str, timeout: float) -> Iterator[Any]:
    """`predicate()` once per round; fails naming `what` once `timeout` has passed
    after a round that was not truthy."""
    deadline = time.monotonic() + timeout
    while True:
        yield predicate()
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"


def until_progressing(predicate: Any, what: str, progress: Callable[[], Hashable],
                      stall: float, interval: float = 0.2) -> Any:
    """Poll `predicate()` until it returns a truthy value; that value. For work of no
    fixed length that reports its progress: fails naming `what` only when `progress()`
    (a count of lines, a stage) has not changed for `stall` seconds, which is a hang
    however busy the machine is."""
    seen, since = progress(), time.monotonic()
    while True:
        value = predicate()
        if value:
            return value
        now = progress()
        if now != seen:
            seen, since = now, time.monotonic()
        assert time.monotonic() - since < stall, \
            f"no progress for {stall:.0f} s (last: {seen!r}): {what}"
        time.sleep(interval)


def process_gone(pid: int) -> bool:
    """Whether the process `pid` has exited, all its threads with it (a zombie counts:
    only its parent reaps it). A killed multi-threaded process's leader shows "Z" while
    its other threads still exit; until they have, its parent's `waitid` sees nothing."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        threads = [name for name in os.listdir(f"/proc/{pid}/task") if name != str(pid)]
    except (FileNotFoundError, ProcessLookupError, IndexError):  # gone while read
        return True
    return state in ("Z", "X") and not threads
