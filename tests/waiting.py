"""Waiting on a condition in tests: the bound only stops a hang, it is never a timing
being asserted (conditions normally hold much sooner)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

WAIT = 120.0


def until(predicate: Any, what: str, timeout: float = WAIT, interval: float = 0.2) -> Any:
    """Poll `predicate()` until it returns a truthy value; that value. Fails naming
    `what` when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(interval)


def process_gone(pid: int) -> bool:
    """Whether the process `pid` has exited (a zombie counts: only its parent reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):  # gone while read
        return True
    return state in ("Z", "X")
