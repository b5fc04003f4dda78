"""A PostgreSQL server started from PyPI `pgserver` (the tests' and the bench's).

pgserver gives `pg_ctl start` ten seconds; on a busy machine PostgreSQL can take longer
to come up, and the start then fails although the server is still starting in its
data directory. Asking again on the same directory finds that server running and
uses it (pgserver does not wait for it to accept connections then, so this does), so
a start is tried a few times before it counts as failed.
"""

from __future__ import annotations

import importlib.util
import subprocess
import time
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

START_ATTEMPTS = 4
PAUSE_SECONDS = 2.0
READY_SECONDS = 120.0


def pgserver_installed() -> bool:
    """True when PyPI `pgserver` can be imported."""
    return importlib.util.find_spec("pgserver") is not None


def start_pgserver(data_dir: Path, attempts: int = START_ATTEMPTS) -> Any:
    """The running `pgserver` server of `data_dir` (started if need be; stopped by its
    `cleanup()`). Raises ImportError without pgserver, else the last start's error."""
    import pgserver  # type: ignore[import-untyped]

    def started() -> Any:
        server = pgserver.get_server(data_dir, cleanup_mode="stop")
        wait_until_ready(server.get_uri())
        return server

    for attempt in range(1, attempts):
        try:
            return started()
        except (subprocess.SubprocessError, OSError) as error:
            log.warning("pgserver.start_retried", attempt=attempt, error=str(error)[:300])
            time.sleep(PAUSE_SECONDS * attempt)
    return started()  # the last try: its error is raised


def wait_until_ready(url: str, seconds: float = READY_SECONDS) -> None:
    """Return once the server at `url` accepts a connection (bounded by `seconds`)."""
    import psycopg

    deadline = time.monotonic() + seconds
    while True:
        try:
            psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1),
                            connect_timeout=10).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
