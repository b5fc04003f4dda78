"""`.toolexec/runtime.json` and `.toolexec/up.lock`: one `toolexec up` per state
directory, and how other commands find it.

A running `up` holds an exclusive lock on `up.lock` for its whole life (the kernel
drops it when the process ends, however it ends) and advertises its endpoints in
`runtime.json`. A runtime file whose `up` no longer holds the lock is stale: its
process is gone (killed, crashed, machine stopped); commands say so instead of
talking to nobody, and the next `up` reports and replaces it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from consumers.adapters.owner_locks import lock_held
from toolexec.broker_control import process_alive
from toolexec.settings import Settings

LOCK_FILE = "up.lock"
LOCK_RETRY_SECONDS = 1.0
"""A reader testing the lock holds it for an instant: a starting `up` retries that long."""


def _lock_path(settings: Settings) -> Path:
    return settings.state_dir / LOCK_FILE


@dataclass
class UpLock:
    """The lock of the one `toolexec up` of a state directory (held until `release`)."""

    path: Path
    fd: int

    def release(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


def acquire_up_lock(settings: Settings) -> UpLock | None:
    """Take the state directory's `up` lock; None when another `up` holds it."""
    path = _lock_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + LOCK_RETRY_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return UpLock(path, fd)
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def up_running(settings: Settings) -> bool:
    """True while some `toolexec up` holds this state directory's lock."""
    try:
        return lock_held(_lock_path(settings))
    except FileNotFoundError:
        return False


@dataclass(frozen=True)
class RuntimeStatus:
    """What the runtime file says and whether its `up` still runs."""

    state: Literal["running", "stale", "absent"]
    info: dict[str, Any] | None = None

    def describe(self) -> str:
        """One line for people: which `up`, and that it is gone when it is."""
        info = self.info or {}
        if self.state == "absent":
            return "no toolexec up has run in this state directory"
        who = f"toolexec up (pid {info.get('pid')}, gateway {info.get('gateway_url')}"
        who += f", started {info['started_at']})" if info.get("started_at") else ")"
        if self.state == "running":
            return f"{who} is running"
        return (f"{who} is not running any more: it ended without stopping cleanly "
                "(killed, crashed or the machine stopped)")


def runtime_status(settings: Settings) -> RuntimeStatus:
    try:
        info = json.loads(settings.runtime_file.read_text())
    except (OSError, ValueError):
        return RuntimeStatus("running" if up_running(settings) else "absent")
    if not isinstance(info, dict):
        return RuntimeStatus("absent")
    if not up_running(settings):
        return RuntimeStatus("stale", info)
    pid = info.get("pid")
    if not process_alive(pid if isinstance(pid, int) else None):  # a new `up` holds the lock and has not written yet
        return RuntimeStatus("running")
    return RuntimeStatus("running", info)


def replace_stale_runtime(settings: Settings) -> RuntimeStatus:
    """Called by `up` holding the lock: a runtime file left by an `up` that did not stop
    cleanly is removed (and returned, to be reported)."""
    status = runtime_status(settings)
    if status.state == "stale" or (status.state == "running" and status.info is None):
        previous = RuntimeStatus("stale", _read(settings))
        settings.runtime_file.unlink(missing_ok=True)
        return previous
    return status


def _read(settings: Settings) -> dict[str, Any] | None:
    try:
        info = json.loads(settings.runtime_file.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def write_runtime(settings: Settings, info: dict[str, Any]) -> None:
    path = settings.runtime_file
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(json.dumps({**info, "pid": os.getpid(),
                                 "started_at": datetime.now(UTC).isoformat(timespec="seconds")},
                                indent=2))
    tmp.replace(path)


def remove_runtime(settings: Settings) -> None:
    """Remove the runtime file if it is this process's (never another `up`'s)."""
    with contextlib.suppress(OSError, ValueError):
        info = json.loads(settings.runtime_file.read_text())
        if info.get("pid") == os.getpid():
            settings.runtime_file.unlink(missing_ok=True)


def read_runtime(settings: Settings) -> dict[str, Any] | None:
    """The running system's coordinates, or None when no `up` runs (a stale file,
    whose `up` is gone, is ignored: `runtime_status` says why)."""
    status = runtime_status(settings)
    return status.info if status.state == "running" else None


def running_bootstrap(settings: Settings) -> str | None:
    """The broker a process outside `up` talks to: the settings' one, else the running
    `up`'s (None: neither, as in the embedded profile with no `up`)."""
    return settings.kafka_bootstrap or (read_runtime(settings) or {}).get("kafka_bootstrap")


def running_system(settings: Settings) -> tuple[dict[str, Any], str, str]:
    """(the runtime file, the broker's bootstrap, the read models' database URL) of the
    running system a CLI write talks to: the settings' broker, else the running `up`'s.
    Raises ToolexecError (E3001) when there is none."""
    from domain.errors import ToolexecError

    runtime = read_runtime(settings) or {}
    bootstrap = settings.kafka_bootstrap or runtime.get("kafka_bootstrap")
    if not bootstrap:
        raise ToolexecError("no running toolexec found: start `toolexec up` first "
                            "or set TOOLEXEC_KAFKA_BOOTSTRAP", code="E3001")
    database_url = runtime.get("database_url") or settings.effective_database_url
    return runtime, str(bootstrap), str(database_url)
