"""`.toolexec/runtime.json`: how other commands find a running `toolexec up`."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from toolexec.settings import Settings


def write_runtime(settings: Settings, info: dict[str, Any]) -> None:
    path = settings.runtime_file
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(json.dumps({**info, "pid": os.getpid()}, indent=2))
    tmp.replace(path)


def remove_runtime(settings: Settings) -> None:
    settings.runtime_file.unlink(missing_ok=True)


def read_runtime(settings: Settings) -> dict[str, Any] | None:
    """The running system's coordinates, or None when none is running (stale files,
    whose process is gone or whose broker does not answer, are ignored)."""
    try:
        info = json.loads(settings.runtime_file.read_text())
        os.kill(int(info["pid"]), 0)
        host, port = str(info["kafka_bootstrap"]).rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=0.5):
            return info
    except (OSError, ValueError, KeyError, TypeError):
        return None
